"""Sessions: a conversation kept in a store, its one writer, its readable rows.

A ``SessionStore`` keeps conversations by id; ``store.session(id)`` names
one (``Session``). The rules every store keeps, whatever holds the data:

- Ids: any non-empty ``str`` of valid Unicode up to ``MAX_ID_CHARS``
  characters (slashes, spaces, emoji: all fine); empty raises
  ``ValueError``, a non-``str`` raises ``TypeError``.
- One writer: every write goes through a ``SessionLease``, taken with
  ``session.acquire()``. A second ``acquire`` while a lease is live, from
  any thread or process, raises ``SessionBusy`` and changes nothing. A
  lease expires ``lease_s`` seconds (60 by default) after it was last
  renewed; a live lease is renewed every third of that on its own thread,
  so only a holder that died (killed, frozen) lets it lapse. A write whose
  lease was lost (expired, then taken) raises ``SessionBusy`` and writes
  nothing.
- Giving back: ``release()`` waits until the session is given up;
  ``let_go()`` leaves that to the lease's own thread (a cancelled run's
  end never waits for the store). Until it is done, an ``acquire`` of the
  same session through the same store waits for it, and so does the
  store's ``close()``; another process may meet ``SessionBusy`` meanwhile.
- Atomic writes: ``append`` adds messages and ``replace`` swaps the whole
  conversation (keeping what it removed in an audit trail) in one
  transaction each; every write bumps the session's ``revision``.
- Incarnations: a session gets an incarnation id when it is created, so a
  session deleted and made again (back at revision 1) is never taken for
  the one a loop read before; a loop compares both.
- Dead holders: a lease names its holder process (``holders``); an
  acquire takes over at once a lease whose holder process on this host is
  gone, and a process releases the leases it holds as it exits.
- Bad data: a message, revision or owner that cannot be read raises
  ``SessionCorrupt`` naming the session (and the message's position);
  other sessions are untouched, and ``list()`` leaves the bad one out,
  logging a warning that names it.
- Stored text is never put into an error message (it may hold secrets).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from loopctl.checks import shown
from loopctl.errors import ConfigError, LoopError, SessionBusy
from loopctl.messages import Message
from loopctl.sessions.backend import SessionBackend
from loopctl.sessions.holders import describe, holder_is_gone, new_token, track, untrack
from loopctl.sessions.stored import (
    SessionInfo,
    SessionSnapshot,
    decode_messages,
    stored_incarnation,
    stored_owner,
    stored_revision,
)
from loopctl.timeouts import required_seconds

log = logging.getLogger("loopctl")

MAX_ID_CHARS = 65_536
DEFAULT_LEASE_S = 60.0


def check_session_id(session_id: object) -> str:
    """``session_id`` if it is a usable id.

    Raises:
        TypeError: not a ``str``.
        ValueError: empty, longer than ``MAX_ID_CHARS``, or not valid Unicode.
    """
    if not isinstance(session_id, str):
        raise TypeError(f"a session id must be a str, got {type(session_id).__name__}")
    if not session_id:
        raise ValueError("a session id must not be empty")
    if len(session_id) > MAX_ID_CHARS:
        raise ValueError(f"a session id must be at most {MAX_ID_CHARS} characters, got {len(session_id)}")
    try:
        session_id.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"a session id must be valid Unicode: {session_id[:40]!r}") from exc
    return session_id


def check_owner(owner: object) -> Optional[str]:
    """``owner`` if it is None or a non-empty ``str`` (else ``ValueError``)."""
    if owner is None:
        return None
    if not isinstance(owner, str) or not owner:
        raise ValueError(f"a session owner must be a non-empty str or None, got {owner!r:.80}")
    check_session_id(owner)
    return owner


def check_lease(lease_s: object, clock: object, store: str) -> float:
    """The lease length, validated with the clock (``ConfigError`` naming ``store``'s bad field)."""
    lease = required_seconds(lease_s, f"{store}.lease_s")
    if not callable(clock):
        raise ConfigError(f"{store}.clock must be callable, got {shown(clock)}")
    return lease


# A Python str may hold lone surrogates (JSON from a browser that cut a string
# inside an emoji decodes to one); they have no UTF-8 form, so a row keeps them
# as JSON escapes, which json.loads turns back into the same characters.
_SURROGATE = re.compile("[\\ud800-\\udfff]")


def _escape_surrogate(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def encode_message(message: Message) -> str:
    """One stored row: the message's dict as compact JSON, always valid UTF-8.

    Text stays as written except lone surrogates, which are kept as ``\\uXXXX``
    escapes (a row without them is byte for byte what it always was).
    """
    if not isinstance(message, Message):
        raise TypeError(f"a session stores Messages, got {type(message).__name__}")
    return _SURROGATE.sub(_escape_surrogate, json.dumps(message.to_dict(), ensure_ascii=False, separators=(",", ":")))


class Handbacks:
    """A store's leases giving their session back on their own thread, in this process (any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: Dict[str, threading.Event] = {}  # session id -> set once given back

    def add(self, session_id: str, given_back: threading.Event) -> None:
        """A lease of ``session_id`` is being given back; ``given_back`` is set once it is."""
        with self._lock:
            if not given_back.is_set():  # its thread may have ended already (the lease was lost)
                self._pending[session_id] = given_back

    def finish(self, session_id: str, given_back: threading.Event) -> None:
        """The lease's thread has ended: it is given back (or was lost)."""
        with self._lock:
            if self._pending.get(session_id) is given_back:
                del self._pending[session_id]
            given_back.set()  # under the lock: ``add`` never notes a lease that is already done

    def wait(self, session_id: Optional[str], timeout: float) -> bool:
        """Wait up to ``timeout`` s in all for the leases of ``session_id`` (every one when None); True once done."""
        deadline = time.monotonic() + timeout
        with self._lock:
            flags = list(self._pending.values()) if session_id is None else [self._pending.get(session_id)]
        for flag in flags:
            if flag is not None and not flag.wait(max(deadline - time.monotonic(), 0.0)):
                return False
        return True


class SessionStore:
    """A place that keeps conversations by session id (base of the concrete stores).

    Args:
        backend: the storage operations.
        lease_s: seconds a writer's lease lasts without renewal (60 by default).
        clock: wall-clock seconds shared by every process (injectable for tests).
    """

    def __init__(self, backend: SessionBackend, lease_s: float, clock: Callable[[], float]) -> None:
        self.lease_s = check_lease(lease_s, clock, type(self).__name__)
        self._clock = clock
        self._backend = backend
        self.handbacks = Handbacks()

    def wait_given_back(self, session_id: Optional[str] = None, timeout: Optional[float] = None) -> bool:
        """Wait until this process's leases of ``session_id`` (of every session when None) are given back.

        A lease let go (``SessionLease.let_go``: a cancelled run's) is given
        back on its own thread just after the run has ended. A host that
        tells another process the run has ended waits for this first, so
        that process never meets the run's lease.

        Args:
            timeout: seconds to wait at most (default: the lease length,
                after which a lease lapses anyway).

        Returns:
            True when none is left being given back.
        """
        return self.handbacks.wait(session_id, self.lease_s if timeout is None else timeout)

    def session(self, session_id: str, *, owner: Optional[str] = None) -> Session:
        """The session named ``session_id`` (created by its first write).

        Args:
            owner: who the session belongs to. A session stored with another
                owner (or none) is, to this ``Session``, an unknown id:
                reading or acquiring it raises ``KeyError``.

        Raises:
            TypeError, ValueError: a bad id or owner.
        """
        return Session(self, check_session_id(session_id), check_owner(owner))

    @property
    def backend(self) -> SessionBackend:
        """The backend this store's sessions and leases read and write through."""
        return self._backend

    def now(self) -> float:
        """The store's clock: leases are timed by it, not by the wall clock."""
        return self._clock()

    def list(self, owner: Optional[str] = None) -> List[SessionInfo]:
        """The stored sessions, most recently written first: ``owner``'s, or all when None."""
        return self._backend.infos(check_owner(owner))

    def delete(self, session_id: str) -> bool:
        """Remove a session and its messages; False when it did not exist.

        Raises:
            SessionBusy: a run holds the session (nothing is removed); a
                lease whose holder process on this host is gone does not.
        """
        sid = check_session_id(session_id)
        gone = self._backend.delete(sid, self._clock(), holder_is_gone)
        if gone is None:
            raise SessionBusy(sid, "a run holds it; not deleted")
        return gone

    def close(self) -> None:
        """Close the store's connections (idempotent), once the leases being given back are."""
        self.wait_given_back()
        self._backend.close()

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Session:
    """One conversation in a store, by id; pass it to ``BareLoop.with_session``.

    Reading never needs the lease; writing goes through ``acquire()``.
    """

    def __init__(self, store: SessionStore, session_id: str, owner: Optional[str]) -> None:
        self.store = store
        self.id = session_id
        self.owner = owner

    def messages(self) -> List[Message]:
        """The stored conversation, in order (empty for a new session).

        Raises:
            SessionCorrupt: a stored message (or the session's record) cannot be read.
            KeyError: the session belongs to another owner.
        """
        return self.read().messages

    def load(self) -> Tuple[int, List[Message]]:
        """(revision, messages) read in one snapshot (see ``read``)."""
        snapshot = self.read()
        return snapshot.revision, snapshot.messages

    def read(self) -> SessionSnapshot:
        """Revision, incarnation and messages, read in one snapshot.

        Raises:
            SessionCorrupt: a stored message, the revision or the owner cannot be read.
            KeyError: the session belongs to another owner.
        """
        stored = self.store.backend.load(self.id)
        if stored is None:
            return SessionSnapshot(0, None, [])
        revision, owner, incarnation, rows = stored
        if stored_owner(self.id, owner) != self.owner:
            raise KeyError(f"unknown session {self.id[:80]!r}")
        return SessionSnapshot(
            stored_revision(self.id, revision), stored_incarnation(self.id, incarnation), decode_messages(self.id, rows)
        )

    def acquire(self, holder: Optional[str] = None) -> SessionLease:
        """Become the session's one writer until ``release()``.

        Args:
            holder: names the lease (default: a fresh token naming this
                process). Acquiring with the holder of a live lease takes it
                over: a run resumed on another machine (same run id) gets its
                session back at once.

        Raises:
            SessionBusy: another live lease holds the session (in any
                process); a lease whose holder process on this host is gone
                is taken over instead.
            KeyError: the session belongs to another owner.
        """
        store = self.store
        token = new_token() if holder is None else check_session_id(holder)
        now = store.now()
        taken: List[str] = []

        def stale(held: str) -> bool:
            gone = holder_is_gone(held)
            if gone:
                taken.append(held)
            return gone

        if not store.backend.acquire(self.id, self.owner, token, now, now + store.lease_s, stale):
            raise SessionBusy(self.id)
        if taken:
            log.warning(
                "session %.80r: took over the lease of %s on this host, which is gone",
                self.id, describe(taken[-1]),
            )
        return SessionLease(self, token)

    def __repr__(self) -> str:
        return f"<Session {self.id[:40]!r}>"


class SessionLease:
    """The right to write one session, renewed on its own thread until released."""

    def __init__(self, session: Session, token: str) -> None:
        self.session = session
        self.token = token
        self.lost = False
        self.incarnation: Optional[str] = None  # the session's, as this lease's last write found it
        self._stop = threading.Event()
        self._given_back = threading.Event()  # set as the lease's thread ends: given back, or lost
        self._thread = threading.Thread(target=self._keep, name=f"loopctl-session-lease-{token[:8]}", daemon=True)
        self._thread.start()
        track(self, self.release)  # released at interpreter exit if still held

    def _keep(self) -> None:
        """The lease's thread: renew until let go, then give the session back (unless the lease was lost)."""
        session = self.session
        store = session.store
        try:
            self._renew(store)
            if not self.lost:
                try:
                    store.backend.release(session.id, self.token)
                except Exception:  # the lease then lapses on its own
                    log.warning("releasing the lease of a session failed; it expires by itself", exc_info=True)
        finally:
            untrack(self)
            store.handbacks.finish(session.id, self._given_back)

    def _renew(self, store: SessionStore) -> None:
        """Renew every third of the lease until ``let_go``, or until the lease is found lost."""
        every = store.lease_s / 3.0
        while not self._stop.wait(every):
            try:
                held = store.backend.renew(self.session.id, self.token, store.now() + store.lease_s)
            except Exception:  # a store hiccup: try again next time, the lease has slack
                log.warning("renewing the lease of a session failed; retrying", exc_info=True)
                continue
            if not held:
                self.lost = True
                return

    def append(self, messages: Sequence[Message]) -> int:
        """Add ``messages`` at the end, atomically; the new revision."""
        return self._write(messages, replace=False)

    def replace(self, messages: Sequence[Message]) -> int:
        """Make ``messages`` the whole conversation, atomically; the new revision.

        The leading rows it shares with the stored ones stay; the rows it
        removes are kept in the store's audit trail.
        """
        return self._write(messages, replace=True)

    def _write(self, messages: Sequence[Message], replace: bool) -> int:
        rows = [encode_message(m) for m in messages]
        session = self.session
        store = session.store
        written = store.backend.write(session.id, session.owner, self.token, store.now(), rows, replace)
        if written is None:
            self.lost = True
            raise SessionBusy(session.id, "this run's lease expired and another run took the session")
        revision, incarnation = written
        self.incarnation = stored_incarnation(session.id, incarnation)
        return revision

    def release(self) -> None:
        """Stop renewing and give the session up, waiting until it is (idempotent; a store error is logged)."""
        self.let_go()
        self._thread.join()  # it gives the session back as it ends

    def let_go(self) -> None:
        """Stop renewing and give the session up on the lease's own thread, without waiting (idempotent).

        Until it is given back, a start on the session through the same
        store waits for it before it takes any lock (``wait_for_handback``).
        """
        if self._stop.is_set():
            return
        self.session.store.handbacks.add(self.session.id, self._given_back)
        self._stop.set()


def wait_for_handback(session: object) -> None:
    """Wait until this process has given back ``session``'s lease let go by a cancelled run (None: nothing to wait for).

    A start calls it before it takes any lock: the wait lasts as long as the
    store takes to answer (at most the lease length), and under a lock it
    would hold every other caller of that lock. Without it, a start right
    after a cancelled run would meet that run's lease (``SessionBusy``).
    """
    wait = getattr(getattr(session, "store", None), "wait_given_back", None)
    if wait is not None:
        wait(getattr(session, "id", None))


def store_error(what: str, exc: BaseException) -> LoopError:
    """A store's foreign failure as a ``LoopError`` naming the operation (not the data)."""
    err = LoopError(f"session store: {what} failed: {type(exc).__name__}: {exc}")
    err.__cause__ = exc
    return err


__all__ = [
    "DEFAULT_LEASE_S",
    "Handbacks",
    "MAX_ID_CHARS",
    "Session",
    "SessionBackend",
    "SessionInfo",
    "SessionLease",
    "SessionSnapshot",
    "SessionStore",
    "check_session_id",
    "encode_message",
    "wait_for_handback",
]
