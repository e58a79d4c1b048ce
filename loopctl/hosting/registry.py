"""RunRegistry: many runs in one process, steered, cancelled and watched by id.

In a web app the request that starts a run is not the one that steers it,
cancels it or streams its progress. The registry owns the table of runs
keyed by ``Run.id`` and keeps these rules:

- A run is known before its body can emit anything: its entry (with the
  event buffer the run's tap writes into) exists before ``loop.start``, and
  the id is published, complete, before ``start`` returns. An id looked up
  earlier is unknown (``KeyError``); no event is ever missed.
- The tap runs on the run's thread and only appends to a bounded deque and
  notifies a ``Condition``: a slow or absent consumer never slows the run.
  Events are turned into dicts by the consumer, not by the run.
- Steering is per loop, so the registry takes the sealed leftovers in the
  tap on ``run_end`` (after the slot sealed them, before the loop can start
  another run) and keeps them with the run. ``steer`` checks "still
  running" and pushes under the registry lock, and a new run on a loop is
  started only under that lock, so an accepted steer always belongs to the
  run it named: it is delivered, or it is that run's leftover.
- No thread of its own: finished runs are pruned on access. Lookups by id
  do not wait behind a ``start`` in progress (they prune only when the lock
  is free and read the table atomically).
- A run id is a name, not an authorisation. A run started with ``owner=``
  is found by the by-id methods only when they are given the same owner;
  to anyone else it is an unknown id (``KeyError``), so ids cannot be probed.
  ``list`` keeps the same rule: it shows only the given owner's runs
  (``owner=None``: only runs started without one); every owner's runs only
  when asked for explicitly with ``all_owners=True``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
import weakref
from collections.abc import Hashable, Iterator
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, Union

from loopctl.checks import integer, shown
from loopctl.config import RunConfig
from loopctl.driver.subagent_path import check_path
from loopctl.errors import ConfigError, LoopBusy, LoopError
from loopctl.hosting.conversations import ConversationLoops
from loopctl.hosting.entry import RunStatus, _Entry, _status, join_run_threads, same_owner
from loopctl.hosting.following import follow_entry
from loopctl.hosting.registry_approvals import RegistryApprovals
from loopctl.hosting.retirement import FinishedRuns
from loopctl.hosting.session_attach import run_on_session, session_for_start
from loopctl.messages import Message
from loopctl.records import Run
from loopctl.sessions.base import wait_for_handback

if TYPE_CHECKING:
    from loopctl.driver.loop import BareLoop

log = logging.getLogger("loopctl")

#: How long ``close(timeout=None)`` waits, in all, for the threads of runs a
#: cancel took over (their body was blocked in a call that may ignore the
#: cancel): such a call may never return.
TAKEN_OVER_GRACE_S = 2.0


class RunRegistry(RegistryApprovals):
    """Runs started in one process, addressed by id from any thread.

    Args:
        max_active: runs allowed in flight at once; ``start`` past it raises
            ``LoopBusy``.
        keep_finished_s: seconds a finished run stays queryable (pruned on
            the next access after that).
        event_buffer: events kept per run; a consumer that falls further
            behind gets one ``gap`` event and continues.
        clock: monotonic seconds, for pruning (injectable for tests).
        session_store: where ``start(..., session_id=...)`` keeps
            conversations (a ``loopctl.sessions`` store), so they outlive
            the process.

    Raises:
        ConfigError: a bad argument (the message names it and its value).
    """

    def __init__(
        self,
        max_active: int = 64,
        keep_finished_s: float = 600,
        event_buffer: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
        session_store: object = None,
    ) -> None:
        if session_store is not None and not hasattr(session_store, "session"):
            raise ConfigError(f"RunRegistry.session_store must be a session store, got {shown(session_store)}")
        self.session_store = session_store
        self._max_active = integer(max_active, "RunRegistry.max_active", 1)
        self._event_buffer = integer(event_buffer, "RunRegistry.event_buffer", 1)
        self._retired = FinishedRuns(keep_finished_s, clock)
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: Dict[str, _Entry] = {}
        self._live: Dict[str, _Entry] = {}
        self._last_on_loop: weakref.WeakKeyDictionary[Any, _Entry] = weakref.WeakKeyDictionary()
        self._conversations = ConversationLoops(self._lock)
        self._closed = False

    # -- starting ----------------------------------------------------------------

    def start(
        self,
        loop: BareLoop,
        input: str,
        config: Optional[RunConfig] = None,
        run_id: Optional[str] = None,
        *,
        owner: Optional[Hashable] = None,
        output_type: object = None,
        session_id: Optional[str] = None,
    ) -> str:
        """Start a run of ``loop`` on its worker thread and register it.

        Args:
            loop: the loop to run (one run at a time per loop).
            input: the user's input.
            config: the run's configuration.
            run_id: the id to use (default: a fresh uuid hex).
            owner: who may address the run (e.g. a web session's user id).
                The by-id methods find an owned run only when passed the
                same ``owner``; for anyone else it is an unknown id.
            output_type: ask for a typed answer (as ``BareLoop.start``).
            session_id: continue the stored conversation of that id (in
                ``session_store``; the session belongs to ``owner``): the
                registry attaches it to ``loop``, which loads it at its
                first run and writes each completed run to it. A start
                that raises leaves ``loop`` without it.

        Returns:
            The run's id (its ``Run.id``).

        Raises:
            LoopBusy: ``max_active`` runs are in flight, or ``loop`` is busy.
            SessionBusy: a run elsewhere (any process) holds the session.
            KeyError: the session belongs to another owner.
            ConfigError: ``session_id`` without a ``session_store``, or a
                loop that keeps another session.
            LoopError: the registry is closed, or ``run_id`` is already registered.
        """
        rid = uuid.uuid4().hex if run_id is None else run_id
        if not isinstance(rid, str) or not rid:
            raise ConfigError(f"run_id must be a non-empty str, got {shown(run_id)}")
        session = None if session_id is None else session_for_start(self.session_store, session_id, owner)
        # Before the registry's lock, which every caller shares: the wait is the store's.
        wait_for_handback(session if session is not None else loop.stored_session)
        with self._lock:
            self._prune_locked()
            self._admit_locked(rid, loop)
            entry = _Entry(rid, loop, self._event_buffer, self._retired.ending, self._clock)
            entry.owner = owner
            # The loop takes the session only as part of a start that succeeds.
            entry.handle = loop.start(input, config, rid, tap=entry.tap, output_type=output_type, session=session)
            self._entries[rid] = entry
            self._live[rid] = entry
            self._last_on_loop[loop] = entry
        return rid

    def _admit_locked(self, rid: str, loop: BareLoop) -> None:
        """Refuse a start the registry cannot take; let the loop's previous run finish its tail."""
        if self._closed:
            raise LoopError("this RunRegistry is closed; no new runs")
        if rid in self._entries:
            raise LoopError(f"run id {rid!r} is already registered")
        if len(self._live) >= self._max_active:
            self._live = {k: e for k, e in self._live.items() if not e.ended}
            if len(self._live) >= self._max_active:
                raise LoopBusy(
                    f"RunRegistry max_active={self._max_active} runs are already in flight; "
                    "run not started"
                )
        prev = self._last_on_loop.get(loop)
        if (
            prev is not None
            and prev.handle is not None
            and not prev.handle.done()
            and (prev.ended or not loop.is_running)
        ):
            # The previous run emitted run_end and is in finalize's tail:
            # let it finish, so a follow-up started by a client that saw
            # run_end is not refused, and its cleanup cannot touch this run.
            prev.handle.wait(5.0)

    def loop_for(self, key: Hashable, factory: Callable[[], BareLoop]) -> BareLoop:
        """The conversation's loop: ``factory()`` makes it on first use, once.

        Follow-up messages of a conversation go to the same loop, so they
        continue its history; ``start`` on it while its run is in flight
        raises ``LoopBusy`` (a web handler's 409). Loops made here are
        closed by ``close()``.

        Raises:
            LoopError: the registry is closed.
        """
        return self._conversations.loop_for(key, factory)

    # -- driving a run -------------------------------------------------------------

    def steer(
        self,
        run_id: str,
        message: Union[Message, str],
        *,
        owner: Optional[Hashable] = None,
        to: Optional[str] = None,
    ) -> bool:
        """Offer guidance to the run; False once it has ended.

        An accepted message is delivered at the run's next turn boundary or,
        if the run ends first, returned by ``leftovers(run_id)``. With ``to``
        (a sub-agent's name, or a path like ``"research/search"``) it goes
        to that sub-agent's run in flight instead; False when there is none.

        Raises:
            KeyError: unknown ``run_id``, or another ``owner``'s run.
            ConfigError: (a ``ValueError``) ``to`` is not a non-empty str of
                "/"-separated names.
        """
        with self._lock:
            self._prune_locked()
            entry = self._lookup(run_id, owner)  # an unknown id is a KeyError before a bad path is a ConfigError
            if to is not None:
                check_path(to)  # ended or not: a bad path is the caller's error either way
            loop = entry.loop
            if entry.ended or loop is None:
                return False
            if to is not None:
                handle = entry.handle
                return handle is not None and handle.steer_subagent(to, message)
            # Under the lock no new run can start on this loop, so the open
            # slot (if any) is this run's.
            return loop.steering().push(message)

    def cancel(
        self, run_id: str, reason: Optional[str] = None, *, owner: Optional[Hashable] = None
    ) -> bool:
        """Cancel the run (only that run); False if it has already ended.

        Raises:
            KeyError: unknown ``run_id``, or another ``owner``'s run.
        """
        entry = self._get(run_id, owner)
        handle = entry.handle
        if handle is None or entry.ended or handle.done():
            return False
        return handle.cancel(reason)

    # -- looking at runs -------------------------------------------------------------

    def status(self, run_id: str, *, owner: Optional[Hashable] = None) -> RunStatus:
        """A snapshot of the run.

        Raises:
            KeyError: unknown ``run_id``, or another ``owner``'s run.
        """
        return _status(self._get(run_id, owner))

    def result(
        self, run_id: str, timeout: Optional[float] = None, *, owner: Optional[Hashable] = None
    ) -> Run:
        """The finished ``Run`` (as ``RunHandle.result``).

        Raises:
            KeyError: unknown ``run_id``, or another ``owner``'s run.
            LoopError: the run's error (``Cancelled`` for a cancelled run).
            TimeoutError: not finished within ``timeout`` seconds.
        """
        entry = self._get(run_id, owner)
        handle = entry.handle
        if handle is not None:
            return handle.result(timeout)
        final = entry.final
        assert final is not None
        if final.error is not None:
            raise final.error
        return final.run

    def leftovers(self, run_id: str, *, owner: Optional[Hashable] = None) -> List[Message]:
        """The run's guidance that was accepted but never delivered (a copy).

        Empty while the run is in flight; sealed, in push order, once it ended.

        Raises:
            KeyError: unknown ``run_id``, or another ``owner``'s run.
        """
        return list(self._get(run_id, owner).leftovers)

    def queued(self, run_id: str, *, owner: Optional[Hashable] = None) -> Tuple[int, List[Message]]:
        """``(seq, messages)``: the run's guidance accepted and not delivered yet (a copy, in push order).

        ``seq`` is the run's last event when it was read: each message is
        delivered in a ``steering`` event after it, or is a leftover if the
        run ends first. A reattaching page shows them once it has replayed
        ``events`` up to ``seq``. Empty once the run ended (see ``leftovers``).

        Raises:
            KeyError: unknown ``run_id``, or another ``owner``'s run.
        """
        with self._lock:  # no new run can start on the loop and take its slot
            self._prune_locked()
            return self._lookup(run_id, owner).queued()

    def run_on_session(self, session_id: str, *, owner: Optional[Hashable] = None) -> Optional[str]:
        """The id of ``owner``'s run in flight on the stored session, or None.

        A reloaded page finds the run to follow again (``events(run_id,
        after=...)``) from the session it shows.
        """
        with self._lock:
            entries = [*self._live.values()]
        return run_on_session(entries, session_id, owner)

    def list(self, *, owner: Optional[Hashable] = None, all_owners: bool = False) -> List[RunStatus]:
        """Status of the caller's known runs, oldest first.

        Args:
            owner: whose runs to list: exactly the runs started with this
                ``owner`` (the by-id methods' rule). None lists only the runs
                started without an owner, never anyone else's.
            all_owners: list every owner's runs (an operator's view; never
                derive it from a request).

        Raises:
            TypeError: ``all_owners`` is not a bool.
        """
        if not isinstance(all_owners, bool):
            raise TypeError(f"all_owners must be a bool, got {type(all_owners).__name__}")
        with self._lock:
            self._prune_locked()
            entries = [e for e in self._entries.values() if all_owners or same_owner(e.owner, owner)]
        return [_status(e) for e in entries]

    def events(
        self,
        run_id: str,
        after: int = 0,
        timeout: Optional[float] = None,
        *,
        owner: Optional[Hashable] = None,
    ) -> Iterator[Tuple[int, Dict[str, Any]]]:
        """Follow the run's events: ``(seq, event_dict)`` with ``seq > after``.

        Sequence numbers start at 1. The iterator waits for new events and
        ends once ``run_end`` has been yielded. A consumer that fell behind
        the buffer first gets ``(first_kept - 1, {"type": "gap", "dropped": n,
        ...})``. ``timeout`` bounds the wait for each next event; when it
        passes the iterator ends, and the caller may resume with ``after=``.

        Raises:
            KeyError: unknown ``run_id``, or another ``owner``'s run (at once,
                not on first ``next``).
        """
        return follow_entry(self._get(run_id, owner), max(0, int(after)), timeout)

    # -- housekeeping ----------------------------------------------------------------

    def close(self, timeout: Optional[float] = 10.0) -> None:
        """Cancel every running run, wait for them, close ``loop_for`` loops.

        Waits up to ``timeout`` seconds in all (None: no bound) for the runs
        to finish and their threads to exit; a thread stuck in a tool that
        ignores its cancel signal is left behind (with no bound, after
        ``TAKEN_OVER_GRACE_S`` for all such threads together). Idempotent;
        ``start`` and ``loop_for`` raise afterwards, queries keep working.
        """
        with self._lock:
            self._closed = True
            entries = [*self._entries.values()]
            loops = self._conversations.close_locked()
        handles = [h for h in (e.handle for e in entries) if h is not None]
        for h in handles:
            if not h.done():
                h.cancel("registry closed")
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> Optional[float]:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        for h in handles:
            h.wait(left())
        for loop in loops:
            loop.close()
        if timeout is not None:
            join_run_threads(handles, left)
            return
        # A body a cancel took over may be stuck in a call that never returns:
        # an unbounded close() gives such bodies a bounded grace, together,
        # counted from the first of them it waits for.
        grace_end: list[float] = []

        def grace() -> float:
            if not grace_end:
                grace_end.append(time.monotonic() + TAKEN_OVER_GRACE_S)
            return max(0.0, grace_end[0] - time.monotonic())

        join_run_threads(handles, left, grace)

    def __enter__(self) -> RunRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RunRegistry runs={len(self._entries)} max_active={self._max_active}>"

    def _get(self, run_id: str, owner: Optional[Hashable] = None) -> _Entry:
        # Lookups never wait behind a start (which holds the lock while the
        # loop spawns its thread): prune only if the lock is free right now,
        # then read the dict (a single atomic get).
        if self._lock.acquire(blocking=False):
            try:
                self._prune_locked()
            finally:
                self._lock.release()
        return self._lookup(run_id, owner)

    def _lookup(self, run_id: str, owner: Optional[Hashable] = None) -> _Entry:
        entry = self._entries.get(run_id)
        # Another owner's run answers exactly as an unknown id does.
        if entry is None or not same_owner(entry.owner, owner):
            raise KeyError(f"unknown run id {run_id!r}")
        return entry

    def _prune_locked(self) -> None:
        self._retired.prune(self._entries, self._live)


__all__ = ["RunRegistry", "RunStatus"]
