"""No secret a client was given ever leaves it: one table, every failure path, every outlet.

Each case scripts a fake server (real HTTP, real SSE bytes) so that a call
fails (or, for bad tool arguments, goes on) with the key ``sk-SECRET-123``,
a custom header value or URL credentials echoed somewhere the old code
quoted. Every outlet is then searched for the secrets: ``str``/``repr`` of
the error and of its whole cause/context chain, ``traceback`` output (with
frame locals), the pickled error, events' ``to_dict()``, ``Run.to_dict()``,
the registry's status and events, DEBUG logs, and ``loopctl run --json``
stdout and stderr.
"""

from __future__ import annotations

import base64
import functools
import io
import json
import logging
import pickle
import traceback
from typing import Any, Callable, Optional

import attrs
import pytest
import requests
from fakeserver import (
    Cut,
    FakeServer,
    Item,
    Reply,
    Stream,
    anthropic_stream,
    oa_chunk,
    openai_stream,
    sse,
)
from support import Recorder, error_chain, reachable_texts

from loopctl import BareLoop, LoopError
from loopctl.demo.cli import main as cli_main
from loopctl.errors import ConfigError
from loopctl.hosting.registry import RunRegistry
from loopctl.messages import Message, ModelRequest
from loopctl.providers import AnthropicClient, OpenAIClient, StreamHandler
from loopctl.providers.base import StreamAccumulator, StreamAttemptReset, StreamRescue

KEY = "sk-SECRET-123"
HEADER_VALUE = "hdr-SECRET-456"
URL_PASSWORD = "pw-SECRET-789"
# Credentials after an auth scheme, each its own (a value another case registered would be masked anyway).
BEARER_TOKEN = "gwtok-SECRET-881"
BASIC_PASSWORD = "basic-SECRET-772"
SECRETS = ("SECRET",)  # every secret above carries this marker

QUICK = dict(max_retries=0, rescue=False, base_delay=0.0, jitter=0.0)


@attrs.frozen
class Case:
    """One failure path: what the server sends for one model call, and how the client is made."""

    name: str
    provider: str = "openai"
    script: Callable[[], list[Item]] = list
    streaming: bool = True
    handler: dict[str, Any] = attrs.field(factory=lambda: dict(QUICK))
    key: str = KEY
    extra_headers: Optional[dict[str, str]] = None
    url_password: bool = False
    dead_port: bool = False
    fails: bool = True
    in_cli: bool = True
    says: str = ""  # in the error's text: proof the call failed on this path (masks shown as <redacted>)


def _midstream_openai() -> list[Item]:
    error = {"error": {"message": f"invalid key {KEY}", "type": "invalid_request_error"}}
    return [Stream([oa_chunk({"role": "assistant", "content": "hi"}), sse(error)])]


def _midstream_anthropic() -> list[Item]:
    head = anthropic_stream("x")[:2]
    error = {"type": "error", "error": {"type": "invalid_request_error", "message": f"bad key {KEY}"}}
    return [Stream([*head, sse(error, "error")])]


