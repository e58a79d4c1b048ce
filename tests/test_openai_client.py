"""OpenAIClient against a real HTTP server on 127.0.0.1 that streams real SSE."""

from __future__ import annotations

import json
import math
import threading
from typing import Any

import pytest
from fakeserver import (
    OA_DONE,
    Cut,
    FakeServer,
    Gate,
    Reply,
    Stream,
    oa_chunk,
    openai_completion,
    openai_stream,
    sse,
)
from support import TOOL_SCHEMAS, collect_stream, hi_request

from loopctl.errors import ConfigError, ModelError
from loopctl.messages import (
    Message,
    ModelRequest,
    RequestOptions,
    Role,
    StopReason,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolResultPart,
    Usage,
)
from loopctl.providers import OpenAIClient
from loopctl.providers.base import PartDelta, PartStart
from loopctl.providers.http import error_kind

KEY = "sk-test-abcdef0123456789SECRET"


def client(server: FakeServer, **kw: Any) -> OpenAIClient:
    return OpenAIClient("gpt-test", api_key=KEY, base_url=server.openai_url, **kw)


def test_text_stream_assembles_reply_usage_and_model(server: FakeServer) -> None:
    server.push(Stream(openai_stream("Hello there, friend.", usage=(12, 5))))
    events, resp = collect_stream(client(server), hi_request())
    assert resp.message.text == "Hello there, friend."
    assert resp.stop_reason is StopReason.END_TURN
    assert resp.usage == Usage(12, 5)
    assert resp.model == "gpt-test"
    deltas = [e.text for e in events if isinstance(e, PartDelta)]
    assert len(deltas) == 5  # the deltas arrive one by one, as sent
    assert server.requests[0].path == "/v1/chat/completions"
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert server.requests[0].headers["accept"] == "text/event-stream"


def test_usage_arrives_only_in_the_last_chunk_after_finish(server: FakeServer) -> None:
    pieces = [
        oa_chunk({"content": "ok"}),
        oa_chunk({}, "stop"),
        oa_chunk(usage={"prompt_tokens": 30, "completion_tokens": 2, "total_tokens": 32}, choices=False),
        OA_DONE,
    ]
    server.push(Stream(pieces))
    _, resp = collect_stream(client(server), hi_request())
    assert resp.usage == Usage(30, 2)


def test_tool_call_arguments_split_across_many_chunks(server: FakeServer) -> None:
    args = json.dumps({"path": "/etc/hosts", "lines": [1, 2, 3], "note": "a \"quoted\" value"})
    server.push(Stream(openai_stream(tool_calls=[("call_A", "read_file", args)], piece=1)))
    events, resp = collect_stream(client(server), hi_request(tools=TOOL_SCHEMAS))
    assert sum(1 for e in events if isinstance(e, PartDelta)) == len(args)
    assert resp.stop_reason is StopReason.TOOL_CALL
    assert resp.message.tool_calls == [ToolCallPart("call_A", "read_file", json.loads(args))]


def test_interleaved_tool_calls_are_routed_by_index(server: FakeServer) -> None:
    def frag(i: int, args: str, **first: Any) -> bytes:
        tc: dict[str, Any] = {"index": i, "function": {"arguments": args}}
        if first:
            tc.update(id=first["id"], type="function")
            tc["function"]["name"] = first["name"]
        return oa_chunk({"tool_calls": [tc]})

    pieces = [
        frag(0, "", id="call_0", name="read_file"),
        frag(1, '{"pat', id="call_1", name="grep"),
        frag(0, '{"path"'),
        frag(1, 'tern": "x'),
        frag(0, ': "a.txt"}'),
        frag(1, '"}'),
        oa_chunk({}, "tool_calls"),
        OA_DONE,
    ]
    server.push(Stream(pieces))
    events, resp = collect_stream(client(server), hi_request(tools=TOOL_SCHEMAS))
    assert resp.message.tool_calls == [
        ToolCallPart("call_0", "read_file", {"path": "a.txt"}),
        ToolCallPart("call_1", "grep", {"pattern": "x"}),
    ]
    starts = [e for e in events if isinstance(e, PartStart)]
    assert [(s.call_id, s.name) for s in starts] == [("call_0", "read_file"), ("call_1", "grep")]


