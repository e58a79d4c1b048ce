"""A run's fence, its wake-up, and ``RunHandle``.

The run's body holds ``RunContext.lock`` for everything it does except the
blocking work (a model call, a stream read, a tool batch, a backoff). On
cancel the waiter (the caller of ``run()``, or a short-lived cancel thread
for ``start()``) takes the lock, which is free exactly when the body is
blocked, marks the run abandoned, and finalizes it itself. The body, when
its blocking call returns, re-takes the lock, sees it was abandoned, and
leaves without touching state or emitting anything (the generation fence).

A run's threads are its own to name: the body's (``RunContext.thread``) and
a cancel's takeover (noted in ``_TAKEOVERS`` before it starts). A host that
joins them (``run_threads``) never looks them up by name, so it never meets
another run's thread, nor one whose start is still in progress.
"""

from __future__ import annotations

import contextvars
import threading
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Optional, Protocol, Union

from loopctl.approvals import PendingApproval
from loopctl.approvals.slot import ApprovalSlot
from loopctl.cancel import CancelSignal, Flag
from loopctl.driver.subagent_path import check_path
from loopctl.errors import LoopError
from loopctl.records import Run
from loopctl.timeouts import bounded

if TYPE_CHECKING:
    from loopctl.messages import Message

#: The run whose body (or tool call) executes in this context: set in each
#: run's copied context, so a tool reaches the run that called it. A weak
#: reference: the run keeps its context, and must stay free of cycles.
CURRENT_RUN: contextvars.ContextVar[Optional[weakref.ref[RunContext]]] = contextvars.ContextVar(
    "loopctl_current_run", default=None
)


#: Orders a cancel's takeover being noted with a host reading it (cancel paths only): either
#: the host sees the takeover, or the takeover sees the run finished and never starts.
_takeovers = threading.Lock()
#: A started run's cancel takeover: its thread, and a flag set once its start has returned.
#: Kept beside the run, not on it: only a cancelled run has one (guarded by ``_takeovers``).
_TAKEOVERS: weakref.WeakKeyDictionary[RunContext, tuple[threading.Thread, Flag]] = weakref.WeakKeyDictionary()


def current_run() -> Optional[RunContext]:
    """The run this thread works for (its body, or one of its tool calls), if any."""
    ref = CURRENT_RUN.get()
    return None if ref is None else ref()


class Abandoned(BaseException):
    """Raised inside an abandoned body to unwind it silently."""


class RunContext:
    """One run's shared state between its body and its waiter.

    Thousands of runs may be in flight, and the cyclic collector walks every
    object each one holds: so the run's flags are ``Flag``s (one object each,
    not an Event's six), its cancel listener is its own bound method, and it
    is itself the context manager that unfences blocking work.
    """

    __slots__ = (
        "lock",
        "abandoned",
        "finished",
        "ending",
        "done",
        "wake",
        "run",
        "error",
        "cancel",
        "waiter",
        "thread",
        "context",
        "driver",
        "approvals",
        "subagents",
        "__weakref__",
    )

    def __init__(self, run: Run, cancel: CancelSignal, waiter: bool) -> None:
        self.lock = threading.Lock()
        self.abandoned = False
        self.finished = False
        self.ending = False  # the run reached Done or finalize: cancels no longer reach it
        self.done = Flag()  # finalize is done
        self.wake = Flag()  # done, or a cancel for the waiter to act on
        self.run = run
        self.error: Optional[LoopError] = None
        self.cancel = cancel  # the run's view of the loop's CancelSignal
        self.waiter = waiter
        self.thread: Optional[threading.Thread] = None
        self.context: Optional[contextvars.Context] = None
        self.driver: Any = None  # the run's RunDriver (whose module imports this one)
        # The run's approval slot; closed by a cancel or by finalize.
        self.approvals = ApprovalSlot(run, cancel)
        # The sub-agent runs its tool calls have in flight (made on first use).
        self.subagents: Any = None  # a SubagentRuns (whose module imports this one)

    def unfenced(self) -> RunContext:
        """``with rc.unfenced(): blocking()``: the fence is released meanwhile, so the waiter may take over.

        On the way back in, a run the waiter abandoned meanwhile raises
        ``Abandoned`` (without the fence held).
        """
        return self

    def __enter__(self) -> None:
        self.lock.release()

    def __exit__(self, et: object, ev: object, tb: object) -> Literal[False]:
        self.refence()
        return False

    def refence(self) -> None:
        """Take the fence back after ``self.lock.release()``; a run abandoned meanwhile raises ``Abandoned``.

        ``unfenced()`` spelled out, for the per-event read of a model stream:
        no context-manager calls, and no bound ``__exit__`` held while it waits.
        """
        self.lock.acquire()
        if self.abandoned:
            self.lock.release()
            raise Abandoned

    def on_cancel(self) -> None:
        """The run's listener on the loop's cancel signal (on the cancelling thread).

        Closes the model call in flight and wakes the waiter; a started run
        (no waiter) is finalized on a short-lived thread of its own.
        """
        driver = self.driver  # None once the run's work has ended
        close = None if driver is None else getattr(driver.model_call, "close", None)
        if close is not None:  # a call published after this read sees the flag itself
            close()
        self.wake.set()
        if not self.waiter and not self.finished:
            self._spawn_takeover()

    def _spawn_takeover(self) -> None:
        """Start the short-lived thread that finalizes a cancelled started run (once per run)."""
        # Finalize in a copy of the run's context, so observers of the
        # cancelled run see the caller's contextvars.
        ctx = self.context.copy() if self.context is not None else contextvars.copy_context()
        thread = threading.Thread(
            target=ctx.run, args=(self.take_over,), name=f"loopctl-run-{self.run.id[:12]}-cancel", daemon=True
        )
        started = Flag()
        with _takeovers:
            if self.finished or self in _TAKEOVERS:
                return
            _TAKEOVERS[self] = (thread, started)  # before it starts: a host joining the run waits for the start
        try:
            thread.start()
        except BaseException:
            # Not started: its target holds this run, which would keep its own weak key alive.
            with _takeovers:
                _TAKEOVERS.pop(self, None)
            raise
        finally:
            started.set()

    def take_over(self) -> None:
        """On cancel: wait for the body to block (or end), then finish the run here."""
        driver = self.driver
        if driver is not None:  # None: the body has already ended the run
            driver.take_over()


