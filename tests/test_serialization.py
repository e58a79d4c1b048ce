"""Serialization: every event, message, config, record and status round-trips through JSON.

Round trips go through real ``json.dumps``/``json.loads`` text, so a value
that is not JSON-safe fails here. Events are generated for every type in
``EVENT_TYPES`` (hypothesis), so a new event class without a loader fails too.
"""

from __future__ import annotations

from typing import Any, Dict

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import via_json

from loopctl import (
    Cancelled,
    MaxTurnsExceeded,
    Message,
    ModelError,
    ParallelDispatch,
    Run,
    RunConfig,
    SessionConfig,
    StopReason,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolResultPart,
    Turn,
    Usage,
)
from loopctl.errors import ContextExceeded, LoopError
from loopctl.hosting.registry import RunStatus
from loopctl.hosting.serialization import (
    SCHEMA_VERSION,
    SchemaError,
    dump,
    dumps,
    event_from_dict,
    event_to_dict,
    history_from_dict,
    history_to_dict,
    load,
    loads,
    status_from_dict,
)
from loopctl.observers import (
    EVENT_TYPES,
    Event,
    RunEnd,
    SteeringDelivered,
    ToolCallReceived,
    TurnEnd,
)

text = st.text(max_size=20)
json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000), text)
json_obj = st.dictionaries(st.text(min_size=1, max_size=8), json_scalar, max_size=4)
parts = st.one_of(
    st.builds(TextPart, text),
    st.builds(ThinkingPart, text, st.one_of(st.none(), text)),
    st.builds(ToolCallPart, text, text, json_obj),
    st.builds(ToolResultPart, text, text, text, st.booleans()),
)
messages = st.builds(
    Message, st.sampled_from(["system", "user", "assistant"]), st.lists(parts, max_size=4)
)
usages = st.builds(Usage, st.integers(0, 10**6), st.integers(0, 10**6))
floats = st.floats(allow_nan=False, allow_infinity=False, width=64)


def _field_value(event_cls: type, name: str) -> st.SearchStrategy[Any]:
    if name == "usage":
        return st.one_of(st.none(), usages)
    if name == "messages":
        return st.lists(messages, max_size=3).map(tuple)
    if name == "stop_reason":
        return st.one_of(st.none(), st.sampled_from(list(StopReason)))
    if name == "input":
        return json_obj if event_cls is ToolCallReceived else text
    if name in ("duration_ms", "similarity"):
        return floats
    if name == "context_window":
        return st.one_of(st.none(), st.integers(0, 10**6))
    if name in ("success", "is_error"):
        return st.booleans()
    if name in ("error", "error_type"):
        return st.one_of(st.none(), text)
    if name == "errors":
        return st.lists(text, max_size=3).map(tuple)
    if name in (
        "turn",
        "total_turns",
        "attempt",
        "input_tokens",
        "output_tokens",
        "context_tokens",
        "tokens_before",
        "tokens_after",
        "repetitions",
        "count",
        "max_attempts",
    ):
        return st.integers(0, 10**6)
    return text


@st.composite
def events(draw: Any) -> Event:
    cls = draw(st.sampled_from(sorted(EVENT_TYPES.values(), key=lambda c: c.TYPE)))
    kwargs = {f.name: draw(_field_value(cls, f.name)) for f in attrs.fields(cls)}
    return cls(**kwargs)


@settings(max_examples=300, deadline=None)
@given(events())
def test_every_event_round_trips_through_json(event: Event) -> None:
    data = via_json(event_to_dict(event))
    assert data["type"] == event.TYPE
    back = event_from_dict(data)
    assert type(back) is type(event)
    assert back == event
    assert load(via_json(dump(event))) == event


def test_every_event_type_has_a_loader() -> None:
    # The strategy above draws from EVENT_TYPES; this pins that it is non-trivial.
    assert {"run_start", "run_end", "turn_start", "text_delta", "tool_pre", "tool_post", "steering"} <= set(
        EVENT_TYPES
    )


def test_event_fields_come_back_typed() -> None:
    ev = TurnEnd("s", "r", 2, "llm", True, None, 1.5, 10, 3, StopReason.TOOL_CALL, 99, None)
    back = event_from_dict(via_json(ev.to_dict()))
    assert isinstance(back, TurnEnd)
    assert back.stop_reason is StopReason.TOOL_CALL
    steer = SteeringDelivered("s", "r", 1, (Message.user("left"), Message.user("right")))
    got = event_from_dict(via_json(steer.to_dict()))
    assert isinstance(got, SteeringDelivered)
    assert [m.text for m in got.messages] == ["left", "right"]
    end = event_from_dict({"type": "run_end", "session_id": "s", "run_id": "r", "success": True,
                           "error": None, "total_turns": 3, "duration_ms": 5})
    assert isinstance(end, RunEnd) and isinstance(end.duration_ms, float)
    # A dict from before error_type existed loads with None; a present one comes back.
    assert end.error_type is None
    failed = RunEnd("s", "r", False, "run cancelled", 1, 2.0, "Cancelled")
    assert event_from_dict(via_json(failed.to_dict())) == failed
    assert failed.to_dict()["error_type"] == "Cancelled"
    assert list(failed.to_dict())[-1] == "error_type"  # appended after SPEC §4.1's fields


