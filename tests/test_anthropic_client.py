"""AnthropicClient against a real HTTP server on 127.0.0.1 that streams real SSE."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from fakeserver import (
    Cut,
    FakeServer,
    Reply,
    Stream,
    anthropic_message,
    anthropic_stream,
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
from loopctl.providers import AnthropicClient
from loopctl.providers.base import PartDelta, Ping
from loopctl.providers.http import error_kind

KEY = "sk-ant-test-0123456789abcdefSECRET"


def client(server: FakeServer, **kw: Any) -> AnthropicClient:
    return AnthropicClient("claude-test", api_key=KEY, base_url=server.url, **kw)


def test_stream_with_thinking_text_and_tool_use(server: FakeServer) -> None:
    args = json.dumps({"path": "notes.md"})
    server.push(Stream(anthropic_stream("Reading it.", thinking="I should read.", signature="SIG==",
                                        tool_calls=[("toolu_1", "read_file", args)], usage=(40, 12), piece=2)))
    events, resp = collect_stream(client(server), hi_request(tools=TOOL_SCHEMAS))
    assert resp.message.parts == (
        ThinkingPart("I should read.", "SIG=="),
        TextPart("Reading it."),
        ToolCallPart("toolu_1", "read_file", {"path": "notes.md"}),
    )
    assert resp.message.text == "Reading it."  # thinking stays out of the text
    assert resp.stop_reason is StopReason.TOOL_CALL
    assert resp.usage == Usage(40, 12)
    assert resp.model == "claude-test"
    assert any(isinstance(e, Ping) for e in events)
    assert sum(1 for e in events if isinstance(e, PartDelta) and e.kind == "tool_input") == len(args) // 2 + len(args) % 2
    req = server.requests[0]
    assert req.path == "/v1/messages"
    assert req.headers["x-api-key"] == KEY
    assert req.headers["anthropic-version"] == "2023-06-01"


def test_stop_reasons_map(server: FakeServer) -> None:
    for wire, ours in (("max_tokens", StopReason.MAX_TOKENS), ("stop_sequence", StopReason.STOP_SEQUENCE),
                       ("end_turn", StopReason.END_TURN)):
        server.push(Stream(anthropic_stream("x", stop=wire)))
        _, resp = collect_stream(client(server), hi_request())
        assert resp.stop_reason is ours


def test_cached_prompt_tokens_count_as_input(server: FakeServer) -> None:
    pieces = anthropic_stream("x")
    start = {"type": "message_start", "message": {"model": "claude-test", "usage": {
        "input_tokens": 5, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 20, "output_tokens": 1}}}
    pieces[0] = sse(start, "message_start")
    server.push(Stream(pieces))
    _, resp = collect_stream(client(server), hi_request())
    assert resp.usage == Usage(125, 9)


def test_mid_stream_overloaded_error_is_retryable_rate_limit(server: FakeServer) -> None:
    pieces = anthropic_stream("partial")[:4] + [
        sse({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, "error")
    ]
    server.push(Stream(pieces))
    with pytest.raises(ModelError, match="Overloaded") as info:
        collect_stream(client(server), hi_request())
    assert info.value.retryable is True and info.value.status == 529
    assert error_kind(info.value) == "rate_limit"


def test_mid_stream_invalid_request_error_is_not_retryable(server: FakeServer) -> None:
    pieces = anthropic_stream("x")[:2] + [
        sse({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}, "error")
    ]
    server.push(Stream(pieces))
    with pytest.raises(ModelError) as info:
        collect_stream(client(server), hi_request())
    assert info.value.retryable is False


def test_body_ending_before_message_stop_is_truncated(server: FakeServer) -> None:
    pieces = anthropic_stream("cut short")[:-1]  # everything but message_stop
    server.push(Stream(pieces, chunked=False))
    with pytest.raises(ModelError, match="truncated") as info:
        collect_stream(client(server), hi_request())
    assert info.value.retryable is True


def test_connection_cut_mid_stream_is_a_transport_error(server: FakeServer) -> None:
    server.push(Stream(anthropic_stream("long text here")[:5] + [Cut()]))
    with pytest.raises(ModelError) as info:
        collect_stream(client(server), hi_request())
    assert info.value.retryable is True and error_kind(info.value) == "transport"


def test_malformed_json_event(server: FakeServer) -> None:
    server.push(Stream(anthropic_stream("x")[:2] + [b"event: content_block_delta\ndata: {nope\n\n"]))
    with pytest.raises(ModelError, match="malformed JSON"):
        collect_stream(client(server), hi_request())


def test_401_one_request_key_never_shown(server: FakeServer) -> None:
    server.push(Reply(401, {"type": "error", "error": {"type": "authentication_error",
                                                       "message": f"invalid x-api-key {KEY}"}}))
    c = client(server)
    with pytest.raises(ModelError) as info:
        collect_stream(c, hi_request())
    assert info.value.status == 401 and not info.value.retryable
    assert "invalid x-api-key" in str(info.value)
    assert KEY not in str(info.value) and KEY not in repr(c)
    assert len(server.requests) == 1


def test_golden_request_body_system_folding_tools_and_tool_results(server: FakeServer) -> None:
    server.push(Stream(anthropic_stream("done")))
    msgs = [
        Message.system("Contributor says: repo is Python."),
        Message.user("Find TODOs"),
        Message(Role.ASSISTANT, (ThinkingPart("plan", "sig-1"), TextPart("Looking."),
                                 ToolCallPart("toolu_1", "grep", {"pattern": "TODO"}),
                                 ToolCallPart("toolu_2", "read_file", {"path": "a.py"}))),
        Message.from_tool_results([ToolResultPart("toolu_1", "grep", "a.py:3", False),
                                   ToolResultPart("toolu_2", "read_file", "no such file", True)]),
        Message.user("Also check b.py"),  # a steering message right after the results
        Message(Role.ASSISTANT, (ThinkingPart("unsigned"), ToolCallPart("toolu_3", "grep", {"pattern": "b"}))),
        Message.from_tool_results([ToolResultPart("toolu_3", "grep", "none", False)]),
        Message.system("Second note."),
    ]
    collect_stream(client(server), ModelRequest(msgs, "You are terse.", TOOL_SCHEMAS))
    assert server.requests[0].json == {
        "model": "claude-test",
        "max_tokens": 4096,
        "system": "You are terse.\n\nContributor says: repo is Python.\n\nSecond note.",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Find TODOs"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "plan", "signature": "sig-1"},
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "toolu_1", "name": "grep", "input": {"pattern": "TODO"}},
                {"type": "tool_use", "id": "toolu_2", "name": "read_file", "input": {"path": "a.py"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.py:3"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "no such file", "is_error": True},
                {"type": "text", "text": "Also check b.py"},
            ]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_3", "name": "grep", "input": {"pattern": "b"}},
            ]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_3", "content": "none"}]},
        ],
        "tools": [
            {"name": "read_file", "description": "Read a file.", "input_schema": TOOL_SCHEMAS[0].input_schema},
            {"name": "grep", "description": "Search.", "input_schema": TOOL_SCHEMAS[1].input_schema},
        ],
        "stream": True,
    }


def test_request_options_map_to_native_fields(server: FakeServer) -> None:
    server.push(Stream(anthropic_stream("{}")), Stream(anthropic_stream("{}")))
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    opts = RequestOptions(model="claude-other", max_tokens=99, temperature=0.5, tool_choice="required",
                          response_format=schema, extra_body={"thinking": {"type": "enabled", "budget_tokens": 64}})
    collect_stream(client(server), hi_request(tools=TOOL_SCHEMAS, options=opts))
    body = server.requests[0].json
    assert body["model"] == "claude-other" and body["max_tokens"] == 99 and body["temperature"] == 0.5
    assert body["tool_choice"] == {"type": "any"}
    assert body["output_config"] == {"format": {"type": "json_schema", "schema": schema}}
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 64}
    collect_stream(client(server), hi_request(tools=TOOL_SCHEMAS, options=RequestOptions(tool_choice="grep")))
    assert server.requests[1].json["tool_choice"] == {"type": "tool", "name": "grep"}


def test_unknown_tool_choice_raises_config_error_without_a_request(server: FakeServer) -> None:
    with pytest.raises(ConfigError, match="'nope'"):
        client(server).stream(hi_request(tools=TOOL_SCHEMAS, options=RequestOptions(tool_choice="nope")))
    assert server.requests == []


@pytest.mark.parametrize("call", ["stream", "complete"])
@pytest.mark.parametrize(
    "opts, needle",
    [
        (RequestOptions(temperature=math.nan), "RequestOptions.temperature must be a finite number, got nan"),
        (RequestOptions(temperature=math.inf), "RequestOptions.temperature must be a finite number, got inf"),
        (RequestOptions(temperature=-math.inf), "RequestOptions.temperature must be a finite number, got -inf"),
        (RequestOptions(max_tokens=10**5000), "RequestOptions.max_tokens must be an int between 1 and"),
    ],
)
def test_an_option_the_wire_cannot_carry_raises_config_error_without_a_request(
    server: FakeServer, call: str, opts: RequestOptions, needle: str
) -> None:
    # NaN and infinities are not JSON: the body would carry them as null, the option dropped.
    with pytest.raises(ConfigError, match=needle):
        getattr(client(server), call)(hi_request(options=opts))
    assert server.requests == []


def test_complete_non_streaming(server: FakeServer) -> None:
    server.push(Reply(200, anthropic_message("Hi.", tool_calls=[("toolu_9", "grep", {"pattern": "z"})])))
    resp = client(server).complete(hi_request(tools=TOOL_SCHEMAS))
    assert resp.message.parts == (TextPart("Hi."), ToolCallPart("toolu_9", "grep", {"pattern": "z"}))
    assert resp.stop_reason is StopReason.TOOL_CALL and resp.usage == Usage(21, 9)
    assert "stream" not in server.requests[0].json


def test_env_key_and_base_url(server: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env-000000000000")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
    server.push(Stream(anthropic_stream("a")))
    collect_stream(AnthropicClient("claude-x"), hi_request())
    assert server.requests[0].headers["x-api-key"] == "sk-ant-env-000000000000"
    assert server.requests[0].json["model"] == "claude-x"
