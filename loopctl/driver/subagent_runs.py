"""A run's sub-agent runs in flight: their approvals, guidance, usage and end.

``SubagentRuns`` hangs on the calling run's ``RunContext`` (made on first
use); the sub-agent tool notes each run there before it starts, and the
calling run's cancel reaches it from then on (``SubagentRun.stop``): a run
the loop has admitted is cancelled; a start not admitted yet (waiting, say,
for its session's store) is abandoned at once, without waiting for it, and
the loop's admission refuses it when it gets there (``may_start``), so nothing
of it runs after the cancel. Any thread
may list and answer the runs' parked approvals or steer one of them by
path. A sub-agent run settles with its caller as soon as its steering slot
is sealed (``hand_over``, in its ``finalize``): its usage goes into the
calling run's record and its undelivered guidance back, exactly once. A
cancelled calling run's ``finalize`` calls ``settle``: it waits (bounded)
for each run to settle and briefly for its end, never for the user code a
sub-agent's own end may run (its observers, its session's write).
"""

from __future__ import annotations

import contextvars
import threading
import time
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional, Union

import attrs

from loopctl.cancel import Flag
from loopctl.driver.handle import RunContext, RunHandle
from loopctl.driver.subagent_path import join_path
from loopctl.messages import Message, Usage

if TYPE_CHECKING:
    from loopctl.approvals import PendingApproval
    from loopctl.driver.builder import LoopSetup
    from loopctl.driver.signals import RunSteering
    from loopctl.records import Run

#: How long a cancelled run's finalize waits for its sub-agent runs to settle (seconds).
SETTLE_S = 1.0
#: How long it then waits, in all, for settled runs to end: their last steps
#: are the loop's own, unless user code there blocks (seconds).
END_PATIENCE_S = 0.05
_lock = threading.Lock()  # guards a run's SubagentRuns creation, settling and usage sums

# The sub-agent run being started, as its tool noted it: set on the calling
# thread around the start, so the run's context (a copy) carries it to its
# finalize. Weakly: the noted run holds the handle, which holds that context.
SUBAGENT_ENTRY: contextvars.ContextVar[Optional[weakref.ref[SubagentRun]]] = contextvars.ContextVar(
    "loopctl_subagent_entry", default=None
)


class SubagentRun:
    """One sub-agent run in flight under a calling run."""

    __slots__ = (
        "name", "loop", "run_id", "handle", "record", "steering", "claimed", "settled", "owner", "admitted",
        "abandoned", "__weakref__",
    )

    def __init__(
        self,
        name: str,
        loop: LoopSetup,
        run_id: str,
        record: Optional[Run] = None,
        steering: Optional[RunSteering] = None,
    ) -> None:
        self.name = name
        self.loop = loop
        self.run_id = run_id
        self.handle: Optional[RunHandle] = None  # set once ``start`` has returned
        self.record = record  # the calling run's Run: its sub-agent usage grows here
        self.steering = steering  # the calling run's RunSteering: leftovers come back to it
        self.claimed = False  # settle_once has begun (under _lock: once)
        self.settled = Flag()  # set once settled, or once the call is over without a run to settle
        self.owner: Optional[SubagentRuns] = None  # the calling run's SubagentRuns, once noted there
        self.admitted: Optional[RunContext] = None  # the run, once its loop admitted it (under _lock)
        self.abandoned = False  # the caller was cancelled before that: the start is refused (under _lock)

    def leave(self) -> None:
        """The call is over: forget this run; nothing more will come from it."""
        owner = self.owner
        if owner is not None:
            owner.remove(self)
        self.settled.set()

    def stop(self, reason: str) -> None:
        """The calling run's cancel (on the cancelling thread): cancel the run, or abandon its start.

        A start the loop has not admitted yet may be blocked in user code
        or a store (its session's lease): it is never waited for. It is
        refused at its admission, so there is nothing to settle now.
        """
        with _lock:
            rc = self.admitted
            if rc is None:
                self.abandoned = True
        if rc is None:
            self.settled.set()
        else:
            RunHandle(rc, self.loop).cancel(reason)

    def settle_once(self, run: Run) -> None:
        """The run's slot is sealed: its usage into the caller's record, its leftovers back (once).

        Called by the run's own ``finalize`` (``hand_over``), or, should that
        never get there, by the calling tool once the run has ended.
        """
        with _lock:
            if self.claimed:
                return
            self.claimed = True
        leftovers = self.loop.steering().take_leftovers()
        if self.steering is not None:
            self.steering.hand_back(leftovers)
        if self.record is not None:
            _add_usage(self.record, run.usage)
        self.settled.set()

    def current(self) -> Optional[RunHandle]:
        """The run's handle; before ``start`` returned, one made from the loop's run in flight.

        The run may park an approval (or take guidance) before the starting
        thread is scheduled again: it is reachable from its first instant.
        """
        handle = self.handle
        if handle is not None:
            return handle
        loop = self.loop
        rc = loop._active
        if rc is None or rc.run.id != self.run_id:
            return None
        return RunHandle(rc, loop)


