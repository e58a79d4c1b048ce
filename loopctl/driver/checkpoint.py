"""Checkpoints and resumption: a run's resumable state at its turn boundaries.

A host that wants durable runs (``CeleryRunRegistry(resume=...)``) passes
``checkpoint=`` to ``BareLoop.start``: at ``RunDriver.boundary`` the run's
thread hands it a ``Checkpoint`` after each model turn (``"model"``), after
each settled tool call or parallel wave (``"call"``) and after each tool
phase (``"tools"``). The callback runs fenced on the run's thread: it
queues the state (the Celery worker writes it with the events before it)
and waits only for what at-most-once needs (a model turn's calls are
durable before any of them starts).

``ResumePoint`` is the other direction: ``start(..., resume=point)`` runs
``on_run_resumed`` in place of ``on_run_start`` and restores the machine
from the checkpoint instead of ``accept_input``. Calls of the awaited wave
that have a committed result are answered with it; the rest run again only
if their tool is ``idempotent``; any other call is answered with a soft
error saying it was interrupted and its effect is unknown (at most once).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Callable, Dict, Optional

import attrs

from loopctl.driver.admission import admit_message
from loopctl.messages import Message, ToolResultPart
from loopctl.records import Turn

if TYPE_CHECKING:
    from loopctl.approvals.gate import Unfence
    from loopctl.machine import AnswerCheck, LoopMachine
    from loopctl.records import Run
    from loopctl.tools.registry import ToolRegistry

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


def snapshot(
    machine: LoopMachine,
    turns: Sequence[Turn],
    answered: Sequence[ToolResultPart],
    base_epoch: int,
    after: str,
) -> Optional[Checkpoint]:
    """The run's state now (None once the machine is terminal: the run's end is its record).

    Args:
        machine: the run's ``LoopMachine``.
        turns: the run's ``Turn`` records so far.
        answered: the awaited wave's settled results (kept for ``"call"``).
        base_epoch: the history epoch the host has committed (a different
            epoch means the run compacted: the checkpoint carries the history).
        after: ``"model"``, ``"call"`` or ``"tools"``.
    """
    if machine.is_terminal:
        return None
    history = tuple(machine.history) if machine.history_epoch != base_epoch else None
    return Checkpoint(
        after,
        tuple(machine.pending),
        machine.turns_taken,
        tuple(turns),
        tuple(answered) if after == "call" else (),
        history,
    )


def answers_for(point: ResumePoint, tools: ToolRegistry) -> Dict[str, ToolResultPart]:
    """The pre-answers of the awaited wave a resumed run starts with.

    A call with a committed result gets it; a call to a tool that is gone
    gets "not available"; unless the run stopped cleanly at the checkpoint,
    a call to a tool that is not ``idempotent`` gets the "interrupted" error
    (it may have run). Every other call runs.
    """
    cp = point.checkpoint
    answered: Dict[str, ToolResultPart] = {}
    last = cp.pending[-1] if cp is not None and cp.pending else None
    if cp is None or last is None or last.role != "assistant":
        return answered
    settled = {r.tool_call_id: r for r in cp.answered}
    names = tools.name_set()
    for c in last.tool_calls:
        if c.id in settled:
            answered[c.id] = settled[c.id]
        elif c.name not in names:
            answered[c.id] = ToolResultPart(c.id, c.name, f"tool '{c.name}' is not available", True)
        elif not point.clean and not getattr(tools.get(c.name), "idempotent", False):
            answered[c.id] = ToolResultPart(c.id, c.name, f"tool '{c.name}': {INTERRUPTED}", True)
    return answered


class DurableRun:
    """A durable run's side of the driver: the host's sink and what checkpoints need.

    Args:
        sink: the host's checkpoint callback (``BareLoop.start(checkpoint=)``).
        base_epoch: the history epoch the host has committed.
    """

    def __init__(self, sink: Callable[[Checkpoint], None], base_epoch: int) -> None:
        self.sink = sink
        self.base_epoch = base_epoch
        self.answered: list[ToolResultPart] = []  # the awaited wave's settled results

    def boundary(self, machine: LoopMachine, turns: Sequence[Turn], after: str) -> None:
        """Hand the run's state to the sink (run thread, fenced)."""
        if after == "model":
            self.answered = []
        point = snapshot(machine, turns, self.answered, self.base_epoch, after)
        if point is not None:
            self.sink(point)

    def settle(self, machine: LoopMachine, turns: Sequence[Turn], results: Sequence[ToolResultPart]) -> None:
        """Results of the awaited wave settled (the dispatcher): checkpoint them."""
        self.answered.extend(results)
        self.boundary(machine, turns, "call")


def restore(
    point: ResumePoint,
    machine: LoopMachine,
    run: Run,
    tools: ToolRegistry,
    answer_check: Optional[AnswerCheck],
    unfenced: Unfence,
) -> Dict[str, ToolResultPart]:
    """Put the machine where the checkpoint left the run; returns the wave's pre-answers.

    ``unfenced`` releases the run's fence while the awaited calls are admitted again.
    """
    cp = point.checkpoint
    if cp is None:
        machine.accept_input(run.input, answer_check)
        return {}
    run.turns.extend(cp.turns)
    answered = answers_for(point, tools)
    pending = list(cp.pending)
    if pending and pending[-1].role == "assistant":
        # The awaited calls pass the admission gate again, as a fresh reply's do.
        pending[-1], _ = admit_message(pending[-1], tools, unfenced)
    machine.resume(pending, cp.turns_taken, answered, answer_check)
    return answered


__all__ = ["INTERRUPTED", "Checkpoint", "DurableRun", "ResumePoint", "answers_for", "restore", "snapshot"]
