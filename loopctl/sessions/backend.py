"""SessionBackend: the storage operations a session store provides.

Each concrete store (SQLite, Redis) implements them; ``Session`` and
``SessionLease`` (base.py) build every rule of a session on them. Every
operation is atomic on its own, and none puts stored text into an error.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

from loopctl.sessions.stored import SessionInfo


class SessionBackend:
    """The storage operations a store provides; ``Session`` and ``SessionLease`` build on them.

    Every method is atomic on its own. ``now`` and ``until`` are the store's
    clock readings (seconds); a lease with ``until <= now`` is expired.
    """

    def load(self, session_id: str) -> Optional[Tuple[object, object, object, List[Any]]]:
        """(revision, owner, incarnation, rows in order) as stored, read in one snapshot; None when absent.

        The values are checked by the caller (``loopctl.sessions.stored``).
        """
        raise NotImplementedError

    def acquire(
        self, session_id: str, owner: Optional[str], token: str, now: float, until: float, stale: Callable[[str], bool]
    ) -> bool:
        """Take the lease unless another holder's live one is held; False when it is (nothing changed).

        A live lease whose token ``stale`` says is dead is taken over, by
        compare-and-set on that token.

        Raises:
            KeyError: the session exists under another owner.
        """
        raise NotImplementedError

    def renew(self, session_id: str, token: str, until: float) -> bool:
        """Push the lease's expiry to ``until``; False when ``token`` no longer holds it."""
        raise NotImplementedError

    def release(self, session_id: str, token: str) -> None:
        """Drop the lease if ``token`` still holds it."""
        raise NotImplementedError

    def write(
        self, session_id: str, owner: Optional[str], token: str, now: float, rows: List[str], replace: bool
    ) -> Optional[Tuple[int, object]]:
        """Append ``rows`` (or replace every row with them) in one transaction.

        A session's first write gives it a fresh incarnation.

        Returns:
            The new revision and the session's stored incarnation, or None
            when ``token`` does not hold the lease (nothing written).

        Raises:
            SessionCorrupt: the stored revision cannot be read (nothing written).
        """
        raise NotImplementedError

    def infos(self, owner: Optional[str], session_id: Optional[str] = None) -> List[SessionInfo]:
        """Sessions of ``owner`` (all when None), newest first; one when ``session_id`` is given."""
        raise NotImplementedError

    def delete(self, session_id: str, now: float, stale: Callable[[str], bool]) -> Optional[bool]:
        """Remove the session; True if it existed, None when a live lease holds it.

        A live lease whose token ``stale`` says is dead does not hold it.
        """
        raise NotImplementedError

    def close(self) -> None:
        """Release connections (idempotent)."""
        raise NotImplementedError


__all__ = ["SessionBackend"]
