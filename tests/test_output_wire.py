"""Typed answers on the wire: real HTTP to the fake OpenAI and Anthropic servers, real SSE.

The request bodies carry the answer's shape for the mode (``response_format``
with ``strict`` or not, the ``final_answer`` tool with a forced tool
choice, or the instructions in the system prompt); bad answers are sent
back with their problems and asked again.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fakeserver import (
    FakeServer,
    Reply,
    Stream,
    anthropic_message,
    anthropic_stream,
    openai_completion,
    openai_stream,
)
from output_types import City, Note
from support import Recorder

from loopctl import BareLoop, OutputValidationError, RunConfig
from loopctl.observers import OutputValidationFailed, TextDelta
from loopctl.providers import AnthropicClient, OpenAIClient
from loopctl.tools import tool

KEY = "sk-test-abcdef0123456789SECRET"
OSLO = '{"name": "Oslo", "population": 700000}'


def openai(server: FakeServer, **kw: Any) -> OpenAIClient:
    return OpenAIClient("gpt-test", api_key=KEY, base_url=server.openai_url, **kw)


def anthropic(server: FakeServer) -> AnthropicClient:
    return AnthropicClient("claude-test", api_key=KEY, base_url=server.url)


@tool
def population(name: str) -> int:
    """Look up a city's population."""
    return 700000


def test_openai_modes_per_server() -> None:
    assert OpenAIClient("m", api_key=KEY).output_modes[0] == "native"  # api.openai.com
    assert OpenAIClient("m", base_url="http://127.0.0.1:1/v1").output_modes[0] == "tool"
    assert AnthropicClient("m", api_key=KEY).output_modes[0] == "tool"


def test_openai_native_sends_a_strict_json_schema_and_reads_the_streamed_answer(server: FakeServer) -> None:
    server.push(Stream(openai_stream(OSLO)))
    rec = Recorder()
    with BareLoop(openai(server)) as loop:
        loop.register_observer(rec)
        run = loop.run("city?", RunConfig(output_mode="native"), output_type=City)
    assert run.output_value == City("Oslo", 700000)
    body = server.requests[0].json
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["strict"] is True and fmt["json_schema"]["name"] == "City"
    assert fmt["json_schema"]["schema"]["required"] == ["name", "population"]
    assert "tools" not in body and "tool_choice" not in body
    assert "".join(e.delta for e in rec.snapshot() if isinstance(e, TextDelta)) == OSLO


def test_a_schema_strict_mode_cannot_take_goes_with_strict_false(server: FakeServer) -> None:
    server.push(Stream(openai_stream('{"text": "hi", "tag": null}')))
    with BareLoop(openai(server)) as loop:
        run = loop.run("note?", RunConfig(output_mode="native"), output_type=Note)
    assert run.output_value == Note("hi")
    assert server.requests[0].json["response_format"]["json_schema"]["strict"] is False


def test_openai_compatible_server_gets_a_final_answer_tool_and_tools_still_run_first(server: FakeServer) -> None:
    server.push(
        Stream(openai_stream(tool_calls=[("c1", "population", '{"name": "Oslo"}')])),
        Stream(openai_stream(tool_calls=[("c2", "final_answer", OSLO)])),
    )
    rec = Recorder()
    with BareLoop(openai(server), [population]) as loop:
        loop.register_observer(rec)
        run = loop.run("city?", output_type=City)  # default mode for a non-OpenAI host: tool
    assert run.output_value == City("Oslo", 700000)
    for req in server.requests:
        body = req.json
        assert [t["function"]["name"] for t in body["tools"]] == ["population", "final_answer"]
        assert body["tool_choice"] == "required" and "response_format" not in body
    final_schema = server.requests[0].json["tools"][1]["function"]["parameters"]
    assert final_schema["properties"].keys() == {"name", "population"}
    # The population tool's result went back before the final answer.
    assert server.requests[1].json["messages"][-1]["role"] == "tool"
    streamed = "".join(e.delta for e in rec.snapshot() if isinstance(e, TextDelta) and e.turn == 1)
    assert json.loads(streamed) == json.loads(OSLO)


def test_final_answer_called_twice_is_answered_and_asked_again(server: FakeServer) -> None:
    server.push(
        Stream(openai_stream(tool_calls=[("a", "final_answer", OSLO), ("b", "final_answer", OSLO)])),
        Stream(openai_stream(tool_calls=[("c", "final_answer", OSLO)])),
    )
    with BareLoop(openai(server)) as loop:
        run = loop.run("city?", output_type=City)
    assert run.output_value == City("Oslo", 700000)
    results = [m for m in server.requests[1].json["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == ["a", "b"]
    assert "2 times" in results[0]["content"]


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ("Oslo has about 700k people.", "not valid JSON"),
        ('{"name": "Oslo", "population": 7, "mayor": "x"}', "mayor"),
        ('{"name": "Oslo"}', "population"),
        ('{"name": 5, "population": 7}', "name"),
    ],
    ids=["prose", "extra", "missing", "wrong-type"],
)
def test_openai_bad_answers_are_sent_back_with_their_problems(server: FakeServer, bad: str, problem: str) -> None:
    server.push(Stream(openai_stream(bad)), Stream(openai_stream(OSLO)))
    rec = Recorder()
    with BareLoop(openai(server)) as loop:
        loop.register_observer(rec)
        run = loop.run("city?", RunConfig(output_mode="native"), output_type=City)
    assert run.output_value == City("Oslo", 700000)
    again = server.requests[1].json["messages"]
    assert again[-2] == {"role": "assistant", "content": bad}
    assert again[-1]["role"] == "user" and problem in again[-1]["content"]
    failed = [e for e in rec.snapshot() if isinstance(e, OutputValidationFailed)]
    assert len(failed) == 1 and any(problem in e for e in failed[0].errors)