def test_whole_arguments_in_one_fragment_and_several_calls_in_one_chunk(server: FakeServer) -> None:
    both = [
        {"index": 0, "id": "c0", "type": "function", "function": {"name": "grep", "arguments": '{"pattern": "a"}'}},
        {"index": 1, "id": "c1", "type": "function", "function": {"name": "grep", "arguments": '{"pattern": "b"}'}},
    ]
    server.push(Stream([oa_chunk({"tool_calls": both}), oa_chunk({}, "stop"), OA_DONE]))
    _, resp = collect_stream(client(server), hi_request(tools=TOOL_SCHEMAS))
    assert [c.input for c in resp.message.tool_calls] == [{"pattern": "a"}, {"pattern": "b"}]
    # "stop" with tool calls (Ollama does this) still means a tool-call turn.
    assert resp.stop_reason is StopReason.TOOL_CALL


def test_reasoning_content_deltas_become_thinking_not_text(server: FakeServer) -> None:
    server.push(Stream(openai_stream("42", reasoning="Let me think.")))
    events, resp = collect_stream(client(server), hi_request())
    assert resp.message.text == "42"
    assert resp.message.thinking == [ThinkingPart("Let me think.")]
    kinds = {e.kind for e in events if isinstance(e, PartDelta)}
    assert kinds == {"thinking", "text"}


def test_finish_reason_length_maps_to_max_tokens(server: FakeServer) -> None:
    server.push(Stream(openai_stream("trunc", finish="length")))
    _, resp = collect_stream(client(server), hi_request())
    assert resp.stop_reason is StopReason.MAX_TOKENS


def test_deltas_reach_the_reader_while_the_server_is_still_sending(server: FakeServer) -> None:
    # The server holds the rest of the stream until the reader has seen the
    # first delta: any read buffering that held it back would deadlock here.
    gate = threading.Event()
    pieces = [oa_chunk({"content": "first"}), Gate(gate, timeout=5.0), oa_chunk({"content": " second"}),
              oa_chunk({}, "stop"), OA_DONE]
    server.push(Stream(pieces))
    seen_before_gate = []
    stream = client(server).stream(hi_request())
    for ev in stream:
        if isinstance(ev, PartDelta):
            if not gate.is_set():
                seen_before_gate.append(ev.text)
                gate.set()
    assert seen_before_gate == ["first"]


def test_malformed_json_chunk_raises_model_error_naming_the_chunk(server: FakeServer) -> None:
    server.push(Stream([oa_chunk({"content": "ok"}), b'data: {"choices": [ broken\n\n', OA_DONE]))
    with pytest.raises(ModelError, match="malformed JSON") as info:
        collect_stream(client(server), hi_request())
    assert "broken" in str(info.value)
    assert info.value.retryable is False
    assert isinstance(info.value.__cause__, ValueError)


def test_json_chunk_of_the_wrong_shape_raises_model_error_over_http(server: FakeServer) -> None:
    server.push(Stream([oa_chunk({"content": "ok"}), b'data: {"choices": [{"delta": "x"}]}\n\n', OA_DONE]))
    with pytest.raises(ModelError, match="unexpected stream chunk shape") as info:
        collect_stream(client(server), hi_request())
    assert info.value.retryable is False
    assert isinstance(info.value.__cause__, AttributeError)


def test_stream_cut_mid_way_is_a_retryable_transport_error_never_a_reply(server: FakeServer) -> None:
    server.push(Stream([oa_chunk({"content": "partial"}), Cut()]))
    with pytest.raises(ModelError) as info:
        collect_stream(client(server), hi_request())
    assert info.value.retryable is True
    assert error_kind(info.value) == "transport"


def test_close_delimited_body_ending_early_is_truncated(server: FakeServer) -> None:
    # Without chunked encoding a cut looks like a clean end of body: only the
    # missing finish reason / [DONE] tells.
    server.push(Stream([oa_chunk({"content": "partial"})], chunked=False))
    with pytest.raises(ModelError, match="truncated") as info:
        collect_stream(client(server), hi_request())
    assert info.value.retryable is True


