"""The event table: every event class, walked through every consumer.

``loopctl.observers.EVENTS`` declares each event once. A new event class
added there must reach every consumer, or a test here fails naming the
consumer that does not handle it: observers (a documented ``Observer``
method), the emitter (dispatched from the table, asked through ``wants``),
JSON (``to_dict`` / ``event_from_dict``), the registry's event stream, the
Celery stream's wire format, sub-agent forwarding, and OpenTelemetry (a
handler or a place in ``OTelObserver.IGNORED_EVENTS``).
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Iterable
from typing import Any, Callable

import attrs
import pytest

from loopctl import BareLoop
from loopctl.contrib.celery.redis import dumps
from loopctl.contrib.otel.observer import OTelObserver
from loopctl.driver.emission import Emitter, RunEvents, handled, overridden
from loopctl.driver.subagent_events import Forwarder
from loopctl.hosting.entry import _Entry
from loopctl.hosting.following import follow_entry
from loopctl.hosting.serialization import event_from_dict
from loopctl.messages import Message, StopReason, Usage
from loopctl.observers import (
    EVENT_METHODS,
    EVENT_TYPES,
    EVENTS,
    CallbackObserver,
    Event,
    Observer,
    RunEnd,
    RunStart,
    ToolPre,
)
from loopctl.testing import ScriptedClient, reply

#: A sample value for each field type events use. A new field type needs a
#: line here (the sample test names the event and the field that lacks one).
_SAMPLES: dict[str, Callable[[str], Any]] = {
    "str": lambda name: f"a {name}",
    "int": lambda name: 3,
    "float": lambda name: 1.5,
    "bool": lambda name: True,
    "Optional[str]": lambda name: f"an {name}",
    "Optional[int]": lambda name: 4096,
    "Optional[float]": lambda name: 2.5,
    "Optional[Usage]": lambda name: Usage(10, 5),
    "Optional[StopReason]": lambda name: StopReason.TOOL_CALL,
    "Mapping[str, Any]": lambda name: {"query": "weather", "n": 2},
    "tuple[str, ...]": lambda name: ("answer: missing field",),
    "tuple[Message, ...]": lambda name: (Message.user("focus on the summary"),),
}


def sample(cls: type[Event], session_id: str = "s-1", run_id: str = "r-1") -> Event:
    """An instance of ``cls`` with a plain value in every field."""
    kwargs: dict[str, Any] = {"session_id": session_id, "run_id": run_id}
    for f in attrs.fields(cls):
        if f.name in kwargs or f.name == "subagent":
            continue
        make = _SAMPLES.get(str(f.type))
        assert make is not None, f"{cls.__name__}.{f.name}: no sample for field type {f.type!r} in _SAMPLES"
        kwargs[f.name] = make(f.name)
    return cls(**kwargs)


# -- consumers: each returns the event classes it does not handle -------------------


def observer_gaps(events: Iterable[type[Event]]) -> list[type[Event]]:
    """Observer needs a documented no-op ``on_<type>`` per event."""
    gaps = []
    for cls in events:
        method = getattr(Observer, cls.observer_method(), None)
        if method is None or not (method.__doc__ or "").strip():
            gaps.append(cls)
    return gaps


def json_gaps(events: Iterable[type[Event]]) -> list[type[Event]]:
    """``to_dict`` then ``event_from_dict`` gives the event back."""
    gaps = []
    for cls in events:
        ev = sample(cls)
        try:
            back = event_from_dict(json.loads(json.dumps(ev.to_dict(), allow_nan=False)))
        except Exception:
            gaps.append(cls)
            continue
        if back != ev:
            gaps.append(cls)
    return gaps


def celery_gaps(events: Iterable[type[Event]]) -> list[type[Event]]:
    """The Celery stream's wire text (``dumps(event.to_dict())``) reads back as the event."""
    gaps = []
    for cls in events:
        ev = sample(cls)
        try:
            back = event_from_dict(json.loads(dumps(ev.to_dict())))
        except Exception:
            gaps.append(cls)
            continue
        if back != ev:
            gaps.append(cls)
    return gaps


