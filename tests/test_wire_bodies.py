"""Response bodies as real servers send them: content encodings, null fields, odd usage, the rescue's reply.

Every test talks real HTTP to the local fake server (``tests/fakeserver.py``).
"""

from __future__ import annotations

import gzip
import json
import zlib
from typing import Any

import pytest
from fakeserver import (
    Cut,
    FakeServer,
    Reply,
    Stream,
    oa_chunk,
    openai_completion,
    openai_stream,
    sse,
)
from support import FAST_RETRIES, Recorder, openai_at

from loopctl import BareLoop, ConfigError
from loopctl.errors import ContextExceeded, ModelError
from loopctl.observers import AttemptReset, TextDelta
from loopctl.providers import StreamHandler


def run_once(client: Any, mode: str = "streaming", handler: Any = None) -> tuple[Any, Recorder, list[str]]:
    recorder, streamed = Recorder(), []
    with BareLoop(client) as loop:
        loop.set_turn_mode(mode)
        loop.set_stream_handler(handler or StreamHandler(**FAST_RETRIES))
        loop.register_observer(recorder)
        loop.with_text_streamer(streamed.append)
        return loop.run("hi"), recorder, streamed


def gzipped(obj: Any) -> bytes:
    return gzip.compress(json.dumps(obj).encode())


def test_every_call_asks_for_an_unencoded_body_whatever_the_extra_headers_say(server: FakeServer) -> None:
    server.push(Stream(openai_stream("hello")), Reply(200, openai_completion("whole")))
    client = openai_at(server, extra_headers={"accept-encoding": "gzip, br"})
    assert run_once(client)[0].output == "hello"
    assert run_once(client, mode="non_streaming")[0].output == "whole"
    assert [r.headers["accept-encoding"] for r in server.requests] == ["identity", "identity"]


@pytest.mark.parametrize("encode, name", [
    (gzipped, "gzip"),
    (lambda obj: zlib.compress(json.dumps(obj).encode()), "deflate"),
    (lambda obj: zlib.compress(json.dumps(obj).encode())[2:-4], "deflate"),  # raw deflate, as some servers send it
])
def test_a_server_that_encodes_anyway_is_decoded(server: FakeServer, encode: Any, name: str) -> None:
    body = encode(openai_completion("hi there"))
    server.push(Reply(200, body, headers={"content-type": "application/json", "content-encoding": name}))
    assert run_once(openai_at(server), mode="non_streaming")[0].output == "hi there"


def test_an_encoded_overflow_rejection_is_still_a_context_overflow(server: FakeServer) -> None:
    overflow = {"error": {"message": "This model's maximum context length is 8192 tokens.",
                          "type": "invalid_request_error", "code": "context_length_exceeded"}}
    headers = {"content-type": "application/json", "content-encoding": "gzip"}
    server.push(Reply(400, gzipped(overflow), headers=headers), Reply(400, gzipped(overflow), headers=headers))
    with pytest.raises(ContextExceeded):  # compacted once, rejected again: not a plain ModelError
        run_once(openai_at(server), mode="non_streaming")


def test_an_encoding_bomb_is_refused_at_the_body_limit(server: FakeServer) -> None:
    bomb = gzip.compress(b"[" + b" " * (40 * 1024 * 1024) + b"]")  # 40 MB of JSON in about 40 KB
    server.push(Reply(200, bomb, headers={"content-type": "application/json", "content-encoding": "gzip"}))
    with pytest.raises(ModelError, match="larger than"):
        run_once(openai_at(server), mode="non_streaming", handler=StreamHandler(max_retries=0, **FAST_RETRIES))


def test_an_encoded_event_stream_is_a_protocol_error_naming_the_encoding(server: FakeServer) -> None:
    stream = Stream([gzip.compress(b"".join(openai_stream("hello")))], headers={"content-encoding": "br"})
    server.push(stream)
    with pytest.raises(ModelError, match="'br'-encoded"):
        run_once(openai_at(server), handler=StreamHandler(max_retries=0, rescue=False, **FAST_RETRIES))


def test_a_null_error_field_in_a_chunk_is_no_error(server: FakeServer) -> None:
    usage = {"id": "c", "object": "chat.completion.chunk", "model": "gpt-test", "choices": [], "error": None,
             "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
    pieces = [oa_chunk({"content": "hello"}), oa_chunk({}, "stop"), sse(usage), b"data: [DONE]\n\n"]
    server.push(Stream(pieces))
    run, _, _ = run_once(openai_at(server))
    assert run.output == "hello" and run.usage.input_tokens == 3


def test_an_absurd_usage_figure_counts_zero_and_the_run_goes_on(server: FakeServer) -> None:
    huge = int("1" + "0" * 400)
    body = openai_completion("fine")
    body["usage"] = {"prompt_tokens": huge, "completion_tokens": 2}
    server.push(Reply(200, body))
    run, _, _ = run_once(openai_at(server), mode="non_streaming")
    assert run.output == "fine" and run.usage.input_tokens == 0 and run.usage.output_tokens == 2


def test_the_rescues_reply_reaches_every_outlet_that_shows_deltas(server: FakeServer) -> None:
    cut = Stream([oa_chunk({"content": "Let me think"}), Cut()])
    server.push(cut, cut, Reply(200, openai_completion("The answer is 42.")))
    run, recorder, streamed = run_once(openai_at(server), handler=StreamHandler(max_retries=1, **FAST_RETRIES))
    assert run.output == "The answer is 42."
    assert streamed == ["Let me think", "Let me think", "The answer is 42."]
    kinds = [(type(e).__name__, getattr(e, "delta", None)) for e in recorder.snapshot()
             if isinstance(e, (TextDelta, AttemptReset))]
    assert kinds == [("TextDelta", "Let me think"), ("AttemptReset", None), ("TextDelta", "Let me think"),
                     ("AttemptReset", None), ("TextDelta", "The answer is 42.")]


@pytest.mark.parametrize("field", ["first_event_timeout", "event_timeout", "total_timeout", "rescue_timeout"])
def test_a_zero_timeout_is_refused_naming_the_field(field: str) -> None:
    with pytest.raises(ConfigError, match=f"StreamHandler.{field} must be a finite positive number of seconds, got 0"):
        StreamHandler(**{field: 0})


@pytest.mark.parametrize("field", ["rescue", "single_attempt"])
def test_flags_must_be_bools(field: str) -> None:
    with pytest.raises(ConfigError, match=f"StreamHandler.{field} must be True or False, got 'no'"):
        StreamHandler(**{field: "no"})


def test_zero_delays_stay_allowed() -> None:
    assert StreamHandler(base_delay=0, rate_limit_delay=0, max_retry_wait=0, max_delay=0).base_delay == 0