class RunCanceller(Protocol):
    """The loop as its run handles see it: it cancels one run, never a later one."""

    def _cancel_run(self, rc: RunContext, reason: Optional[str]) -> bool: ...


class RunHandle:
    """A run on its worker thread (from ``BareLoop.start``).

    ``result()`` gives the ``Run`` or raises the run's ``LoopError``.
    """

    __slots__ = ("_rc", "_loop")

    def __init__(self, rc: RunContext, loop: RunCanceller) -> None:
        self._rc = rc
        self._loop = loop  # the run's loop: its ``_cancel_run(rc, reason)`` cancels only this run

    @property
    def run_id(self) -> str:
        """The run's id (its ``Run.id``)."""
        return self._rc.run.id

    @property
    def record(self) -> Run:
        """The run's audit record (live while the run is in flight)."""
        return self._rc.run

    def done(self) -> bool:
        """True once the run has finished (finalize done)."""
        return self._rc.done.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until the run finishes or ``timeout`` passes; True if finished."""
        return self._rc.done.wait(bounded(timeout))

    def result(self, timeout: Optional[float] = None) -> Run:
        """The finished ``Run``.

        Raises:
            LoopError: the run's error (with ``.run`` set).
            TimeoutError: the run did not finish within ``timeout`` seconds.
        """
        if not self._rc.done.wait(bounded(timeout)):
            raise TimeoutError(f"run {self.run_id} not finished after {timeout}s")
        error = self._rc.error
        if error is not None:
            try:
                raise error
            finally:
                del self, error  # this frame joins the traceback: keep no cycle through it
        return self._rc.run

    def cancel(self, reason: Optional[str] = None) -> bool:
        """Cancel this run; False (and no effect) once it has reached its end.

        It never cancels a later run of the same loop.
        """
        return bool(self._loop._cancel_run(self._rc, reason))

    def pending_approvals(self) -> list[PendingApproval]:
        """The run's tool calls waiting for a person's answer, in request order (any thread).

        Calls its sub-agents' runs parked follow, each with its ``subagent`` path.
        """
        pending = self._rc.approvals.pending()
        subagents = self._rc.subagents
        return pending if subagents is None else pending + subagents.pending_approvals()

    def approve(
        self,
        call_id: str,
        *,
        by: Optional[str] = None,
        arguments: Optional[Mapping[str, Any]] = None,
        subagent: Optional[str] = None,
    ) -> bool:
        """Let a waiting call run (any thread), optionally with edited ``arguments``.

        Args:
            subagent: where the call waits: ``""`` this run, ``"research"``
                (or ``"research/search"``) a sub-agent's run. None: wherever
                ``call_id`` waits, if that is one place only.

        Returns:
            True when this answer was taken; False when the call is not
            waiting there (unknown id, answered already, run ended).

        Raises:
            ValueError: ``arguments`` do not fit the tool's schema (the
                message names the field), or ``call_id`` waits in more than
                one run of the tree and ``subagent`` is None; the call stays
                pending.
        """
        where = self._where_waiting(call_id, subagent)
        if where is None:
            return False
        if not where:
            return self._rc.approvals.approve(call_id, by=by, arguments=arguments)
        subagents = self._rc.subagents
        return subagents is not None and subagents.approve(call_id, where, by=by, arguments=arguments)

    def deny(self, call_id: str, reason: str, *, by: Optional[str] = None, subagent: Optional[str] = None) -> bool:
        """Refuse a waiting call (any thread); the model reads "the user denied this call: <reason>".

        Args:
            subagent: where the call waits, as for ``approve``.

        Returns:
            True when this answer was taken; False when the call is not
            waiting there (unknown id, answered already, run ended).

        Raises:
            ValueError: ``call_id`` waits in more than one run of the tree and
                ``subagent`` is None.
        """
        where = self._where_waiting(call_id, subagent)
        if where is None:
            return False
        if not where:
            return self._rc.approvals.deny(call_id, reason, by=by)
        subagents = self._rc.subagents
        return subagents is not None and subagents.deny(call_id, where, reason, by=by)

    def _where_waiting(self, call_id: str, subagent: Optional[str]) -> Optional[str]:
        """The path of the run whose call ``call_id`` an answer is for (``""``: this run).

        Call ids are unique within one run's turn, not across a tree of
        sub-agents: an id waiting in two runs is never guessed at.
        """
        if subagent is not None:
            return subagent
        places = [p.subagent for p in self.pending_approvals() if p.call_id == call_id]
        if len(places) > 1:
            shown = ", ".join(repr(p) if p else "this run" for p in places)
            raise ValueError(
                f"call id {call_id!r:.80} waits in more than one run ({shown}): pass subagent= to say which"
            )
        return places[0] if places else None

    def steer_subagent(self, to: str, message: Union[Message, str]) -> bool:
        """Offer guidance to the sub-agent run in flight at path ``to`` (any thread).

        ``to`` is a sub-agent's name, or a path (``"research/search"``) for
        one deeper down. The guidance lands at that run's next turn boundary;
        what it never reached comes back with this run's leftovers.

        Returns:
            True if accepted; False when no sub-agent run with that path is
            in flight (or its steering refused the message).

        Raises:
            ConfigError: (a ``ValueError``) ``to`` is not a non-empty str of
                "/"-separated names.
        """
        check_path(to)
        subagents = self._rc.subagents
        return subagents is not None and bool(subagents.steer(to, message))

    def __repr__(self) -> str:
        state = "done" if self.done() else "running"
        return f"<RunHandle {self.run_id} {state}>"


class RunThreads(NamedTuple):
    """A run's threads, for a host to join (``run_threads``).

    Attributes:
        body: the thread its body runs on.
        takeover: the thread a cancel finished it on (None: none).
        taken_over: a cancel finished the run while its body was still
            blocked (in a tool or a callback that ignores its cancel
            signal): the body unwinds silently whenever that call returns,
            maybe never.
    """

    body: Optional[threading.Thread]
    takeover: Optional[threading.Thread]
    taken_over: bool


def run_threads(handle: RunHandle, timeout: Optional[float]) -> RunThreads:
    """The run's threads for a host to join, found through the run, never by name.

    Called once the run is done, it names every thread the run will ever
    have: a takeover spawned for it is noted before it starts (its start,
    maybe in progress on the cancelling thread, is waited for up to
    ``timeout``), and none is spawned for a finished run. A takeover whose
    start failed, or is still in progress after ``timeout``, is None.
    """
    rc = handle._rc
    with _takeovers:
        takeover = _TAKEOVERS.get(rc)
    thread: Optional[threading.Thread] = None
    if takeover is not None and takeover[1].wait(timeout) and takeover[0].ident is not None:
        thread = takeover[0]
    return RunThreads(rc.thread, thread, rc.abandoned)


__all__ = ["CURRENT_RUN", "current_run", "Abandoned", "RunContext", "RunHandle", "RunThreads", "run_threads"]
