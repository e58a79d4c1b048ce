"""A run's sub-agent runs in flight: their approvals, guidance, usage and end.

``SubagentRuns`` hangs on the calling run's ``RunContext`` (made on first
use); the sub-agent tool notes each run there before it starts. Any thread
may list and answer the runs' parked approvals or steer one of them by
path. A cancelled calling run's ``finalize`` calls ``settle``: it waits
(bounded) for each run's own end, then takes its usage into the calling
run's record and hands its undelivered guidance back, exactly once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional, Union

import attrs

from loopctl.driver.handle import RunContext, RunHandle
from loopctl.driver.subagent_path import join_path
from loopctl.messages import Message, Usage

if TYPE_CHECKING:
    from loopctl.approvals import PendingApproval
    from loopctl.driver.builder import LoopSetup
    from loopctl.driver.signals import RunSteering
    from loopctl.records import Run

#: How long a cancelled run's finalize waits for its sub-agent runs to end (seconds).
SETTLE_S = 1.0
_lock = threading.Lock()  # guards a run's SubagentRuns creation, settling and usage sums


class SubagentRun:
    """One sub-agent run in flight under a calling run."""

    __slots__ = ("name", "loop", "run_id", "handle", "done", "record", "steering", "settled", "owner")

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
        self.done = threading.Event()  # set once the call is over (the tool returns)
        self.record = record  # the calling run's Run: its sub-agent usage grows here
        self.steering = steering  # the calling run's RunSteering: leftovers come back to it
        self.settled = False
        self.owner: Optional[SubagentRuns] = None  # the calling run's SubagentRuns, once noted there

    def leave(self) -> None:
        """The call is over: forget this run (its ``done`` is set)."""
        owner = self.owner
        if owner is not None:
            owner.remove(self)
        else:
            self.done.set()

    def settle_once(self, handle: Optional[RunHandle] = None) -> None:
        """Once the run has ended: its usage into the caller's record, its leftovers back."""
        if handle is None:
            handle = self.handle
        with _lock:
            if self.settled or handle is None or not handle.done():
                return
            self.settled = True
        leftovers = self.loop.steering().take_leftovers()
        if self.steering is not None:
            self.steering.hand_back(leftovers)
        if self.record is not None:
            _add_usage(self.record, handle.record.usage)

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
        active.done.set()

    def _snapshot(self) -> list[tuple[SubagentRun, RunHandle]]:
        with self._lock:
            active = list(self._active)
        out = []
        for a in active:
            handle = a.current()
            if handle is not None:
                out.append((a, handle))
        return out

    def settle(self, timeout: float = SETTLE_S) -> None:
        """Wait up to ``timeout`` seconds in all for the runs in flight to settle."""
        deadline = time.monotonic() + timeout
        with self._lock:
            started = list(self._active)
        for active in started:
            left = deadline - time.monotonic()
            handle = active.current()
            # The run's own end, not the calling tool's return: one wake-up fewer per level.
            ended = handle.wait(left) if handle is not None and left > 0 else active.done.wait(max(left, 0))
            if not ended:
                return
            active.settle_once(handle)

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


def _add_usage(run: Run, usage: Usage) -> None:
    if usage.input_tokens or usage.output_tokens:
        with _lock:
            sub = run.subagent_usage
            run.subagent_usage = Usage(sub.input_tokens + usage.input_tokens, sub.output_tokens + usage.output_tokens)


__all__ = ["SETTLE_S", "SubagentRun", "SubagentRuns", "enter", "runs_of"]