def test_finish_reason_without_done_is_still_complete(server: FakeServer) -> None:
    server.push(Stream([oa_chunk({"content": "ok"}), oa_chunk({}, "stop")], chunked=False))
    _, resp = collect_stream(client(server), hi_request())
    assert resp.message.text == "ok"


def test_mid_stream_error_payload_raises(server: FakeServer) -> None:
    server.push(Stream([oa_chunk({"content": "x"}), sse({"error": {"message": "model crashed", "type": "server_error"}})]))
    with pytest.raises(ModelError, match="model crashed") as info:
        collect_stream(client(server), hi_request())
    assert info.value.retryable is True


def test_401_makes_one_request_and_keeps_the_key_out_of_the_error(server: FakeServer) -> None:
    body = {"error": {"message": f"Incorrect API key provided: {KEY}.", "type": "invalid_request_error"}}
    server.push(Reply(401, body))
    c = client(server)
    with pytest.raises(ModelError) as info:
        collect_stream(c, hi_request())
    err = info.value
    assert err.status == 401 and err.retryable is False
    assert "Incorrect API key" in str(err)
    assert KEY not in str(err) and KEY not in repr(err) and KEY[-8:] not in str(err)
    assert KEY not in repr(c)
    assert len(server.requests) == 1


def test_error_body_is_read_at_most_8_kib(server: FakeServer) -> None:
    server.push(Reply(500, b"E" * 100_000))
    with pytest.raises(ModelError) as info:
        collect_stream(client(server), hi_request())
    assert info.value.status == 500 and info.value.retryable is True
    assert len(str(info.value)) < 9000


def test_rate_limit_error_carries_retry_after(server: FakeServer) -> None:
    server.push(Reply(429, {"error": {"message": "slow down"}}, {"retry-after": "7"}))
    with pytest.raises(ModelError) as info:
        collect_stream(client(server), hi_request())
    assert info.value.status == 429
    assert info.value.retry_after == 7.0
    assert error_kind(info.value) == "rate_limit"


def test_golden_request_body_system_tools_and_multi_turn_tool_results(server: FakeServer) -> None:
    server.push(Stream(openai_stream("done")))
    history = [
        Message.user("Find TODOs"),
        Message(Role.ASSISTANT, (TextPart("Looking."), ToolCallPart("call_1", "grep", {"pattern": "TODO"}),
                                 ToolCallPart("call_2", "read_file", {"path": "a.py"}))),
        Message.from_tool_results([ToolResultPart("call_1", "grep", "a.py:3", False),
                                   ToolResultPart("call_2", "read_file", "no such file", True)]),
        Message(Role.ASSISTANT, (ThinkingPart("hidden", "sig"), ToolCallPart("call_3", "grep", {"pattern": "x"}))),
        Message.from_tool_results([ToolResultPart("call_3", "grep", "", False)]),
        Message.system("Context note."),
    ]
    collect_stream(client(server), ModelRequest(history, "You are terse.", TOOL_SCHEMAS))
    assert server.requests[0].json == {
        "model": "gpt-test",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Find TODOs"},
            {"role": "assistant", "content": "Looking.", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "grep", "arguments": '{"pattern": "TODO"}'}},
                {"id": "call_2", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}},
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "a.py:3"},
            {"role": "tool", "tool_call_id": "call_2", "content": "no such file"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_3", "type": "function", "function": {"name": "grep", "arguments": '{"pattern": "x"}'}},
            ]},
            {"role": "tool", "tool_call_id": "call_3", "content": ""},
            {"role": "system", "content": "Context note."},
        ],
        "tools": [
            {"type": "function", "function": {"name": "read_file", "description": "Read a file.",
                                              "parameters": TOOL_SCHEMAS[0].input_schema}},
            {"type": "function", "function": {"name": "grep", "description": "Search.",
                                              "parameters": TOOL_SCHEMAS[1].input_schema}},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_request_options_reach_the_body(server: FakeServer) -> None:
    server.push(Stream(openai_stream("{}")))
    schema = {"title": "Answer", "type": "object", "properties": {"a": {"type": "integer"}}}
    opts = RequestOptions(model="gpt-other", max_tokens=50, temperature=0.2, tool_choice="grep",
                          response_format=schema, extra_body={"seed": 7, "top_k": 3})
    collect_stream(client(server), hi_request(tools=TOOL_SCHEMAS, options=opts))
    body = server.requests[0].json
    assert body["model"] == "gpt-other"
    assert body["max_tokens"] == 50 and body["temperature"] == 0.2
    assert body["tool_choice"] == {"type": "function", "function": {"name": "grep"}}
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "Answer", "schema": schema, "strict": True}}
    assert body["seed"] == 7 and body["top_k"] == 3


