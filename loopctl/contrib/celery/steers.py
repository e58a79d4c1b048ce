"""A stored steer's wire form: the message, and the sub-agent it is for (if any).

Guidance for the run itself is stored as the message's own dict, so the
Lua scripts, which hand stored steers back as leftovers untouched, never
need to know about targets. Guidance for a sub-agent (``steer(..., to=)``)
is stored as ``{"to": PATH, "message": {...}}``: a message dict never has
a ``to`` key, so the two forms cannot be confused.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Optional, Sequence, Tuple

from loopctl.driver.subagent_path import check_path
from loopctl.hosting.serialization import message_from_dict
from loopctl.messages import Message

from .redis import dumps

Steer = Tuple[Message, Optional[str]]  # a steer's message and its sub-agent path (None: the run itself)


def check_target(to: object) -> Optional[str]:
    """``to`` as a sub-agent path (None stays None).

    Raises:
        ConfigError: not a str, empty, or an empty segment (``"a//b"``, ``"/a"``).
    """
    return None if to is None else check_path(to)


def steer_to_dict(message: Message, to: Optional[str] = None) -> Dict[str, Any]:
    """The stored form of a steer as a JSON-safe dict (see the module docstring)."""
    if to is None:
        return message.to_dict()
    return {"to": to, "message": message.to_dict()}


def steer_from_dict(data: Any) -> Steer:
    """A steer's stored dict read back: the message and its target path (None: the run itself).

    Raises:
        SchemaError, ConfigError: (both ``LoopError``) a bad message or target.
    """
    if isinstance(data, dict) and "to" in data:
        return message_from_dict(data.get("message", {})), check_target(data["to"])
    return message_from_dict(data), None


def steer_json(message: Message, to: Optional[str] = None) -> str:
    """The stored form of a steer for the run (``to`` None) or for its sub-agent at path ``to``."""
    return dumps(steer_to_dict(message, to))


def steer_from_json(text: str) -> Steer:
    """A stored steer read back: the message and its target path (None: the run itself).

    Raises:
        ValueError: not JSON (a ``SchemaError`` or ``ConfigError``, both
            ``LoopError``, for a bad message or target).
    """
    return steer_from_dict(json.loads(text))


def settled_prefix(settled: Sequence[bool], delivered: int) -> int:
    """How many steers, from the first one taken, never need feeding again.

    ``settled`` holds one flag per steer taken, in index order: True for
    one settled when taken (guidance handed on to a sub-agent, or a
    malformed one dropped), False for the run's own guidance, which is
    settled once the run's conversation holds it. The run drains its own
    guidance in push order, so its first ``delivered`` are the settled ones.
    A resumed run feeds again every steer after this prefix.
    """
    n = 0
    for done in settled:
        if not done:
            if delivered <= 0:
                break
            delivered -= 1
        n += 1
    return n


__all__ = [
    "Steer",
    "check_target",
    "settled_prefix",
    "steer_from_dict",
    "steer_from_json",
    "steer_json",
    "steer_to_dict",
]