@pytest.mark.parametrize(
    "data, needle",
    [
        ({"type": "no_such_event"}, "no_such_event"),
        ({"type": "gap", "dropped": 3}, "gap"),
        ({"type": "run_start", "session_id": "s", "run_id": "r"}, "'input'"),
        ({"type": "turn_start", "session_id": "s", "run_id": "r", "turn": "x", "query": ""}, "'turn'"),
        ({"type": "run_start", "session_id": "s", "run_id": "r", "input": "", "version": 99}, "99"),
        (
            {"type": "run_end", "session_id": "s", "run_id": "r", "success": False, "error": "x",
             "total_turns": 1, "duration_ms": 1.0, "error_type": 7},
            "'error_type'",
        ),
        ([1, 2], "list"),
    ],
)
def test_bad_event_dicts_raise_schema_error_naming_the_value(data: Any, needle: str) -> None:
    with pytest.raises(SchemaError, match=needle):
        event_from_dict(data)
    assert issubclass(SchemaError, LoopError) and issubclass(SchemaError, ValueError)


@settings(max_examples=200, deadline=None)
@given(st.lists(messages, max_size=6))
def test_history_round_trips_and_is_versioned(history: list[Message]) -> None:
    data = via_json(history_to_dict(history))
    assert data["version"] == SCHEMA_VERSION
    assert history_from_dict(data) == history
    for m in history:
        assert loads(dumps(m)) == m


def test_history_from_a_newer_version_is_refused() -> None:
    with pytest.raises(SchemaError, match="newer"):
        history_from_dict({"version": SCHEMA_VERSION + 1, "messages": []})
    with pytest.raises(SchemaError, match="messages"):
        history_from_dict({"version": 1})
    with pytest.raises(SchemaError, match="bad message"):
        history_from_dict({"version": 1, "messages": [{"role": "robot", "parts": []}]})


def test_configs_and_parts_round_trip_through_the_envelope() -> None:
    objs: list[Any] = [
        SessionConfig(system_prompt="be brief", context_window=1000, compact_threshold=50),
        RunConfig(max_turns=7, parallel=ParallelDispatch("sequential", 2), memory_top_k=0),
        ParallelDispatch("parallel", 3),
        Usage(3, 4),
        ToolCallPart("c1", "echo", {"a": [1, 2]}),
        ToolResultPart("c1", "echo", "out", True),
        Turn(0, "in", "out", (ToolCallPart("c1", "t", {}),), 5, 6, StopReason.TOOL_CALL),
    ]
    for obj in objs:
        env = via_json(dump(obj))
        assert env["version"] == SCHEMA_VERSION
        assert load(env) == obj


def _run(err: Any) -> Run:
    run = Run(id="r1", input="hi", output=None if err else "done", config=RunConfig(max_turns=4))
    run.turns.append(Turn(0, "hi", "done", (), 3, 4, StopReason.END_TURN))
    run.end = run.start + 1.25
    run.stop_reason = err
    return run


@pytest.mark.parametrize(
    "err",
    [None, Cancelled("user asked"), MaxTurnsExceeded(4), ModelError("boom", status=500),
     ContextExceeded(used=10, limit=5)],
)
def test_run_records_round_trip_with_their_error_type(err: Any) -> None:
    run = _run(err)
    back = loads(dumps(run))
    assert isinstance(back, Run)
    assert back.to_dict() == run.to_dict()
    if err is None:
        assert back.stop_reason is None
    else:
        assert type(back.stop_reason) is type(err)
        assert str(back.stop_reason) == str(err)
        again = load(via_json(dump(err)))
        assert type(again) is type(err) and str(again) == str(err)


def test_run_status_round_trips() -> None:
    status = RunStatus("r", "failed", None, "worker lost", 2, 1, 10, 20, 1.0, 2.0)
    assert load(via_json(dump(status))) == status
    bad: Dict[str, Any] = dict(status.to_dict(), state="exploded")
    with pytest.raises(SchemaError, match="exploded"):
        status_from_dict(bad)


def test_unknown_kinds_and_objects_are_refused() -> None:
    with pytest.raises(SchemaError, match="cannot serialize"):
        dump(object())
    with pytest.raises(SchemaError, match="unknown kind"):
        load({"version": 1, "kind": "spaceship", "data": {}})
    with pytest.raises(SchemaError, match="no 'data'"):
        load({"version": 1, "kind": "usage"})
    with pytest.raises(SchemaError, match="not JSON"):
        loads("{nope")
    with pytest.raises(SchemaError, match="bad run_config"):
        load({"version": 1, "kind": "run_config", "data": {"max_turns": -1}})
