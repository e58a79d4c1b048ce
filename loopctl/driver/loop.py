"""BareLoop: the blocking driver (the hands) over the sans-IO machine (the brain).

``BareLoop`` keeps the configuration, the machine and its history, and the
signals (``LoopSetup``); each run gets its own ``RunDriver`` (``run.py``)
that owns the run's state and does the work. The run's body always
executes on its own named thread; ``run()`` waits on it (with the caller's
contextvars copied in) and ``start()`` returns a ``RunHandle``. On cancel,
whoever waits takes the run over at once (see ``handle.py``), so ``run()``
returns within the cancel bound even while a tool, a model call or user
code (an observer, a hook) is stuck. Every exit goes through ``finalize``.
"""

from __future__ import annotations

import contextvars
import threading
import uuid
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Callable, Optional, Union

from loopctl.config import RunConfig, SessionConfig
from loopctl.driver.builder import LoopSetup
from loopctl.driver.checkpoint import Checkpoint, DurableRun, ResumePoint
from loopctl.driver.emission import RunEvents
from loopctl.driver.handle import CURRENT_RUN, RunContext, RunHandle
from loopctl.driver.run import RunDriver
from loopctl.driver.run_state import run_config
from loopctl.driver.run_thread import RunThread
from loopctl.driver.session_link import SessionLink, link_for_start, new_link
from loopctl.driver.signals import RunSteering
from loopctl.driver.subagent import SubagentTool
from loopctl.driver.subagent_runs import may_start
from loopctl.errors import Cancelled, LoopBusy, LoopError, MaxTurnsExceeded
from loopctl.events import Event
from loopctl.machine import Completed, Failed, MaxTurnsReached
from loopctl.messages import Message
from loopctl.output.answers import answer_check
from loopctl.output.check import OutputCheck
from loopctl.providers.base import ModelClient
from loopctl.records import Run
from loopctl.sessions.base import Session, wait_for_handback
from loopctl.tools.base import Tool
from loopctl.tools.registry import ToolRegistry