def test_openai_native_nan_answer_is_sent_back_as_not_a_json_number(server: FakeServer) -> None:
    server.push(Stream(openai_stream('{"result": NaN}')), Stream(openai_stream('{"result": 0.5}')))
    with BareLoop(openai(server)) as loop:
        run = loop.run("0/0?", RunConfig(output_mode="native"), output_type=float)
    assert run.output_value == 0.5 and json.loads(json.dumps(run.to_dict()))["output_value"] == 0.5
    again = server.requests[1].json["messages"]
    assert again[-2] == {"role": "assistant", "content": '{"result": NaN}'}
    assert again[-1]["role"] == "user" and "NaN is not a JSON number" in again[-1]["content"]


def test_a_truncated_object_at_max_tokens_fails_after_the_retries(server: FakeServer) -> None:
    for _ in range(3):
        server.push(Stream(openai_stream('{"name": "Os', finish="length")))
    with BareLoop(openai(server)) as loop, pytest.raises(OutputValidationError) as info:
        loop.run("city?", RunConfig(output_mode="native"), output_type=City)
    assert len(server.requests) == 3  # the answer, then output_retries=2 more
    assert info.value.raw_text == '{"name": "Os'
    assert any("max_tokens" in e for e in info.value.errors)
    assert KEY not in str(info.value)


def test_non_streaming_turns_work_the_same(server: FakeServer) -> None:
    server.push(Reply(body=openai_completion(tool_calls=[("c1", "final_answer", OSLO)])))
    with BareLoop(openai(server)) as loop:
        loop.set_turn_mode("non_streaming")
        run = loop.run("city?", output_type=City)
    assert run.output_value == City("Oslo", 700000)


def test_anthropic_default_is_a_forced_final_answer_tool(server: FakeServer) -> None:
    server.push(
        Stream(anthropic_stream("Let me answer.", tool_calls=[("t1", "final_answer", '{"name": "Oslo"}')])),
        Stream(anthropic_stream(tool_calls=[("t2", "final_answer", OSLO)])),
    )
    rec = Recorder()
    with BareLoop(anthropic(server), [population]) as loop:
        loop.register_observer(rec)
        run = loop.run("city?", output_type=City)
    assert run.output_value == City("Oslo", 700000)
    body = server.requests[0].json
    assert [t["name"] for t in body["tools"]] == ["population", "final_answer"]
    assert body["tool_choice"] == {"type": "any"}
    assert "output_config" not in body
    # The missing field went back as the final_answer call's (error) result.
    result = server.requests[1].json["messages"][-1]["content"][0]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "t1" and result["is_error"] is True
    assert "missing required field 'value.population'" in result["content"]
    failed = [e for e in rec.snapshot() if isinstance(e, OutputValidationFailed)]
    assert [f.attempt for f in failed] == [1]


def test_anthropic_native_override_sends_the_schema_in_its_own_shape(server: FakeServer) -> None:
    server.push(Reply(body=anthropic_message(OSLO)))
    with BareLoop(anthropic(server)) as loop:
        loop.set_turn_mode("non_streaming")
        run = loop.run("city?", RunConfig(output_mode="native"), output_type=City)
    assert run.output_value == City("Oslo", 700000)
    fmt = server.requests[0].json["output_config"]["format"]
    assert fmt["type"] == "json_schema" and fmt["schema"]["properties"].keys() == {"name", "population"}


def test_anthropic_prompt_mode_puts_the_schema_in_the_system_prompt(server: FakeServer) -> None:
    server.push(Stream(anthropic_stream("```json\n" + OSLO + "\n```")))
    with BareLoop(anthropic(server)) as loop:
        run = loop.run("city?", RunConfig(output_mode="prompt"), output_type=City)
    assert run.output_value == City("Oslo", 700000)
    body = server.requests[0].json
    assert "JSON Schema" in str(body["system"]) and "tools" not in body and "output_config" not in body


def test_anthropic_prose_instead_of_the_tool_is_asked_again(server: FakeServer) -> None:
    server.push(
        Stream(anthropic_stream("Oslo, about 700k people.")),
        Stream(anthropic_stream(tool_calls=[("t1", "final_answer", OSLO)])),
    )
    with BareLoop(anthropic(server)) as loop:
        run = loop.run("city?", output_type=City)
    assert run.output_value == City("Oslo", 700000)
    last = server.requests[1].json["messages"][-1]
    assert last["role"] == "user" and "final_answer" in json.dumps(last) and "not valid JSON" in json.dumps(last)


def test_anthropic_tool_input_cut_off_at_max_tokens_is_asked_again(server: FakeServer) -> None:
    server.push(
        Stream(anthropic_stream(tool_calls=[("t1", "final_answer", '{"name": "Os')], stop="max_tokens")),
        Stream(anthropic_stream(tool_calls=[("t2", "final_answer", OSLO)])),
    )
    rec = Recorder()
    with BareLoop(anthropic(server)) as loop:
        loop.register_observer(rec)
        run = loop.run("city?", output_type=City)
    assert run.output_value == City("Oslo", 700000)
    failed = [e for e in rec.snapshot() if isinstance(e, OutputValidationFailed)]
    assert len(failed) == 1 and "invalid JSON arguments" in failed[0].errors[0]
    assert "max_tokens" in failed[0].errors[0]
    result = server.requests[1].json["messages"][-1]["content"][0]
    assert result["tool_use_id"] == "t1" and result["is_error"] is True
