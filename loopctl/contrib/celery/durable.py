"""Durable runs on a worker: checkpoints as JSON, the drain on a warm shutdown, the hand-back.

``checkpointer`` is the sink a durable run's loop gets (``BareLoop.start(
checkpoint=...)``): it queues each checkpoint on the events thread and, for
a model turn, waits until it is written (write-ahead: the calls the model
asked for are durable before any of them starts, so a crash never makes
the model ask, and a tool run, twice). While the worker drains, the sink
hands the run back at that boundary: it seals the writer (nothing after the
checkpoint reaches the stream) and cancels the local run before its next
step, and ``hand_back`` requeues it (``HANDBACK``) and sends its message.
``wait_or_drain`` also hands back, from the last committed checkpoint, a
run that reaches no boundary within ``drain_timeout``. Each checkpoint
carries the run's trace context (``trace``: W3C headers of its run span,
when OpenTelemetry is there), so the worker that resumes it continues the
original trace (``checkpoint_trace``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import attrs

from loopctl.cancel import HANDED_BACK
from loopctl.driver.checkpoint import Checkpoint
from loopctl.driver.handle import RunHandle
from loopctl.driver.loop import BareLoop
from loopctl.hosting.serialization import (
    history_from_dict,
    history_to_dict,
    message_from_dict,
    message_to_dict,
)
from loopctl.messages import Message
from loopctl.records import Turn

from .events import EventWriter
from .redis import RedisBackend, RegistryUnavailable, dumps
from .steers import Steer, steer_from_dict, steer_to_dict
from .task import propagation

log = logging.getLogger("loopctl")


class WorkerHost:
    """What a worker process offers its runs: the drain switch and a prompt resend.

    Attributes:
        draining: set on a warm shutdown; durable runs are handed back.
        drain_timeout: seconds a run may take to reach a boundary once draining.
    """

    def __init__(self, drain_timeout: float, kick: Callable[[], None]) -> None:
        self.draining = threading.Event()
        self.drain_timeout = drain_timeout
        self._kick = kick

    def kick(self) -> None:
        """Send the outbox's due task messages now (after a handback)."""
        self._kick()


@attrs.frozen
class Saved:
    """A checkpoint read back, with what the worker that resumes it needs besides.

    Attributes:
        checkpoint: where the run resumes.
        steers: how many stored steers it has settled (a resume feeds the rest).
        clean: the run stopped right at this checkpoint (handed back).
        kept: sub-agent guidance among the settled steers that no sub-agent
            took: still owed to the run's leftovers.
    """

    checkpoint: Checkpoint
    steers: int = 0
    clean: bool = False
    kept: Tuple[Steer, ...] = ()


def checkpoint_to_json(
    cp: Checkpoint,
    steers: int,
    clean: bool = False,
    trace: Optional[Dict[str, str]] = None,
    kept: Sequence[Steer] = (),
) -> str:
    """A checkpoint as JSON, with the count of steers it has settled.

    ``clean``: the run stops right here (handed back), nothing runs after it.
    ``trace``: the run's W3C trace context, for the worker that resumes it.
    ``kept``: settled sub-agent guidance that no sub-agent took (see ``Saved``).
    """
    return dumps(
        {
            "trace": trace or None,
            "clean": clean,
            "after": cp.after,
            "pending": history_to_dict(cp.pending),
            "turns_taken": cp.turns_taken,
            "turns": [t.to_dict() for t in cp.turns],
            "answered": message_to_dict(Message.from_tool_results(cp.answered)) if cp.answered else None,
            "history": history_to_dict(cp.history) if cp.history is not None else None,
            "steers": steers,
            "kept": [steer_to_dict(m, to) for m, to in kept],
        }
    )


def checkpoint_from_json(text: str) -> Saved:
    """``checkpoint_to_json`` reversed."""
    data = json.loads(text)
    answered = message_from_dict(data["answered"]).tool_results if data.get("answered") else []
    history = history_from_dict(data["history"]) if data.get("history") is not None else None
    cp = Checkpoint(
        str(data["after"]),
        tuple(history_from_dict(data["pending"])),
        int(data["turns_taken"]),
        tuple(Turn.from_dict(t) for t in data["turns"]),
        tuple(answered),
        tuple(history) if history is not None else None,
    )
    kept = tuple(steer_from_dict(k) for k in data.get("kept") or ())
    return Saved(cp, int(data.get("steers") or 0), bool(data.get("clean")), kept)


