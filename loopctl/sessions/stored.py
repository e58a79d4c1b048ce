"""Reading what a store holds: message rows, revisions, owners, list entries.

Every value a backend reads goes through here before anyone uses it, so a
value that cannot be read is always the same fault, whatever holds the
data: ``SessionCorrupt`` naming the session (and the message's position
when a message row is bad). Stored text is never put into the error or the
log (it may hold secrets). ``store.list()`` leaves out an entry it cannot
read, logging a warning that names it, so one bad session never hides the
others.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any, List, Optional, Sequence

import attrs

from loopctl.errors import SessionCorrupt
from loopctl.messages import Message

log = logging.getLogger("loopctl")


@attrs.frozen
class SessionInfo:
    """What a store knows about one session (``store.list()``)."""

    id: str
    owner: Optional[str]
    messages: int
    revision: int
    updated: float


@attrs.frozen
class SessionSnapshot:
    """One consistent read of a session (``session.read()``).

    Attributes:
        revision: bumped by every write; 0 when the session does not exist.
        incarnation: made when the session is created, so a session deleted
            and made again (back at revision 1) is told from the old one;
            None for an absent session or one stored before incarnations.
        messages: the stored conversation, in order.
    """

    revision: int
    incarnation: Optional[str]
    messages: List[Message]


def corrupt(session_id: str, what: str) -> SessionCorrupt:
    """The error for a session whose record (not a message row) cannot be read."""
    return SessionCorrupt(session_id, None, f"unreadable {what}")


def decode_messages(session_id: str, bodies: Sequence[Any]) -> List[Message]:
    """The stored rows as messages, in order.

    Raises:
        SessionCorrupt: a row is not a message (naming the session and the
            row's position; the row's text is never shown).
    """
    out: List[Message] = []
    for i, body in enumerate(bodies):
        try:
            text = body.decode("utf-8") if isinstance(body, bytes) else body
            out.append(Message.from_dict(json.loads(text)))
        except Exception as exc:  # any failure to read a row is the same fault: bad data
            raise SessionCorrupt(session_id, i, f"unreadable row ({type(exc).__name__})") from None
    return out


def stored_revision(session_id: str, value: object) -> int:
    """A stored revision: a whole number >= 1 (an ``int``, or its decimal text as ``str``/``bytes``).

    Raises:
        SessionCorrupt: anything else.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        text = _text(value)
        if text is None or not (text.isascii() and text.isdigit()):
            raise corrupt(session_id, "revision")
        number = int(text)
    if number < 1:
        raise corrupt(session_id, "revision")
    return number


def stored_owner(session_id: str, value: object) -> Optional[str]:
    """A stored owner: None (or empty) for none, else its text.

    Raises:
        SessionCorrupt: not text (or not valid UTF-8).
    """
    if value is None:
        return None
    text = _text(value)
    if text is None:
        raise corrupt(session_id, "owner")
    return text or None


def stored_incarnation(session_id: str, value: object) -> Optional[str]:
    """A stored incarnation: None when the session predates them, else its text."""
    if value is None:
        return None
    text = _text(value)
    if not text:
        raise corrupt(session_id, "incarnation")
    return text


def list_entry(raw_id: object, owner: object, messages: object, revision: object, updated: object) -> Optional[SessionInfo]:
    """One ``store.list()`` entry from its stored values; None (and a warning) when it cannot be read."""
    sid = _text(raw_id)
    if not sid:
        log.warning("session store: list() leaves out a session whose id cannot be read")
        return None
    try:
        when = float(_text(updated) or "") if not isinstance(updated, (int, float)) else float(updated)
        if not math.isfinite(when) or isinstance(messages, bool) or not isinstance(messages, int):
            raise corrupt(sid, "record")
        return SessionInfo(sid, stored_owner(sid, owner), messages, stored_revision(sid, revision), when)
    except (SessionCorrupt, ValueError) as exc:
        shown = exc if isinstance(exc, SessionCorrupt) else corrupt(sid, "update time")
        log.warning("session store: list() leaves out a session it cannot read: %s", shown)
        return None


def _text(value: object) -> Optional[str]:
    """``value`` as text: a ``str`` as is, ``bytes`` as UTF-8; None for anything else or bad UTF-8."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


__all__ = [
    "SessionInfo",
    "SessionSnapshot",
    "corrupt",
    "decode_messages",
    "list_entry",
    "stored_incarnation",
    "stored_owner",
    "stored_revision",
]