CASES = [
    Case("openai mid-stream error chunk", script=_midstream_openai,
         says="error from the server: invalid key <redacted>"),
    Case("anthropic error event", provider="anthropic", script=_midstream_anthropic,
         says="invalid_request_error from the server: bad key <redacted>"),
    Case("HTTP 200 JSON error body to a stream", says="key <redacted> was revoked",
         script=lambda: [Reply(200, {"error": {"message": f"key {KEY} was revoked"}})]),
    Case("HTTP 200 JSON error body, non-streaming", streaming=False, says="key <redacted> was revoked",
         script=lambda: [Reply(200, {"error": {"message": f"key {KEY} was revoked"}})]),
    Case("malformed JSON in a stream chunk", says="malformed JSON in stream chunk",
         script=lambda: [Stream([f'data: {{"echo": "{KEY}",\n\n'.encode()])]),
    Case("the rescue's malformed JSON response", says="the non-streaming rescue failed too",
         handler=dict(QUICK, rescue=True),
         script=lambda: [Stream([Cut()]),
                         Reply(200, f'{{"echo": "{KEY}"'.encode(), {"content-type": "application/json"})]),
    Case("malformed JSON response, non-streaming", streaming=False, says="malformed JSON in response body",
         script=lambda: [Reply(200, f'{{"echo": "{KEY}"'.encode(), {"content-type": "application/json"})]),
    Case("invalid JSON tool arguments (a soft error; the run goes on)", fails=False,
         script=lambda: [Stream(openai_stream(tool_calls=[("c1", "add", f'{{"k": "{KEY}",')])),
                         Stream(openai_stream("done"))]),
    Case("key with a trailing newline (requests' InvalidHeader)", key=KEY + "\n", says="invalid value"),
    Case("401 body echoing the key", says="HTTP 401: Incorrect API key provided: <redacted>",
         script=lambda: [Reply(401, {"error": {"message": f"Incorrect API key provided: {KEY}"}})]),
    Case("400 body echoing a custom header value", extra_headers={"x-team-token": HEADER_VALUE}, in_cli=False,
         says="HTTP 400: bad team token <redacted>",
         script=lambda: [Reply(400, {"error": {"message": f"bad team token {HEADER_VALUE}"}})]),
    Case("401 body echoing the token of a custom `Bearer` header", in_cli=False,
         extra_headers={"cf-aig-authorization": f"Bearer {BEARER_TOKEN}"},
         says="HTTP 401: gateway token <redacted> revoked",
         script=lambda: [Reply(401, {"error": {"message": f"gateway token {BEARER_TOKEN} revoked"}})]),
    Case("401 body echoing the password of a `Basic` header", in_cli=False,
         extra_headers={"proxy-authorization": "Basic " + base64.b64encode(f"svc:{BASIC_PASSWORD}".encode()).decode()},
         says="HTTP 401: wrong password <redacted>",
         script=lambda: [Reply(401, {"error": {"message": f"wrong password {BASIC_PASSWORD}"}})]),
    Case("connection refused at a URL with credentials", url_password=True, dead_port=True,
         says="connection refused at http://"),
    Case("connection refused, a custom header", extra_headers={"x-team-token": HEADER_VALUE}, dead_port=True,
         in_cli=False, says="connection refused at http://"),
    Case("connection refused, anthropic", provider="anthropic", extra_headers={"x-team-token": HEADER_VALUE},
         dead_port=True, in_cli=False, says="connection refused at http://"),
    Case("a key that is not latin-1, with a key-shaped part", key="sk-ключ-" + KEY, dead_port=True,
         says="(UnicodeEncodeError)"),
    Case("anthropic 529 then a body echoing the key", provider="anthropic", says="rate limited after 2 attempts",
         handler=dict(QUICK, rate_limit_retries=1, rate_limit_delay=0.0),
         script=lambda: [Reply(529, {"error": {"message": f"overloaded {KEY}"}}),
                         Reply(529, {"error": {"message": f"overloaded {KEY}"}})]),
]


def base_url(case: Case, server: FakeServer) -> str:
    port = 1 if case.dead_port else server.port
    creds = f"user:{URL_PASSWORD}@" if case.url_password else ""
    return f"http://{creds}127.0.0.1:{port}" + ("/v1" if case.provider == "openai" else "")


def make_client(case: Case, server: FakeServer) -> Any:
    cls = OpenAIClient if case.provider == "openai" else AnthropicClient
    return cls("m", api_key=case.key, base_url=base_url(case, server), extra_headers=case.extra_headers)


def assert_clean(where: str, text: Any) -> None:
    blob = text if isinstance(text, str) else repr(text)
    for marker in SECRETS:
        lines = [ln for ln in blob.splitlines() if marker in ln]
        assert not lines, f"a secret leaks through {where}: {lines[:5]}"


