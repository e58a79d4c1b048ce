"""SessionLink: a loop's tie to its stored conversation (``BareLoop.with_session``).

Each run takes the session's lease before it starts (``open``, under the
loop's busy lock, so a second run anywhere raises ``SessionBusy`` and
nothing changes), writes in ``finalize`` only when it completed (``save``),
and gives the lease back as the loop is freed (``close``): a cancelled run
leaves that to the lease's own thread, so its end never waits for the
store, and the loop's next run (or any run through the same store in this
process) waits for the lease to be given back before it takes the loop's
lock (``sessions.base.wait_for_handback``). The rules:

- The stored conversation is read under the lease at a run's start
  whenever the store moved since this loop last read or wrote it (another
  process continued it, or it was deleted, or deleted and made again: the
  session's incarnation is compared with its revision); otherwise the
  loop's own history stands. A store that is still empty on the first run takes the loop's
  starting history (``from_history``) with the first write.
- A completed run appends its new messages in one atomic write; when the
  history was replaced since the last write (a compaction), the whole
  conversation the loop would send next replaces the stored one instead.
- A cancelled or failed run writes nothing. A write that fails (the store
  is down, or the lease was lost) fails the run, and its messages are
  dropped, so loop and store never disagree.
- A session that cannot be read (``SessionCorrupt``) is no refusal: the
  run starts, with its ``Run`` and its start and end events, and fails at
  once with that error (``unreadable``), before any model call. Only a
  busy session (``SessionBusy``) or another owner's refuses the start.
- A session named at a start (``link_for_start``) becomes the loop's only
  when that start is admitted, its lease taken: a refused start leaves the
  loop as it was.
"""

from __future__ import annotations

import logging
from typing import Optional

from loopctl.checks import shown
from loopctl.errors import ConfigError, LoopError, SessionCorrupt
from loopctl.machine import LoopMachine
from loopctl.sessions.base import Session, SessionLease, SessionSnapshot

log = logging.getLogger("loopctl")


class SessionLink:
    """The session of a loop, the store revision its history matches, and the live lease."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.revision: Optional[int] = None  # the store revision the loop's history matches
        self.incarnation: Optional[str] = None  # ... and the session's incarnation then
        self.any_incarnation = False  # adopted without one: the revision alone is compared, once
        self.epoch = -1  # the machine's history epoch and length at that revision
        self.length = 0
        self.lease: Optional[SessionLease] = None
        # Why the stored conversation could not be read at this run's start:
        # the run takes it and fails with it (open() then returns normally).
        self.unreadable: Optional[SessionCorrupt] = None

    def adopt(self, revision: int, incarnation: Optional[str] = None) -> None:
        """The loop's starting history continues the store at ``revision`` (read by its host).

        The first run then reads the store only if it moved past
        ``revision`` (or, when ``incarnation`` is given, was made again),
        and the first write replaces the stored conversation with the
        loop's (it keeps the rows the two share), so a host that built the
        loop from newer messages (a checkpoint) stores them whole.
        """
        self.revision = revision
        self.incarnation = incarnation
        self.any_incarnation = incarnation is None
        self.epoch = -1

    def _matches(self, snapshot: SessionSnapshot) -> bool:
        """Whether the store still holds the conversation this loop last read or wrote."""
        if snapshot.revision != self.revision:
            return False
        return self.any_incarnation or snapshot.incarnation == self.incarnation

    def open(self, machine: LoopMachine, holder: Optional[str] = None) -> None:
        """Take the lease and catch up with the store (the caller's thread, before the run).

        ``holder`` names the lease (a durable run's id, so the run resumed
        elsewhere takes its own lapsed lease back); None: a fresh name.

        A session that cannot be read is not raised: ``unreadable`` holds its
        ``SessionCorrupt`` (no lease is kept, the history is untouched) for
        the run to fail with.

        Raises:
            SessionBusy: another run holds the session (nothing changed).
        """
        self.unreadable = None
        try:
            lease = self.session.acquire(holder)
        except SessionCorrupt as exc:  # the session's record (its owner, say) cannot be read
            self.unreadable = exc
            return
        try:
            snapshot = self.session.read()  # under the lease: no write can interleave
            if not self._matches(snapshot):
                if snapshot.revision == 0 and self.revision is None:
                    # A new session: the loop's starting history (if any) goes in whole.
                    self.epoch, self.length = (-1, 0) if len(machine.history) else (machine.history_epoch, 0)
                else:
                    machine.load_history(snapshot.messages)
                    self.epoch, self.length = machine.history_epoch, len(snapshot.messages)
                self.revision = snapshot.revision
            self.incarnation, self.any_incarnation = snapshot.incarnation, False
        except SessionCorrupt as exc:  # a stored message cannot be read
            lease.release()
            self.unreadable = exc
            return
        except BaseException:
            lease.release()
            raise
        self.lease = lease

    def save(self, machine: LoopMachine) -> Optional[LoopError]:
        """Write a completed run's messages (before pending is committed); the error if it failed."""
        lease = self.lease
        if lease is None:
            return LoopError("internal error: a session write without its lease")
        history = list(machine.history)
        pending = list(machine.pending)
        try:
            if machine.history_epoch == self.epoch and len(history) == self.length:
                revision = lease.append(pending) if pending else self.revision
            else:
                revision = lease.replace(history + pending)
        except LoopError as exc:
            return exc
        except Exception as exc:  # a store's own bug: the run fails, the loop stays usable
            err = LoopError(f"session store: write failed: {type(exc).__name__}")
            err.__cause__ = exc
            return err
        if revision != self.revision:  # written (every write bumps the revision)
            self.incarnation = lease.incarnation  # made by this write when it created the session
        self.revision = revision
        self.epoch = machine.history_epoch  # commit_pending grows history without a new epoch
        self.length = len(history) + len(pending)
        return None

    def close(self, wait: bool = True) -> None:
        """Give the lease back (idempotent; a store error is logged, the lease then lapses).

        ``wait=False`` (a cancelled run's end, which never waits for the
        store) leaves it to the lease's own thread; the next start on the
        session through the same store waits for it before its locks.
        """
        lease, self.lease = self.lease, None
        if lease is not None:
            try:
                if wait:
                    lease.release()
                else:
                    lease.let_go()
            except Exception:
                log.warning("releasing a session lease failed", exc_info=True)


def new_link(session: Session, what: str) -> SessionLink:
    """A link to ``session``, the one check of what a loop is given to keep (``what`` names the call).

    Raises:
        ConfigError: not a session.
    """
    if not (hasattr(session, "acquire") and hasattr(session, "load")):
        raise ConfigError(f"{what} takes a session (store.session(id)), got {shown(session)}")
    return SessionLink(session)


def link_for_start(current: Optional[SessionLink], session: Session, started: bool) -> SessionLink:
    """The link a start naming ``session`` runs with: the loop's own when it keeps that session, else a new one.

    The caller makes a new link the loop's only once the start is admitted.

    Raises:
        ConfigError: the loop keeps another session, or has already run
            without one.
    """
    if current is None:
        if started:
            raise ConfigError("start(session=...): a loop takes a session only before its first run")
        return new_link(session, "start(session=...)")
    kept = current.session
    if kept.id != session.id or kept.owner != session.owner or kept.store is not session.store:
        raise ConfigError(f"this loop keeps session {kept.id[:80]!r}, not {session.id[:80]!r}")
    return current


__all__ = ["SessionLink", "link_for_start", "new_link"]