class BareLoop(LoopSetup):
    """Runs an agent: asks the machine what is next, does it, reports back.

    Args:
        client: a model client (``complete``/``stream``; see ``ModelClient``).
        tools: a ``ToolRegistry`` or an iterable of tools.
        config: the session configuration.
    """

    @classmethod
    def from_history(
        cls,
        client: ModelClient,
        tools: Union[ToolRegistry, Iterable[Tool]] = (),
        config: SessionConfig = SessionConfig(),
        history: Iterable[Message] = (),
    ) -> BareLoop:
        """A loop that resumes a conversation from stored messages."""
        return cls(client, tools, config, history=history)

    _link: Optional[SessionLink] = None

    def with_session(
        self, session: Session, *, revision: Optional[int] = None, incarnation: Optional[str] = None
    ) -> BareLoop:
        """Keep this loop's conversation in a stored session (``loopctl.sessions``).

        The stored conversation is loaded when the first run starts; each
        completed run's new messages are written atomically as it ends; a
        cancelled or failed run leaves the store as it was. Each run holds
        the session's lease: a run on the same session elsewhere (another
        loop, thread or process) raises ``SessionBusy``. A run on a session
        that cannot be read fails at its start with ``SessionCorrupt`` (its
        ``.run`` the finished record), before any model call.

        Args:
            revision: for a host that built the loop from ``session.read()``
                (``BareLoop.from_history``): the revision it read. The first
                run then reads the store again only if it moved since.
            incarnation: with ``revision``, the incarnation the host read
                (``SessionSnapshot.incarnation``), so a session deleted and
                made again since is read again too.

        Raises:
            ConfigError: called after the first run, or not a session.
        """
        self._configurable("with_session")
        link = new_link(session, "with_session()")
        if revision is not None:
            link.adopt(revision, incarnation)
        self._link = link
        return self

    @property
    def stored_session(self) -> Optional[Session]:
        """The session given to ``with_session`` (None when the conversation lives in memory only)."""
        return None if self._link is None else self._link.session

    # -- running ---------------------------------------------------------------

    def run(
        self,
        input: str,
        config: Optional[RunConfig] = None,
        run_id: Optional[str] = None,
        *,
        output_type: object = None,
    ) -> Run:
        """Run the agent on ``input`` and block until it ends.

        Args:
            output_type: ask for a typed answer (sets ``config.output_type``);
                ``Run.output_value`` is then the validated value.

        Returns:
            The finished ``Run`` record.

        Raises:
            ConfigError: the ``output_type`` is not supported (nothing is sent).
            LoopBusy: a run is already in flight on this loop.
            OutputValidationError: the answer never fit ``output_type``.
            LoopError: the run failed or was cancelled (``.run`` holds the record).
        """
        rc = self._launch(input, config, run_id, waiter=True, output_type=output_type)
        try:
            rc.wake.wait()
            if not rc.done.is_set():
                rc.take_over()  # only a cancel wakes us before the body is done
            rc.done.wait()
        except KeyboardInterrupt:
            self._cancel_run(rc, "interrupted")
            rc.take_over()
            rc.done.wait()
            raise
        error = rc.error
        if error is not None:
            try:
                raise error
            finally:
                del self, rc, error  # this frame joins the traceback: keep no cycle through it
        return rc.run

    def start(
        self,
        input: str,
        config: Optional[RunConfig] = None,
        run_id: Optional[str] = None,
        *,
        tap: Optional[Callable[[Event], None]] = None,
        checkpoint: Optional[Callable[[Checkpoint], None]] = None,
        resume: Optional[ResumePoint] = None,
        output_type: object = None,
        at_end: Optional[Callable[[], Optional[Cancelled]]] = None,
        session: Optional[Session] = None,
    ) -> RunHandle:
        """Start the run on a named worker thread and return its handle.

        Args:
            tap: receives every event of this run (used by ``RunRegistry``).
            checkpoint: receives the run's resumable state at each turn
                boundary, on the run's thread (durable registries; see
                ``loopctl.driver.checkpoint``).
            resume: continue a run from a checkpoint instead of starting it
                (``on_run_resumed`` in place of ``on_run_start``).
            output_type: ask for a typed answer (sets ``config.output_type``).
            at_end: the host's say at the run's ending point (the last moment
                a cancel reaches it): a ``Cancelled`` it returns ends the run
                cancelled; None lets it end (see ``RunDriver.reach_end``).
            session: keep the conversation in this stored session from this
                run on, as ``with_session`` does, but only if the run starts:
                a refused start leaves the loop as it was (used by
                ``RunRegistry``). A loop that keeps it already continues it.

        Raises:
            ConfigError: the ``output_type`` is not supported (nothing is
                sent), or the loop keeps another session.
            LoopBusy: a run is already in flight on this loop.
            SessionBusy, KeyError: the session is held by another run, or
                belongs to another owner (the loop is left as it was).
        """
        rc = self._launch(
            input, config, run_id, waiter=False, tap=tap, checkpoint=checkpoint, resume=resume,
            output_type=output_type, at_end=at_end, session=session,
        )
        return RunHandle(rc, self)

    def _launch(
        self,
        input: str,
        config: Optional[RunConfig],
        run_id: Optional[str],
        waiter: bool,
        tap: Optional[Callable[[Event], None]] = None,
        checkpoint: Optional[Callable[[Checkpoint], None]] = None,
        resume: Optional[ResumePoint] = None,
        output_type: object = None,
        at_end: Optional[Callable[[], Optional[Cancelled]]] = None,
        session: Optional[Session] = None,
    ) -> RunContext:
        config = run_config(input, config, output_type)
        check = answer_check(config, self._parts.client, self._parts.tools.name_set())
        rid = run_id if run_id is not None else uuid.uuid4().hex
        durable = checkpoint is not None or resume is not None
        rc, before = self._admit(Run(id=rid, input=input, config=config), waiter, durable, session)
        rc.lock.acquire()  # the body's fence: released only while it blocks
        steering = self._equip(rc, tap, check, checkpoint, resume)
        rc.driver.at_end = at_end
        self._spawn(rc, steering, before)
        return rc

    def _admit(
        self, run: Run, waiter: bool, durable: bool, session: Optional[Session] = None
    ) -> tuple[RunContext, tuple[Optional[SessionLink], bool]]:
        """The run becomes the loop's run in flight (or ``LoopBusy``/``LoopError``, nothing changed).

        A ``session`` named here becomes the loop's only with the run: a
        start refused at any step (busy, ``SessionBusy``, another owner's
        session) leaves the loop without it. Returns the run and what the
        loop was before it (its session link, whether it had run), for a
        start whose thread cannot start to put back.
        """
        # Before the lock: a lease still being given back makes this wait for the store.
        wait_for_handback(session if session is not None else self.stored_session)
        with self._busy:
            if self._closed:
                raise LoopError("this loop is closed")
            if self._active is not None:
                raise LoopBusy(f"a run ({self._active.run.id}) is already in flight on this loop")
            link = self._link if session is None else link_for_start(self._link, session, self._started)
            if link is not None:
                # Under the busy lock: the lease is taken and the history caught
                # up only when no run is in flight here (SessionBusy: nothing changed).
                # A durable run's lease is named by its run id, so the run,
                # resumed elsewhere after a crash, takes its lapsed lease back.
                link.open(self._machine, run.id if durable else None)
            rc = RunContext(run, self._cancel.view(), waiter)
            before = (self._link, self._started)
            if not may_start(rc):
                # A sub-agent run whose caller was cancelled while this start
                # waited (for the store, say): it never begins, nothing is written.
                if link is not None:
                    link.close()
                raise Cancelled("the calling run was cancelled before this sub-agent run started")
            self._link = link
            self._active = rc
            self._started = True
            self._last_config = run.config
        return rc, before

    def _equip(
        self,
        rc: RunContext,
        tap: Optional[Callable[[Event], None]],
        check: Optional[OutputCheck],
        checkpoint: Optional[Callable[[Checkpoint], None]],
        resume: Optional[ResumePoint],
    ) -> RunSteering:
        """The admitted run's driver, events and steering (nothing runs yet)."""
        events = RunEvents(self._emitter, rc.run.id, tap, rc, self._parts.window())
        steering = RunSteering(self._steering)
        rc.driver = RunDriver(
            rc,
            self._parts,
            self._machine,
            self._meter,
            events,
            self._dispatcher,
            steering,
            self._session,
            self._busy,
            self._cancel,
            self,
            self._resources,
            check,
        )
        if checkpoint is not None:
            rc.driver.durable = DurableRun(checkpoint, self._machine.history_epoch)
        rc.driver.resume_point = resume
        rc.driver.link = self._link
        return steering

    def _spawn(self, rc: RunContext, steering: RunSteering, before: tuple[Optional[SessionLink], bool]) -> None:
        """Start the run's thread; if no thread can start, undo the admission (the loop as ``before``)."""
        ctx = contextvars.copy_context()
        ctx.run(CURRENT_RUN.set, weakref.ref(rc))  # the run's tools (a sub-agent's, say) find their run
        rc.context = ctx
        thread = RunThread(rc, name=f"loopctl-run-{rc.run.id[:12]}")
        rc.thread = thread
        # Listen before the body can run: a run that ends at once must find its
        # listener there to remove. A cancel that already fired calls it now;
        # the takeover then waits on the fence until the body has handled it.
        # The listener is the run's bound method, not a closure made per run;
        # removal compares equal, so a fresh bound method removes it.
        self._cancel.add_listener(rc.on_cancel)
        # Open the steering slot here, not on the run's thread: guidance
        # offered the moment start() has returned is then this run's (it
        # lands at the first boundary), never refused while the thread spins up.
        steering.open()
        try:
            thread.start()
        except RuntimeError:  # "can't start new thread": nothing is running
            steering.close()
            self._cancel.remove_listener(rc.on_cancel)
            if self._link is not None:
                self._link.close()  # the lease goes back: no run holds the session
            rc.lock.release()
            with self._busy:
                self._active = None
                self._link, self._started = before
            raise
        except BaseException:  # e.g. Ctrl-C inside start()'s wait: the body IS running
            self._cancel_run(rc, "interrupted")
            raise

    def _release(self, rc: RunContext, error: Optional[LoopError], keep_cancel: bool) -> None:
        """Finalize's last step: give the session's lease back, re-arm the cancel signal, free the loop.

        ``keep_cancel``: the run is past its ending point and took no cancel,
        so a cancel fired on the signal since is the next run's.
        """
        if self._link is not None:
            # Before the loop is free, so a follow-up run anywhere can take it;
            # a cancelled run's end never waits for the store: its lease's own
            # thread gives it back (and the next acquire here waits for that).
            self._link.close(wait=not isinstance(error, Cancelled))
        self._cancel.remove_listener(rc.on_cancel)  # it holds rc: keep no cycle past the run
        rc.error = error
        with self._busy:
            # Last: one cancel = one cancelled run. The cancel this run took is
            # cleared; one fired on the signal after its ending point, which it
            # could not honour, stays fired for the next run.
            self._cancel.reset(keep_fired=keep_cancel)
            self._active = None
            rc.finished = True

    # -- finalize: the single exit door -----------------------------------------

    def finalize(self, error: Optional[LoopError] = None) -> Run:
        """The ``Loop`` protocol's exit door; every run leaves through it.

        Called by hand it only reports: it returns the last finished ``Run``.

        Raises:
            LoopBusy: a run is in flight (its own thread finalizes it).
            LoopError: no run has happened yet.
        """
        if self._active is not None:
            raise LoopBusy("finalize() is called by the run itself")
        last = self._session.current_run
        if last is None:
            raise LoopError("no run to finalize")
        return last

    def stop_reason(self) -> Optional[LoopError]:
        """Why the last run ended: ``Cancelled`` while the signal is fired, else its error."""
        if self._cancel.is_cancelled():
            return Cancelled(self._cancel.reason)
        last = self._session.current_run
        if last is not None and last.end is not None:
            return last.stop_reason
        outcome = self._machine.outcome
        if outcome is None or type(outcome) is Completed:
            return None
        if type(outcome) is MaxTurnsReached:
            return MaxTurnsExceeded((self._last_config or RunConfig()).max_turns)
        if type(outcome) is Failed:
            return outcome.error
        return Cancelled(self._cancel.reason)

    # -- delegation ------------------------------------------------------------------

    def as_tool(
        self,
        name: str,
        description: str,
        *,
        keep_history: bool = False,
        config: Optional[RunConfig] = None,
        output_type: object = None,
    ) -> SubagentTool:
        """This loop as a sub-agent: a ``Tool`` whose one argument is ``task`` (str).

        A call runs this loop on ``task`` while the calling tool's thread
        waits, and returns the run's final output (a typed run's value as
        JSON). The calling run's cancel reaches this run and every run it
        delegates to; its events, approvals and usage show in the calling
        run's. A run that ends on its own account (its own cancel, an error,
        max turns, a failed typed answer) is a soft error naming the
        sub-agent and the reason. Calls run one at a time.

        Args:
            name: the tool's name (also the sub-agent's name in paths).
            description: what the model is told the sub-agent does.
            keep_history: keep the conversation across calls (default: a
                fresh conversation per call). A loop kept in a session
                (``with_session``) continues its stored conversation: it
                needs ``keep_history=True``.
            config: the ``RunConfig`` of each delegated run.
            output_type: ask each delegated run for a typed answer.

        Raises:
            ConfigError: a bad name or description, a loop kept in a session
                without ``keep_history``, or a run is in flight on this loop
                (its observers are fixed while it runs).
        """
        return SubagentTool(self, name, description, keep_history, config, output_type)

    # -- lifecycle -------------------------------------------------------------------

    @property
    def temp_dir(self) -> Optional[Path]:
        """The managed temp dir's path (None when disabled); made on first tool use."""
        return self._resources.temp_path

    def close(self) -> None:
        """Cancel a run in flight, shut the tool executor, remove the temp dir.

        Idempotent; returns promptly even if a tool is stuck.
        """
        with self._busy:
            self._closed = True
            active = self._active
        if active is not None:
            self._cancel_run(active, "loop closed")
            if threading.current_thread() is not active.thread:
                active.done.wait(5.0)
        self._resources.close()

    def __enter__(self) -> BareLoop:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<BareLoop session={self._session.id[:8]} model={self._parts.model_name()!r}>"


__all__ = ["BareLoop"]