def assert_error_clean(exc: BaseException) -> None:
    for e in error_chain(exc):
        assert_clean(f"str() of {type(e).__name__}", str(e))
        assert_clean(f"repr() of {type(e).__name__}", repr(e))
        for text in reachable_texts(e):  # its request's headers, a decoder's document, ...
            assert_clean(f"an object reachable from {type(e).__name__}", text)
    assert_clean("traceback.format_exception", "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__, capture_locals=True)
    assert_clean("a traceback with frame locals", "".join(te.format()))
    if isinstance(exc, LoopError):
        blob = pickle.dumps(exc)
        assert b"SECRET" not in blob, "a secret leaks through the pickled error"


def caught(fn: Callable[[], Any]) -> LoopError:
    """The error ``fn()`` raises (caught here, so no test frame is in its traceback)."""
    try:
        fn()
    except LoopError as exc:
        return exc
    raise AssertionError("the call did not fail")


def _call(handler: StreamHandler, client: Any, streaming: bool) -> Any:
    # Consume one model call like the driver does; returns the reply.
    request = ModelRequest([Message.user("hi")], "sys")
    events = (handler.stream_turn if streaming else handler.complete_turn)(client, request, None)
    acc = StreamAccumulator()
    rescued = None
    for ev in events:
        if isinstance(ev, StreamAttemptReset):
            acc = StreamAccumulator()
        elif isinstance(ev, StreamRescue):
            rescued = ev.response
        elif not hasattr(ev, "wait_s"):
            acc.feed(ev)
    return rescued if rescued is not None else acc.build()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_no_secret_reaches_any_outlet(case: Case, server: FakeServer, caplog: pytest.LogCaptureFixture,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.DEBUG)

    # 1. The client under the stream handler: the error, its chain, its tracebacks.
    server.push(*case.script())
    client = make_client(case, server)
    handler = StreamHandler(**case.handler)
    if case.fails:
        error = caught(functools.partial(_call, handler, client, case.streaming))
        assert case.says in str(error), f"failed on another path: {error}"
        assert_error_clean(error)
        if isinstance(error, ConfigError):
            assert error.__cause__ is None and error.__suppress_context__
    else:
        reply = _call(StreamHandler(**case.handler), client, case.streaming)
        assert reply.message.tool_calls and reply.message.tool_calls[0].invalid
        assert_clean("the reply", reply)
    assert_clean("the client's repr", repr(client))

    # 2. A run: the error, its Run record, every event.
    server.push(*case.script())
    recorder = Recorder()
    loop = BareLoop(make_client(case, server), [])
    loop.set_stream_handler(StreamHandler(**case.handler))
    loop.set_turn_mode("streaming" if case.streaming else "non_streaming")
    loop.register_observer(recorder)
    with loop:
        if case.fails:
            error = caught(lambda: loop.run("hi"))
            assert case.says in str(error), f"failed on another path: {error}"
            assert_error_clean(error)
            run = error.run
        else:
            run = loop.run("hi")
            assert run.output == "done"
        assert_clean("Run.to_dict()", json.dumps(run.to_dict()))
        for event in recorder.snapshot():
            assert_clean(f"{type(event).__name__}.to_dict()", json.dumps(event.to_dict()))

    # 3. The registry: status and events.
    server.push(*case.script())
    registry = RunRegistry()
    loop = BareLoop(make_client(case, server), [])
    loop.set_stream_handler(StreamHandler(**case.handler))
    loop.set_turn_mode("streaming" if case.streaming else "non_streaming")
    try:
        rid = registry.start(loop, "hi")
        try:
            registry.result(rid, timeout=20)
        except LoopError:
            pass
        status = registry.status(rid)
        assert case.says in (status.error or ""), status
        assert_clean("RunRegistry.status", repr(status))
        assert_clean("RunRegistry.events", json.dumps([ev for _, ev in registry.events(rid, timeout=5)]))
    finally:
        registry.close()
        loop.close()

    # 4. Logs at DEBUG, from all of the above.
    assert_clean("the DEBUG log", caplog.text)

    # 5. `loopctl run --json`: stdout and stderr.
    if case.in_cli:
        env_var = "OPENAI_API_KEY" if case.provider == "openai" else "ANTHROPIC_API_KEY"
        monkeypatch.setenv(env_var, case.key)
        for _ in range(5):  # the CLI's default handler may retry: enough replies for all of them
            server.push(*case.script())
        out, err = io.StringIO(), io.StringIO()
        argv = ["run", "hi", "--json", "--provider", case.provider, "--model", "m",
                "--base-url", base_url(case, server)]
        if not case.streaming:
            argv.append("--no-stream")
        code = cli_main(argv, stdin=io.StringIO(""), stdout=out, stderr=err, env={})
        assert (code != 0) == case.fails, (code, err.getvalue()[-500:])
        assert_clean("`loopctl run --json` stdout", out.getvalue())
        assert_clean("`loopctl run --json` stderr", err.getvalue())
        assert_clean("the DEBUG log", caplog.text)


def test_the_table_covers_each_path_of_the_issue() -> None:
    assert len({c.name for c in CASES}) == len(CASES) >= 12
    assert all(c.says for c in CASES if c.fails), "every failing case names the error that proves its path"


def test_a_model_echoing_the_token_of_a_header_credential_is_masked_in_events_and_the_run(
        server: FakeServer) -> None:
    token = "echo-SECRET-663"
    server.push(Stream(openai_stream(f"your gateway token is {token}.", piece=3)))
    client = OpenAIClient("m", api_key=KEY, base_url=server.openai_url,
                          extra_headers={"cf-aig-authorization": f"Token {token}"})
    recorder = Recorder()
    with BareLoop(client, []) as loop:
        loop.register_observer(recorder)
        run = loop.run("hi")
    assert run.output == "your gateway token is <redacted>."
    assert_clean("Run.to_dict()", json.dumps(run.to_dict()))
    for event in recorder.snapshot():
        assert_clean(f"{type(event).__name__}.to_dict()", json.dumps(event.to_dict()))


def test_a_plain_header_value_is_masked_whole_never_word_by_word(server: FakeServer) -> None:
    from loopctl.providers.secrets import header_secrets

    # Only a known auth scheme splits a value: ordinary words of other headers stay readable.
    assert header_secrets({"X-Title": "Loopctl Assistant Production"}) == ["Loopctl Assistant Production"]
    assert header_secrets({"Authorization": "Digest username=someone-long, uri=/v1/chat"}) == [
        "Digest username=someone-long, uri=/v1/chat"
    ]
    basic = header_secrets({"Authorization": "Basic " + base64.b64encode(b"admin-user:pa55-w0rd-x").decode()})
    assert "pa55-w0rd-x" in basic and "admin-user" not in basic
    server.push(Stream(openai_stream("The Production assistant answered.", piece=5)))
    client = OpenAIClient("m", api_key=KEY, base_url=server.openai_url,
                          extra_headers={"X-Title": "Loopctl Assistant Production"})
    with BareLoop(client, []) as loop:
        assert loop.run("hi").output == "The Production assistant answered."


class RequestsClient:
    """A user's own ``ModelClient`` over ``requests`` (the protocol, none of loopctl's clients)."""

    model = "mine"

    def __init__(self, url: str, key: str) -> None:
        self.url = url
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {key}"

    def complete(self, request: ModelRequest) -> Any:
        reply = self.session.post(f"{self.url}/chat/completions", json={"model": self.model}, timeout=5)
        reply.raise_for_status()
        raise AssertionError("the server was scripted to refuse")

    def stream(self, request: ModelRequest) -> Any:
        return self.complete(request)


def test_a_custom_clients_foreign_cause_keeps_no_object_holding_the_key(server: FakeServer) -> None:
    server.push(Reply(401, {"error": {"message": "bad key"}}))
    client = RequestsClient(server.openai_url, "own-SECRET-key-4242")
    loop = BareLoop(client, [])
    loop.set_stream_handler(StreamHandler(**QUICK))
    loop.set_turn_mode("non_streaming")
    with loop:
        error = caught(lambda: loop.run("hi"))
    assert_error_clean(error)  # a request's headers are reachable from the error no more
    [foreign] = [e for e in error_chain(error) if isinstance(e, requests.HTTPError)]
    assert "401" in str(foreign)  # the foreign cause is there, its text kept
    assert foreign.request is None and foreign.response is None  # the objects that held the headers: gone
    assert error.run is not None and getattr(error, "kind", None) == "transport"  # loopctl's own fields stay