class SubagentRuns:
    """A run's sub-agent runs in flight: their approvals, guidance and end (any thread)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._lock = threading.Lock()
        self._active: list[SubagentRun] = []

    def add(
        self,
        name: str,
        loop: LoopSetup,
        run_id: str,
        record: Optional[Run] = None,
        steering: Optional[RunSteering] = None,
    ) -> SubagentRun:
        """Note a sub-agent run about to start (its handle is set once it has)."""
        active = SubagentRun(name, loop, run_id, record, steering)
        active.owner = self
        with self._lock:
            self._active.append(active)
        return active

    def remove(self, active: SubagentRun) -> None:
        """Forget a sub-agent run whose call has settled."""
        with self._lock:
            if active in self._active:
                self._active.remove(active)

    def _snapshot(self) -> list[tuple[SubagentRun, RunHandle]]:
        with self._lock:
            active = list(self._active)
        out = []
        for a in active:
            handle = a.current()
            if handle is not None:
                out.append((a, handle))
        return out

    def settle(self, timeout: float = SETTLE_S, patience: float = END_PATIENCE_S) -> None:
        """Wait up to ``timeout`` seconds in all for the runs in flight to settle, then ``patience`` for their end.

        A cancel reaches a run in flight at once, so it settles at once; one
        that had already reached its end settled as its slot was sealed. What
        a run does after that may be user code that blocks (an observer of
        its end, its session's write): it is waited for ``patience`` at most.
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            started = list(self._active)
        for active in started:
            if not active.settled.wait(max(deadline - time.monotonic(), 0)):
                return
        deadline = time.monotonic() + patience
        for active in started:
            handle = active.current()
            if handle is not None and not handle.wait(max(deadline - time.monotonic(), 0)):
                return

    def pending_approvals(self) -> list[PendingApproval]:
        """Calls the sub-agent runs have parked, each with its path and this run's id."""
        out = []
        for active, handle in self._snapshot():
            for p in handle.pending_approvals():
                out.append(attrs.evolve(p, run_id=self.run_id, subagent=join_path(active.name, p.subagent)))
        return out

    def approve(
        self, call_id: str, path: str, *, by: Optional[str] = None, arguments: Optional[Mapping[str, Any]] = None
    ) -> bool:
        """Answer the call ``call_id`` parked by the sub-agent run at ``path``; False when it holds none."""
        name, _, rest = path.partition("/")
        return any(
            h.approve(call_id, by=by, arguments=arguments, subagent=rest)
            for a, h in self._snapshot() if a.name == name
        )

    def deny(self, call_id: str, path: str, reason: str, *, by: Optional[str] = None) -> bool:
        """Refuse the call ``call_id`` parked by the sub-agent run at ``path``; False when it holds none."""
        name, _, rest = path.partition("/")
        return any(h.deny(call_id, reason, by=by, subagent=rest) for a, h in self._snapshot() if a.name == name)

    def steer(self, to: str, message: Union[Message, str]) -> bool:
        """Guidance for the sub-agent run at path ``to`` (checked by ``check_path``); False when none is in flight."""
        name, _, rest = to.partition("/")
        for active, handle in self._snapshot():
            if active.name != name or handle.done():
                continue
            if rest:
                return bool(handle.steer_subagent(rest, message))
            return bool(active.loop.steering().push(message))
        return False


def runs_of(rc: RunContext) -> SubagentRuns:
    """``rc``'s ``SubagentRuns``, made on first use."""
    with _lock:
        runs = rc.subagents
        if runs is None:
            runs = rc.subagents = SubagentRuns(rc.run.id)
        return runs  # type: ignore[no-any-return]


def enter(rc: RunContext, name: str, loop: LoopSetup, run_id: str) -> Optional[SubagentRun]:
    """Note a sub-agent run about to start under ``rc``; None once ``rc`` is ending.

    Noted first, ``ending`` read second; ``finalize`` sets ``ending`` first,
    reads the noted runs second: one of the two always sees the other, so a
    run that starts is always one ``finalize`` waits for.
    """
    runs = runs_of(rc)
    driver = rc.driver
    active = runs.add(name, loop, run_id, rc.run, driver.steering if driver is not None else None)
    if rc.ending:
        runs.remove(active)
        return None
    return active


def may_start(rc: RunContext) -> bool:
    """Whether the run being admitted may start: False for a sub-agent run whose caller was cancelled meanwhile.

    Called by the loop's admission (its busy lock held, the session's lease
    taken), on the starting thread. From a True answer on, the caller's
    cancel reaches the run itself.
    """
    ref = SUBAGENT_ENTRY.get()
    active = ref() if ref is not None else None
    if active is None or active.run_id != rc.run.id:
        return True
    with _lock:
        if active.abandoned:
            return False
        active.admitted = rc
    return True


def hand_over(run: Run) -> None:
    """``run``'s slot is sealed and its usage final: if it is a sub-agent run, settle it with its caller now.

    Called from the run's ``finalize`` (in the run's context), before anything
    there that may block.
    """
    ref = SUBAGENT_ENTRY.get()
    active = ref() if ref is not None else None
    if active is not None and active.run_id == run.id:
        active.settle_once(run)


def _add_usage(run: Run, usage: Usage) -> None:
    if usage.input_tokens or usage.output_tokens:
        with _lock:
            sub = run.subagent_usage
            run.subagent_usage = Usage(sub.input_tokens + usage.input_tokens, sub.output_tokens + usage.output_tokens)


__all__ = [
    "END_PATIENCE_S", "SETTLE_S", "SUBAGENT_ENTRY", "SubagentRun", "SubagentRuns", "enter", "hand_over", "may_start", "runs_of",
]
