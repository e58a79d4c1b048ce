"""Checkpoints and resumption: a run's resumable state at its turn boundaries.

A host that wants durable runs (``CeleryRunRegistry(resume=...)``) passes
``checkpoint=`` to ``BareLoop.start``: the run's thread then hands it a
``Checkpoint`` after each model turn (``"model"``), after each settled tool
call or parallel wave (``"call"``) and after each tool phase (``"tools"``).
The callback runs fenced on the run's thread, so it must only queue the
state (the Celery worker writes it with the events that precede it).

``ResumePoint`` is the other direction: ``start(..., resume=point)`` runs
``on_run_resumed`` in place of ``on_run_start`` and restores the machine
from the checkpoint instead of ``accept_input``. Calls of the awaited wave
that have a committed result are answered with it; the rest run again only
if their tool is ``idempotent``; any other call is answered with a soft
error saying it was interrupted and its effect is unknown (at most once).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Dict, Optional

import attrs

from loopctl.messages import Message, ToolResultPart
from loopctl.records import Turn

if TYPE_CHECKING:
    from loopctl.driver.handle import RunContext
    from loopctl.driver.loop import BareLoop

log = logging.getLogger("loopctl")

#: The error text an interrupted, non-idempotent call comes back with.
INTERRUPTED = "the call was interrupted by a worker failure; its effect is unknown"


@attrs.frozen
class Checkpoint:
    """A run's resumable state at a boundary.

    Attributes:
        after: ``"model"``, ``"call"`` or ``"tools"`` (what just ended).
        pending: the run's messages so far, its input first.
        turns_taken: model turns taken.
        turns: the run's ``Turn`` records so far.
        answered: results of the awaited wave that are settled (``"call"``).
        history: the committed history, only when this run changed it
            (a compaction); None otherwise.
    """

    after: str
    pending: tuple[Message, ...]
    turns_taken: int
    turns: tuple[Turn, ...]
    answered: tuple[ToolResultPart, ...] = ()
    history: Optional[tuple[Message, ...]] = None


@attrs.frozen
class ResumePoint:
    """Where a resumed run continues: a checkpoint, the attempt number and why.

    Attributes:
        checkpoint: the last committed checkpoint (None: from the input).
        attempt: 1 for the first resumption.
        cause: why the run moved (shown in the ``run_resumed`` event).
        clean: the run stopped right at that checkpoint (handed back), so no
            call of the awaited wave had started: they all run.
    """

    checkpoint: Optional[Checkpoint]
    attempt: int
    cause: str
    clean: bool = False


def take_checkpoint(loop: BareLoop, rc: RunContext, after: str) -> None:
    """Hand the run's state to its checkpoint callback (run thread, fenced)."""
    sink = rc.checkpoint
    if sink is None:
        return
    m = loop._machine
    if m.is_terminal:
        return  # the run is ending: its end is the record
    history = tuple(m.history) if m.history_epoch != rc.base_epoch else None
    point = Checkpoint(
        after,
        tuple(m.pending),
        m.turns_taken,
        tuple(rc.run.turns),
        tuple(rc.answered) if after == "call" else (),
        history,
    )
    try:
        sink(point)
    except Exception:  # a host's bug must not end the run; the next boundary tries again
        log.exception("run %s: the checkpoint callback failed", rc.run.id)


def settle(loop: BareLoop, rc: RunContext, results: Any) -> None:
    """Record settled results of the awaited wave, then checkpoint."""
    if rc.checkpoint is None:
        return
    rc.answered.extend(results)
    take_checkpoint(loop, rc, "call")


def restore(loop: BareLoop, rc: RunContext, point: ResumePoint) -> None:
    """Put the machine where the checkpoint left the run (the resumed run's thread)."""
    m = loop._machine
    cp = point.checkpoint
    if cp is None:
        m.accept_input(rc.run.input)
        return
    rc.run.turns.extend(cp.turns)
    last = cp.pending[-1] if cp.pending else None
    answered: Dict[str, ToolResultPart] = {}
    if last is not None and last.role == "assistant":
        settled = {r.tool_call_id: r for r in cp.answered}
        names = loop._tools.name_set()
        for c in last.tool_calls:
            if c.id in settled:
                answered[c.id] = settled[c.id]
            elif c.name not in names:
                answered[c.id] = ToolResultPart(c.id, c.name, f"tool '{c.name}' is not available", True)
            elif not point.clean and not getattr(loop._tools.get(c.name), "idempotent", False):
                answered[c.id] = ToolResultPart(c.id, c.name, f"tool '{c.name}': {INTERRUPTED}", True)
    # A checkpoint's own history (after a compaction) reached the loop through
    # the host's factory; later checkpoints must carry it again.
    m.resume(cp.pending, cp.turns_taken, answered)
    rc.base_epoch = -1 if cp.history is not None else m.history_epoch
    rc.answered = list(answered.values())


__all__ = ["INTERRUPTED", "Checkpoint", "ResumePoint", "restore", "settle", "take_checkpoint"]
