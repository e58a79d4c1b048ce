"""An LLM or tool phase of a run, and the one context manager that closes it.

``Phase`` is an open phase: its ``on_turn_end`` is owed until closed.
``PhaseScope`` (``with events.phase(turn, "llm", ctx) as phase:``) closes it
on every exit, so no path can leave its ``on_turn_end`` unsent; ``NullScope``
stands in when nobody watches turn ends (no clock, no event). The owner
(``RunEvents``) is reached through the ``PhaseOwner`` protocol, so this
module imports nothing of the emitter.
"""

from __future__ import annotations

import time
from typing import Any, Literal, Optional, Protocol

from loopctl.messages import StopReason


class PhaseOwner(Protocol):
    """What a scope needs of the run's events: the open phase, and how to close one."""

    open_phase: Optional[Phase]

    def close_phase(self, phase: Phase, error: Optional[str], error_type: Optional[str] = None) -> None: ...


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
        self.events.open_phase = self.phase
        return self.phase

    def __exit__(self, et: Any, ev: object, tb: object) -> Literal[False]:
        phase = self.phase
        if phase.closed or (et is not None and not issubclass(et, Exception)):
            return False  # closed by finalize, or unwinding an abandoned body
        if et is None:
            self.events.close_phase(phase, None)
        else:
            self.events.close_phase(phase, str(ev), et.__name__)
        return False


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


__all__ = ["NullPhase", "NullScope", "Phase", "PhaseOwner", "PhaseScope"]