def registry_gaps(events: Iterable[type[Event]]) -> list[type[Event]]:
    """What the registry's tap buffers, its stream yields as dicts that load back."""
    loop = BareLoop(ScriptedClient([]), [])
    try:
        entry = _Entry("r-1", loop, 1000, deque(), time.monotonic)
        sent = [sample(cls, loop.session.id) for cls in events if cls is not RunEnd]
        sent.append(sample(RunEnd, loop.session.id))  # the stream ends at run_end
        for ev in sent:
            entry.tap(ev)
        got = [d for _, d in follow_entry(entry, 0, 0.0)]
    finally:
        loop.close()
    gaps = []
    for ev, data in zip(sent, got):
        try:
            if event_from_dict(data) != ev:
                gaps.append(type(ev))
        except Exception:
            gaps.append(type(ev))
    gaps.extend(type(ev) for ev in sent[len(got):])
    return [cls for cls in gaps if cls in set(events)]


def otel_gaps(events: Iterable[type[Event]]) -> list[type[Event]]:
    """OTel handles each event or ignores it in its declared list (never both, never neither)."""
    handles = {cls for cls, _ in overridden(OTelObserver)}
    ignores = set(OTelObserver.IGNORED_EVENTS)
    return [cls for cls in events if (cls in handles) == (cls in ignores)]


def forwarder_gaps(events: Iterable[type[Event]]) -> list[type[Event]]:
    """A sub-agent's events reach its parent: the forwarder handles every event."""
    handles = {cls for cls, _ in overridden(Forwarder)}
    return [cls for cls in events if cls not in handles]


def emitter_gaps(events: Iterable[type[Event]]) -> list[type[Event]]:
    """The emitter dispatches the event to an observer that handles it, and a tap sees it."""
    got: list[Event] = []
    tapped: list[Event] = []
    emitter = Emitter("s-1")
    emitter.add_observer(CallbackObserver(got.append))
    em = RunEvents(emitter, "r-1", tapped.append, None, None)
    gaps = []
    for cls in events:
        ev = sample(cls)
        if cls not in EVENT_METHODS or not em.wants(cls):
            gaps.append(cls)
            continue
        em.emit(ev)
        if not got or got[-1] != ev or not tapped or tapped[-1] != ev:
            gaps.append(cls)
    return gaps


CONSUMERS: dict[str, Callable[[Iterable[type[Event]]], list[type[Event]]]] = {
    "Observer": observer_gaps,
    "emitter": emitter_gaps,
    "JSON (to_dict / event_from_dict)": json_gaps,
    "registry event stream": registry_gaps,
    "Celery event stream": celery_gaps,
    "sub-agent forwarder": forwarder_gaps,
    "OTelObserver": otel_gaps,
}


@pytest.mark.parametrize("consumer", sorted(CONSUMERS))
def test_every_event_reaches_every_consumer(consumer: str) -> None:
    gaps = CONSUMERS[consumer](EVENTS)
    assert not gaps, f"{consumer} does not handle: {', '.join(c.TYPE for c in gaps)}"


def test_the_table_is_one_entry_per_event() -> None:
    assert len(set(EVENTS)) == len(EVENTS)
    assert len({cls.TYPE for cls in EVENTS}) == len(EVENTS)
    assert EVENT_TYPES == {cls.TYPE: cls for cls in EVENTS}
    assert EVENT_METHODS == {cls: f"on_{cls.TYPE}" for cls in EVENTS}
    # Every event class defined in the module is in the table.
    import loopctl.events.types as module

    defined = {
        v for v in vars(module).values() if isinstance(v, type) and issubclass(v, Event) and v is not Event
    }
    assert defined == set(EVENTS)


