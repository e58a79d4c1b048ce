"""Messages, parts, usage, requests and replies: construction, bad input, round trips.

Round trips go through real JSON text (``json.dumps``/``json.loads``), so a
dict that is not JSON-safe fails here, not in a Celery worker.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import via_json

from loopctl.messages import (
    Message,
    ModelRequest,
    ModelResponse,
    RequestOptions,
    Role,
    StopReason,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolResultPart,
    ToolSchema,
    Usage,
    part_from_dict,
    part_to_dict,
)

# -- Role and StopReason ----------------------------------------------------------------


def test_role_is_a_str_enum_comparing_with_plain_strings() -> None:
    assert Role.USER == "user" and Role.SYSTEM == "system" and Role.ASSISTANT == "assistant"
    assert isinstance(Role.USER, str)
    assert str(Role.ASSISTANT) == "assistant"
    assert {r.value for r in Role} == {"system", "user", "assistant"}


def test_message_role_from_a_plain_string_becomes_the_enum() -> None:
    m = Message("assistant", (TextPart("x"),))
    assert m.role is Role.ASSISTANT


@pytest.mark.parametrize("role", ["tool", "User", "", "developer", 3, None])
def test_message_with_unknown_role_is_refused_naming_it(role: object) -> None:
    with pytest.raises(ValueError) as info:
        Message(role, ())  # type: ignore[arg-type]
    assert repr(role) in str(info.value)
    assert "role" in str(info.value)


def test_stop_reason_members() -> None:
    assert [s.name for s in StopReason] == ["END_TURN", "TOOL_CALL", "MAX_TOKENS", "STOP_SEQUENCE"]
    assert StopReason.TOOL_CALL == "tool_call"


def test_model_response_converts_and_checks_its_stop_reason() -> None:
    msg = Message.assistant("hi")
    assert ModelResponse(msg, "max_tokens").stop_reason is StopReason.MAX_TOKENS  # type: ignore[arg-type]
    assert ModelResponse(msg).stop_reason is StopReason.END_TURN
    with pytest.raises(ValueError, match="'finished'"):
        ModelResponse(msg, "finished")  # type: ignore[arg-type]


# -- constructors and properties ---------------------------------------------------------


def test_user_and_system_constructors_hold_one_text_part() -> None:
    assert Message.user("q") == Message(Role.USER, (TextPart("q"),))
    assert Message.system("be brief") == Message(Role.SYSTEM, (TextPart("be brief"),))


def test_assistant_constructor_puts_text_before_tool_calls() -> None:
    a = ToolCallPart("1", "read", {"path": "x"})
    b = ToolCallPart("2", "grep", {})
    m = Message.assistant("let me look", [a, b])
    assert m.role is Role.ASSISTANT
    assert m.parts == (TextPart("let me look"), a, b)
    assert m.tool_calls == [a, b]
    assert Message.assistant(tool_calls=[a]).parts == (a,)
    assert Message.assistant().parts == ()


def test_from_tool_results_is_one_user_message_in_the_given_order() -> None:
    results = [
        ToolResultPart("3", "c", "third", False),
        ToolResultPart("1", "a", "first", True),
        ToolResultPart("2", "b", "second"),
    ]
    m = Message.from_tool_results(results)
    assert m.role is Role.USER
    assert m.tool_results == results
    assert m.text == ""
    assert results[2].is_error is False


def test_text_joins_text_parts_with_no_separator_and_skips_others() -> None:
    m = Message(
        Role.ASSISTANT,
        (
            ThinkingPart("ponder", signature="sig"),
            TextPart("Hel"),
            ToolCallPart("1", "t", {}),
            TextPart("lo"),
        ),
    )
    assert m.text == "Hello"
    assert m.thinking == [ThinkingPart("ponder", "sig")]
    assert m.tool_results == []


def test_text_is_an_empty_str_without_text_parts() -> None:
    m = Message.assistant(tool_calls=[ToolCallPart("1", "t", {})])
    assert m.text == ""
    assert isinstance(m.text, str)


def test_messages_and_parts_are_frozen() -> None:
    m = Message.user("x")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        m.role = Role.SYSTEM  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        m.parts[0].text = "y"  # type: ignore[misc]


def test_parts_given_as_a_list_are_stored_as_a_tuple() -> None:
    m = Message(Role.USER, [TextPart("a"), TextPart("b")])  # type: ignore[arg-type]
    assert m.parts == (TextPart("a"), TextPart("b"))


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", [["a", "b"], "path=x", None, 42, ("k", "v")])
def test_tool_call_input_that_is_not_a_dict_is_refused_naming_it(value: object) -> None:
    with pytest.raises(TypeError) as info:
        ToolCallPart("call_1", "read", value)  # type: ignore[arg-type]
    text = str(info.value)
    assert "'read'" in text
    assert type(value).__name__ in text
    assert repr(value)[:20] in text


def test_text_part_must_hold_a_str() -> None:
    with pytest.raises(TypeError, match="int 5"):
        TextPart(5)  # type: ignore[arg-type]


def test_a_message_part_must_be_a_part_object() -> None:
    with pytest.raises(TypeError, match="'just text'"):
        Message(Role.USER, ("just text",))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dict"):
        Message(Role.USER, ({"type": "text", "text": "x"},))  # type: ignore[arg-type]


def test_unknown_part_type_in_a_dict_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="'image'"):
        part_from_dict({"type": "image", "url": "x"})
    with pytest.raises(ValueError, match="None"):
        Message.from_dict({"role": "user", "parts": [{"text": "no type"}]})


def test_unknown_role_in_a_dict_is_refused() -> None:
    with pytest.raises(ValueError, match="'robot'"):
        Message.from_dict({"role": "robot", "parts": []})


# -- round trips ---------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=10),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
texts = st.text(max_size=20)
parts = st.one_of(
    st.builds(TextPart, texts),
    st.builds(ThinkingPart, texts, st.one_of(st.none(), texts)),
    st.builds(
        ToolCallPart,
        texts,
        texts,
        st.dictionaries(st.text(max_size=8), json_values, max_size=4),
    ),
    st.builds(ToolResultPart, texts, texts, texts, st.booleans()),
)
messages = st.builds(Message, st.sampled_from(list(Role)), st.lists(parts, max_size=5))


@settings(max_examples=100, deadline=None)
@given(messages)
def test_message_round_trips_through_json(message: Message) -> None:
    data = message.to_dict()
    back = Message.from_dict(via_json(data))
    assert back == message
    assert back.role is message.role
    assert [type(p) for p in back.parts] == [type(p) for p in message.parts]
    assert back.text == message.text
    assert back.to_dict() == data


@settings(max_examples=100, deadline=None)
@given(parts)
def test_part_round_trips_through_json(part: Any) -> None:
    data = part_to_dict(part)
    assert isinstance(data["type"], str)
    assert part_from_dict(via_json(data)) == part


def test_part_dicts_are_tagged_with_their_type() -> None:
    assert part_to_dict(TextPart("x")) == {"type": "text", "text": "x"}
    assert part_to_dict(ThinkingPart("t", "s")) == {"type": "thinking", "text": "t", "signature": "s"}
    assert part_to_dict(ToolCallPart("1", "read", {"p": [1]})) == {
        "type": "tool_call",
        "id": "1",
        "name": "read",
        "input": {"p": [1]},
    }
    assert part_to_dict(ToolResultPart("1", "read", "out", True)) == {
        "type": "tool_result",
        "tool_call_id": "1",
        "tool_name": "read",
        "output": "out",
        "is_error": True,
    }


def test_tool_call_dict_does_not_share_the_input_mapping() -> None:
    call = ToolCallPart("1", "read", {"path": "a"})
    data = part_to_dict(call)
    data["input"]["path"] = "changed"
    assert call.input == {"path": "a"}


@given(st.integers(0, 10**9), st.integers(0, 10**9))
def test_usage_round_trips_and_totals(inp: int, out: int) -> None:
    usage = Usage(inp, out)
    assert usage.total_tokens == inp + out
    assert Usage.from_dict(via_json(usage.to_dict())) == usage


def test_usage_defaults_to_zero() -> None:
    assert Usage() == Usage(0, 0)
    assert Usage.from_dict({}) == Usage(0, 0)


# -- requests, replies, options, schemas ---------------------------------------------------


def test_model_request_defaults() -> None:
    req = ModelRequest([Message.user("q")])
    assert req.system is None
    assert tuple(req.tools) == ()
    assert req.options is None


def test_model_response_defaults() -> None:
    resp = ModelResponse(Message.assistant("a"))
    assert (resp.stop_reason, resp.usage, resp.model) == (StopReason.END_TURN, None, None)


def test_request_options_empty_and_with_model() -> None:
    opts = RequestOptions()
    assert opts.is_empty()
    routed = opts.with_model("small")
    assert routed.model == "small" and not routed.is_empty()
    assert opts.model is None  # evolve, not mutate
    assert not RequestOptions(temperature=0.0).is_empty()  # 0.0 is set, not missing


def test_tool_schema_to_dict_is_json_safe() -> None:
    schema = ToolSchema("read", "Read a file.", {"type": "object", "properties": {}})
    assert via_json(schema.to_dict()) == {
        "name": "read",
        "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {}},
    }


@pytest.mark.parametrize("name", [f.name for f in attrs.fields(RequestOptions)])
def test_request_options_with_any_one_field_set_is_not_empty(name: str) -> None:
    """Any one option set, the options are not empty."""
    value: object = {"x": 1} if name in ("response_format", "extra_body") else ("m" if name in ("model", "tool_choice") else 1)
    assert not RequestOptions(**{name: value}).is_empty()
