"""How a registry ties a run to a stored session (``start(..., session_id=...)``).

The registry's loop is the one the caller made; the registry names
``store.session(session_id, owner=owner)`` and the loop takes it as part of
the start (``BareLoop.start(..., session=...)``), so a start refused at any
step (``LoopBusy``, ``SessionBusy``, another owner's ``KeyError``) leaves
the loop as it was. A loop keeps one session for life: a fresh loop (a
restarted server, a reloaded page's request) takes it and loads the stored
conversation at its first run; a loop that already keeps that session
continues it; anything else is refused with ``ConfigError`` rather than
mixing two conversations.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import TYPE_CHECKING, Any, Optional

from loopctl.errors import ConfigError
from loopctl.hosting.entry import same_owner

if TYPE_CHECKING:
    from loopctl.sessions.base import Session


def session_for_start(store: Any, session_id: str, owner: Optional[Hashable]) -> Session:
    """The session a start names (the loop takes it only if the start succeeds).

    Raises:
        ConfigError: no store, or an owner that is not a ``str``.
        TypeError, ValueError: a bad session id.
    """
    if store is None:
        raise ConfigError("start(session_id=...) needs RunRegistry(session_store=...)")
    if owner is not None and not isinstance(owner, str):
        raise ConfigError(f"a run with a session_id needs a str owner (or None), got {type(owner).__name__}")
    session: Session = store.session(session_id, owner=owner)
    return session


def run_on_session(entries: Iterable[Any], session_id: str, owner: Optional[Hashable]) -> Optional[str]:
    """The id of the registered run in flight on the session, or None."""
    for entry in entries:
        loop = entry.loop
        if entry.ended or loop is None or not same_owner(entry.owner, owner):
            continue
        session = loop.stored_session
        if session is not None and session.id == session_id:
            return str(entry.run_id)
    return None


__all__ = ["run_on_session", "session_for_start"]