@pytest.mark.parametrize(
    "opts, needle",
    [
        (RequestOptions(tool_choice="nonexistent"), "nonexistent"),
        (RequestOptions(tool_choice="required"), "needs at least one tool"),
        (RequestOptions(max_tokens=0), "max_tokens"),
        (RequestOptions(max_tokens=10**5000), "RequestOptions.max_tokens must be an int between 1 and"),
        (RequestOptions(response_format="json"), "response_format"),  # type: ignore[arg-type]
        # NaN and infinities are not JSON: the body would carry them as null, the option dropped.
        (RequestOptions(temperature=math.nan), "RequestOptions.temperature must be a finite number, got nan"),
        (RequestOptions(temperature=math.inf), "RequestOptions.temperature must be a finite number, got inf"),
        (RequestOptions(temperature=-math.inf), "RequestOptions.temperature must be a finite number, got -inf"),
        (RequestOptions(temperature=10**400), "RequestOptions.temperature must be a finite number, got <int of 401"),
    ],
)
def test_option_the_client_cannot_honour_raises_config_error_before_any_request(
    server: FakeServer, opts: RequestOptions, needle: str
) -> None:
    with pytest.raises(ConfigError, match=needle):
        client(server).stream(hi_request(options=opts))
    assert server.requests == []


def test_complete_non_streaming_with_tool_calls(server: FakeServer) -> None:
    server.push(Reply(200, openai_completion("Sure.", tool_calls=[("c9", "grep", '{"pattern": "q"}')])))
    resp = client(server).complete(hi_request(tools=TOOL_SCHEMAS))
    assert resp.message.text == "Sure."
    assert resp.message.tool_calls == [ToolCallPart("c9", "grep", {"pattern": "q"})]
    assert resp.stop_reason is StopReason.TOOL_CALL
    assert resp.usage == Usage(11, 7)
    assert "stream" not in server.requests[0].json


def test_server_answering_json_to_a_stream_request_still_works(server: FakeServer) -> None:
    server.push(Reply(200, openai_completion("whole reply")))
    _, resp = collect_stream(client(server), hi_request())
    assert resp.message.text == "whole reply"


def test_connection_is_reused_across_requests(server: FakeServer) -> None:
    c = client(server)
    for _ in range(3):
        server.push(Stream(openai_stream("x")))
        collect_stream(c, hi_request())
    server.push(Reply(200, openai_completion("y")))
    c.complete(hi_request())
    assert server.total_connections == 1


def test_env_key_and_base_url_and_no_auth_header_without_key(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", server.openai_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env-0000000000")
    server.push(Stream(openai_stream("a")), Stream(openai_stream("b")))
    collect_stream(OpenAIClient("m"), hi_request())
    assert server.requests[0].headers["authorization"] == "Bearer sk-from-env-0000000000"
    monkeypatch.delenv("OPENAI_API_KEY")
    collect_stream(OpenAIClient("m"), hi_request())
    assert "authorization" not in server.requests[1].headers


def test_set_model_and_per_request_override(server: FakeServer) -> None:
    c = client(server)
    assert c.set_model("gpt-b") is True and c.model == "gpt-b"
    server.push(Stream(openai_stream("a")), Stream(openai_stream("b")))
    collect_stream(c, hi_request())
    collect_stream(c, hi_request(options=RequestOptions(model="gpt-routed")))
    assert [r.json["model"] for r in server.requests] == ["gpt-b", "gpt-routed"]
    assert c.model == "gpt-b"  # the override never mutates the client


def test_connection_refused_is_a_retryable_transport_error() -> None:
    with FakeServer() as s:
        url = s.openai_url
    c = OpenAIClient("m", api_key=KEY, base_url=url)
    with pytest.raises(ModelError) as info:
        collect_stream(c, hi_request())
    assert info.value.retryable is True and error_kind(info.value) == "transport"
    assert KEY not in str(info.value)