def test_otel_declares_nothing_twice() -> None:
    ignores = OTelObserver.IGNORED_EVENTS
    assert len(set(ignores)) == len(ignores)
    assert set(ignores) <= set(EVENTS)


@attrs.frozen
class _Novel(Event):
    """An event no consumer knows (never added to the table)."""

    TYPE = "novel_event"
    detail: str


def test_a_new_event_fails_naming_each_consumer_that_misses_it() -> None:
    # The checks above, given an event nobody was taught: each one names it.
    missed = {name for name, gaps in CONSUMERS.items() if gaps([_Novel]) == [_Novel]}
    assert missed == set(CONSUMERS)


# -- dispatch from the table ----------------------------------------------------------


class _Starts(Observer):
    def on_run_start(self, event: RunStart) -> None:
        pass


class _SubStarts(_Starts):
    def on_tool_pre(self, event: ToolPre) -> None:
        pass


def test_overrides_are_computed_once_per_class() -> None:
    first = overridden(_SubStarts)
    assert first == ((RunStart, "on_run_start"), (ToolPre, "on_tool_pre"))
    assert overridden(_SubStarts) is first  # cached
    assert overridden(Observer) == ()


def test_instance_attributes_turn_events_on_and_off() -> None:
    obs = _Starts()
    assert handled(obs) == ((RunStart, "on_run_start"),)
    obs.on_tool_pre = lambda event: None  # type: ignore[method-assign]
    assert handled(obs) == ((RunStart, "on_run_start"), (ToolPre, "on_tool_pre"))
    obs.on_run_start = Observer.on_run_start.__get__(obs)  # type: ignore[method-assign]
    assert handled(obs) == ((ToolPre, "on_tool_pre"),)
    assert {cls for cls, _ in handled(CallbackObserver(print))} == set(EVENTS)


def test_emit_drops_what_nobody_wants_and_delivers_the_rest() -> None:
    calls: list[Event] = []

    class Pre(Observer):
        def on_tool_pre(self, event: ToolPre) -> None:
            calls.append(event)

    emitter = Emitter("s-1")
    emitter.add_observer(Pre())
    em = RunEvents(emitter, "r-1", None, None, None)
    assert em.wants(ToolPre)
    assert not em.wants(RunStart)
    em.emit(sample(RunStart))
    em.emit(sample(ToolPre))
    assert calls == [sample(ToolPre)]


def test_an_observer_that_raises_is_logged_and_the_next_still_gets_the_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    got: list[Event] = []

    class Boom(Observer):
        def on_tool_pre(self, event: ToolPre) -> None:
            raise RuntimeError("observer broke")

    emitter = Emitter("s-1")
    emitter.add_observer(Boom())
    emitter.add_observer(CallbackObserver(got.append))
    em = RunEvents(emitter, "r-1", None, None, None)
    em.emit(sample(ToolPre))
    assert got == [sample(ToolPre)]
    assert "observer Boom raised in on_tool_pre" in caplog.text


@pytest.mark.parametrize("exc", [SystemExit(1), KeyboardInterrupt(), GeneratorExit()])
@pytest.mark.parametrize("where", ["on_run_start", "on_run_end"])
def test_an_observer_raising_a_base_exception_never_changes_the_run(
    exc: BaseException, where: str, caplog: pytest.LogCaptureFixture
) -> None:
    class Exits(Observer):
        pass

    def leave(self: Observer, event: Event) -> None:
        raise exc

    setattr(Exits, where, leave)
    got: list[str] = []
    with BareLoop(ScriptedClient([reply("ok")])) as loop:
        loop.register_observer(Exits())
        loop.register_observer(CallbackObserver(lambda e: got.append(type(e).__name__)))
        run = loop.run("go")
    assert run.output == "ok"
    assert got[0] == "RunStart" and got[-1] == "RunEnd"
    assert f"observer Exits raised in {where}" in caplog.text
