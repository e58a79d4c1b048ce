"""An LLM or tool phase of a run: how it opens and closes, and the scope that closes it.

``Phase`` is an open phase: its ``on_turn_end`` is owed until closed.
``open_scope`` makes it the run's open phase BEFORE it sends the phase's
opening events (``on_turn_start``; the ``on_tool_call_received`` of each
call), so a cancel that finalizes the run while an observer holds one of
them still owes, and sends, its failed ``on_turn_end``. ``PhaseScope``
(``with events.phase(turn, "llm", ctx) as phase:``) closes it on every
exit, so no path can leave its ``on_turn_end`` unsent; ``NullScope`` stands
in when nobody watches turn ends (no clock, no event). ``end_phase`` sends
the ``on_turn_end``, once. The owner (``RunEvents``) is reached through the
``PhaseOwner`` protocol, so this module imports nothing of the emitter.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Literal, Optional, Protocol

from loopctl.events import Event, TurnEnd
from loopctl.messages import StopReason


class PhaseOwner(Protocol):
    """What a phase needs of the run's events: the open phase, the run's ids and window, the one door."""

    open_phase: Optional[Phase]
    session_id: str
    run_id: str
    window: Optional[int]

    def emit(self, event: Event) -> None: ...

    def flush_deltas(self, keep: Optional[type[Event]] = None) -> None: ...


class Phase:
    """An open LLM or tool phase: its ``on_turn_end`` is owed until closed."""

    __slots__ = ("turn", "name", "t0", "input_tokens", "output_tokens", "stop_reason", "context_tokens", "closed")

    def __init__(self, turn: int, name: str, context_tokens: int) -> None:
        self.turn = turn
        self.name = name
        self.t0 = time.perf_counter()
        self.input_tokens = 0
        self.output_tokens = 0
        self.stop_reason: Optional[StopReason] = None
        self.context_tokens = context_tokens
        self.closed = False


class PhaseScope:
    """``with events.phase(turn, "llm", ctx) as phase:`` — closes the phase on every exit.

    A clean exit sends ``on_turn_end(success=True)`` with the phase's fields
    as the body set them; an error sends it failed with the error's text. A
    run abandoned on cancel sends nothing here: ``finalize`` closed it.
    """

    __slots__ = ("events", "phase")

    def __init__(self, events: PhaseOwner, phase: Phase) -> None:
        self.events = events
        self.phase = phase

    def __enter__(self) -> Phase:
        return self.phase  # already the open phase: ``open_scope`` opened it before its first event

    def __exit__(self, et: Any, ev: object, tb: object) -> Literal[False]:
        phase = self.phase
        if phase.closed or (et is not None and not issubclass(et, Exception)):
            return False  # closed by finalize, or unwinding an abandoned body
        if et is None:
            end_phase(self.events, phase, None)
        else:
            end_phase(self.events, phase, str(ev), et.__name__)
        return False


def open_scope(
    owner: PhaseOwner,
    phase: Phase,
    opening: Sequence[Event],
    reply: Optional[tuple[int, int, Optional[StopReason]]],
) -> PhaseScope:
    """Make ``phase`` the run's open phase, then send ``opening``; the scope that closes it.

    The phase is owed from before its first event. Its clock starts once
    the opening events are delivered, so it times its own work only.
    ``reply``: the input and output tokens and stop reason it reports from
    the start (a tool phase: those of the reply that asked).
    """
    if reply is not None:
        phase.input_tokens, phase.output_tokens, phase.stop_reason = reply
    owner.open_phase = phase
    if opening:
        for event in opening:
            owner.emit(event)
        phase.t0 = time.perf_counter()
    return PhaseScope(owner, phase)


def end_phase(owner: PhaseOwner, phase: Phase, error: Optional[str], error_type: Optional[str] = None) -> None:
    """Send the phase's ``on_turn_end`` (failed when ``error`` is given), once.

    ``error_type`` is the failure's exception class name, when there is one.
    """
    if phase.closed:
        return
    phase.closed = True
    owner.flush_deltas()
    if owner.open_phase is phase:
        owner.open_phase = None
    owner.emit(
        TurnEnd(
            owner.session_id,
            owner.run_id,
            phase.turn,
            phase.name,
            error is None,
            error,
            (time.perf_counter() - phase.t0) * 1000.0,
            phase.input_tokens,
            phase.output_tokens,
            phase.stop_reason,
            phase.context_tokens,
            owner.window,
            error_type,
        )
    )


class NullPhase:
    """The phase of a run nobody watches turn ends of: fields are written, never read."""

    __slots__ = ("input_tokens", "output_tokens", "stop_reason", "context_tokens")


class NullScope:
    """``phase()`` when no ``on_turn_end`` would reach anyone: no clock, no event."""

    __slots__ = ("phase",)

    def __init__(self) -> None:
        self.phase = NullPhase()

    def __enter__(self) -> NullPhase:
        return self.phase

    def __exit__(self, et: object, ev: object, tb: object) -> Literal[False]:
        return False


__all__ = ["NullPhase", "NullScope", "Phase", "PhaseOwner", "PhaseScope", "end_phase", "open_scope"]
