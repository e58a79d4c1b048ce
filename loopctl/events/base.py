"""``Event``, the base of every observer event, and its JSON and masked forms."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import attrs

from loopctl.messages import Message, Usage
from loopctl.text import json_safe, redact, redact_fields

#: Fields that quote untrusted text (an error, a cause, a pattern of tool input):
#: masked and cut to an excerpt. Every other text field is masked, never cut.
QUOTED_FIELDS = frozenset(("error", "cause", "errors", "pattern", "reason"))
_IDS = frozenset(("session_id", "run_id"))


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return json_safe(value)
    if isinstance(value, str):
        return redact(str(value))
    if isinstance(value, (Usage, Message)):
        return _json_safe(value.to_dict())
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return str(value)


@attrs.frozen
class Event:
    """Base of every observer event.

    ``subagent`` is ``""`` for the run's own events; an event a sub-agent's
    run emitted, carried to its parent's observers, holds the sub-agent's
    path (``"research"``, or ``"research/search"`` one level deeper) and the
    parent's ``run_id``.
    """

    TYPE: ClassVar[str] = "event"

    session_id: str
    run_id: str
    subagent: str = attrs.field(default="", kw_only=True)

    @classmethod
    def observer_method(cls) -> str:
        """The ``Observer`` method that receives this event: ``on_`` + its ``TYPE``."""
        return f"on_{cls.TYPE}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict with a ``type`` field naming the event (texts masked, floats finite)."""
        out: dict[str, Any] = {"type": self.TYPE}
        for f in attrs.fields(type(self)):
            out[f.name] = _json_safe(getattr(self, f.name))
        return out

    def redacted(self) -> Event:
        """This event with every text masked and its quotes cut to an excerpt (itself if none changed)."""
        return redact_fields(self, QUOTED_FIELDS, _IDS)


__all__ = ["QUOTED_FIELDS", "Event"]