def checkpoint_trace(text: str) -> Optional[Dict[str, str]]:
    """The W3C trace context a checkpoint carries (None when it carries none)."""
    try:
        trace = json.loads(text).get("trace")
    except (ValueError, AttributeError):
        return None
    if not isinstance(trace, dict):
        return None
    return {k: v for k, v in trace.items() if isinstance(k, str) and isinstance(v, str)} or None


def run_trace(run_id: str) -> Optional[Dict[str, str]]:
    """The trace context a checkpoint of ``run_id`` carries (None without OpenTelemetry)."""
    carrier = propagation()
    if carrier is None:
        return None
    try:
        found: Optional[Dict[str, str]] = carrier.run_carrier(run_id)
    except Exception:  # tracing never fails a run
        log.debug("run %s: no trace context for its checkpoint", run_id, exc_info=True)
        return None
    return found


def checkpointer(
    loop: BareLoop, writer: EventWriter, steer_base: int, host: Optional[WorkerHost], handed: threading.Event,
    run_id: str = "", settled: Optional[Callable[[int], Tuple[int, List[Steer]]]] = None,
) -> Callable[[Checkpoint], None]:
    """The run's checkpoint sink (its thread): queue the state; hand back if draining.

    ``settled`` maps the count of the run's own guidance delivered to the
    count of steers, from ``steer_base`` on, a resume must not feed again,
    and the guidance among them still owed to the leftovers (default: the
    same count and none, when every steer is the run's own).
    """

    def sink(cp: Checkpoint) -> None:
        hand = host is not None and host.draining.is_set() and not handed.is_set()
        trace = run_trace(run_id) if run_id else None
        done, kept = (writer.delivered, []) if settled is None else settled(writer.delivered)
        text = checkpoint_to_json(cp, steer_base + done, clean=hand, trace=trace, kept=kept)
        # Write-ahead for at-most-once: the model's calls are durable before any
        # of them starts, or a crash now would ask (and run) them again.
        written = writer.checkpoint(text, confirm=cp.after == "model" and not hand)
        if written is not None and not written.wait(writer.confirm_timeout):
            log.warning("checkpoint not confirmed within %.1fs; the tools run anyway", writer.confirm_timeout)
        if writer.lost:
            loop.cancel("worker lost: the run's heartbeat lapsed")  # before any tool starts
            return
        if hand:
            writer.seal()  # nothing after this boundary reaches the stream
            handed.set()
            # On this thread, before the run's next step: no tool starts after the checkpoint.
            loop.cancel(HANDED_BACK)

    return sink


def wait_or_drain(handle: RunHandle, writer: EventWriter, host: WorkerHost, handed: threading.Event) -> None:
    """Wait for the run; on a warm shutdown, stop it at a boundary (or at the drain deadline)."""
    deadline: Optional[float] = None
    while not handle.wait(0.05):
        if not host.draining.is_set():
            continue
        now = time.monotonic()
        if deadline is None:
            deadline = now + host.drain_timeout
        if not handed.is_set() and now >= deadline:
            writer.seal()  # no boundary in time: back from the last committed checkpoint
            handed.set()
        if handed.is_set():
            handle.cancel(HANDED_BACK)
            handle.wait()
            return


def hand_back(
    backend: RedisBackend, run_id: str, token: str, writer: EventWriter, host: Optional[WorkerHost]
) -> str:
    if writer.lost:
        return "lost"
    try:
        got = backend.handback(run_id, token, HANDED_BACK)
    except RegistryUnavailable as exc:  # the heartbeat lapses: it is resumed as lost
        log.warning("run %s: could not hand the run back: %s", run_id, exc)
        return "lost"
    if got == 1 and host is not None:
        try:
            host.kick()
        except Exception:  # the sweepers send it within their interval
            log.warning("run %s: could not resend the handed-back run at once", run_id, exc_info=True)
    return {0: "lost", 1: "handed back", 2: "cancelled", 3: "failed"}.get(got, "lost")


__all__ = [
    "HANDED_BACK",
    "Saved",
    "WorkerHost",
    "checkpoint_from_json",
    "checkpoint_to_json",
    "checkpoint_trace",
    "checkpointer",
    "hand_back",
    "run_trace",
    "wait_or_drain",
]
