"""Versioned JSON-safe dicts for everything that crosses a process boundary.

Messages, parts, usage, configs and records already have ``to_dict`` /
``from_dict``; this module adds what is missing (observer events, run
statuses, errors, whole conversations) and one versioned envelope for all of
them: ``dump(obj)`` gives ``{"version": 1, "kind": ..., "data": ...}`` and
``load(envelope)`` gives the object back, equal to the original. Rules it
keeps: the event dicts are exactly ``Event.to_dict()`` (the ``(seq, dict)``
contract of the registries does not change across processes); a dict from a
newer schema version, an unknown kind or event type, or a missing field is a
``SchemaError`` naming the bad value, never a silent half-object.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import attrs

from loopctl.approvals import ApprovalDecision, PendingApproval
from loopctl.config import ParallelDispatch, RunConfig, SessionConfig
from loopctl.errors import LoopError
from loopctl.events import EVENT_TYPES, Event
from loopctl.messages import (
    SCHEMA_VERSION,
    Message,
    StopReason,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolResultPart,
    Usage,
    part_from_dict,
    part_to_dict,
)
from loopctl.records import Run, Turn, _error_from_dict, _error_to_dict
from loopctl.text import json_safe


class SchemaError(LoopError, ValueError):
    """A serialized dict that cannot be loaded (bad version, kind, type or field)."""


def _check_version(data: Mapping[str, Any], what: str) -> None:
    version = data.get("version", SCHEMA_VERSION)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise SchemaError(f"{what}: version must be an int >= 1, got {version!r}")
    if version > SCHEMA_VERSION:
        raise SchemaError(
            f"{what}: schema version {version} is newer than this loopctl "
            f"understands ({SCHEMA_VERSION}); upgrade loopctl"
        )


def _mapping(data: object, what: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise SchemaError(f"{what} must be a dict, got {type(data).__name__} {data!r:.60}")
    return data


# -- events --------------------------------------------------------------------------


def _load_usage(value: object) -> Optional[Usage]:
    return None if value is None else Usage.from_dict(_mapping(value, "usage"))


def _load_messages(value: Any) -> Tuple[Message, ...]:
    return tuple(message_from_dict(m) for m in value)


def _load_stop_reason(value: object) -> Optional[StopReason]:
    return None if value is None else StopReason(value)


def _load_input(value: object) -> object:
    # ToolCallReceived.input is a dict; RunStart.input is a str: keep the shape.
    return dict(value) if isinstance(value, Mapping) else value


def _load_float(value: Any) -> float:
    return float(value)


def _load_int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise ValueError(f"expected an int, got {value!r}")
    return int(value)


def _load_strs(value: object) -> Tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise TypeError("expected a list of strings")
    return tuple(value)


def _load_opt_int(value: object) -> Optional[int]:
    return None if value is None else _load_int(value)


def _load_opt_str(value: object) -> Optional[str]:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"expected a string or null, got {type(value).__name__}")
    return value


_BY_NAME: Dict[str, Callable[[object], object]] = {
    "usage": _load_usage,
    "messages": _load_messages,
    "stop_reason": _load_stop_reason,
    "input": _load_input,
    "duration_ms": _load_float,
    "similarity": _load_float,
    "context_window": _load_opt_int,
    "errors": _load_strs,
    "error_type": _load_opt_str,
}
_INT_FIELDS = {
    "turn",
    "total_turns",
    "attempt",
    "input_tokens",
    "output_tokens",
    "context_tokens",
    "tokens_before",
    "tokens_after",
    "repetitions",
    "count",
    "max_attempts",
}


def event_to_dict(event: Event) -> Dict[str, Any]:
    """The event's JSON-safe dict (exactly ``event.to_dict()``, with its ``type``)."""
    if not isinstance(event, Event):
        raise SchemaError(f"not an observer event: {type(event).__name__} {event!r:.60}")
    return event.to_dict()


def event_from_dict(data: Mapping[str, Any]) -> Event:
    """Rebuild an observer event from ``Event.to_dict()`` output.

    Unknown keys are ignored (a ``version`` key is checked); a field with a
    default (``error_type``, added after the first schema) may be missing.

    Raises:
        SchemaError: not a dict, an unknown ``type``, a missing or bad field,
            or a newer schema version.
    """
    data = _mapping(data, "event")
    _check_version(data, "event")
    kind = data.get("type")
    cls = EVENT_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise SchemaError(
            f"unknown event type {kind!r}: expected one of {', '.join(sorted(EVENT_TYPES))}"
        )
    kwargs: Dict[str, Any] = {}
    for f in attrs.fields(cls):
        if f.name not in data:
            if f.default is not attrs.NOTHING:
                continue  # a field added later (``error_type``): older dicts lack it
            raise SchemaError(f"event {kind!r} is missing field {f.name!r}")
        value = data[f.name]
        load = _BY_NAME.get(f.name)
        if load is None and f.name in _INT_FIELDS:
            load = _load_int
        try:
            kwargs[f.name] = value if load is None else load(value)
        except (TypeError, ValueError, KeyError) as exc:
            raise SchemaError(f"event {kind!r} has a bad {f.name!r}: {value!r:.80} ({exc})") from exc
    return cls(**kwargs)


# -- messages and conversations ---------------------------------------------------------


def message_to_dict(message: Message) -> Dict[str, Any]:
    """A message's JSON-safe dict (``Message.to_dict()``)."""
    return message.to_dict()


def message_from_dict(data: Mapping[str, Any]) -> Message:
    """Rebuild a message; a bad dict is a ``SchemaError`` naming it."""
    data = _mapping(data, "message")
    try:
        return Message.from_dict(data)
    except (TypeError, ValueError, KeyError) as exc:
        raise SchemaError(f"bad message dict {dict(data)!r:.120}: {exc}") from exc


def history_to_dict(messages: Iterable[Message]) -> Dict[str, Any]:
    """A conversation as ``{"version": 1, "messages": [...]}``."""
    return {"version": SCHEMA_VERSION, "messages": [m.to_dict() for m in messages]}


def history_from_dict(data: Mapping[str, Any]) -> List[Message]:
    """The messages of a ``history_to_dict`` dict, in order.

    Raises:
        SchemaError: a newer version, no ``messages`` list, or a bad message.
    """
    data = _mapping(data, "history")
    _check_version(data, "history")
    raw = data.get("messages")
    if not isinstance(raw, list):
        raise SchemaError(f"history needs a 'messages' list, got {raw!r:.60}")
    return [message_from_dict(m) for m in raw]


# -- errors and statuses -------------------------------------------------------------------


def error_to_dict(error: LoopError) -> Dict[str, Any]:
    """A ``LoopError`` as ``{"type", "message", "fields"}`` (never its ``.run``)."""
    return _error_to_dict(error)


def error_from_dict(data: Mapping[str, Any]) -> LoopError:
    """Rebuild an error as its loopctl type (an unknown type becomes ``LoopError``)."""
    return _error_from_dict(_mapping(data, "error"))


_RUN_STATES = ("running", "completed", "cancelled", "failed")


def status_to_dict(status: Any) -> Dict[str, Any]:
    """A ``RunStatus`` as a JSON-safe dict."""
    return dict(status.to_dict())


def status_from_dict(data: Mapping[str, Any]) -> object:
    """Rebuild a ``RunStatus``.

    Raises:
        SchemaError: a missing field or an unknown state.
    """
    from loopctl.hosting.registry import RunStatus

    data = _mapping(data, "run status")
    _check_version(data, "run status")
    fields = attrs.fields(RunStatus)
    missing = [f.name for f in fields if f.name not in data and f.default is attrs.NOTHING]
    if missing:
        raise SchemaError(f"run status is missing {', '.join(map(repr, missing))}")
    if data["state"] not in _RUN_STATES:
        raise SchemaError(f"unknown run state {data['state']!r}: expected one of {_RUN_STATES}")
    kw = {f.name: data[f.name] for f in fields if f.name in data}
    # The approval fields came later: absent in older dicts, rebuilt from theirs.
    kw["pending_approvals"] = tuple(PendingApproval.from_dict(p) for p in data.get("pending_approvals") or ())
    kw["approvals"] = tuple(ApprovalDecision.from_dict(d) for d in data.get("approvals") or ())
    return RunStatus(**kw)


# -- the envelope -----------------------------------------------------------------------------

Serializable = Union[
    Message, Usage, Turn, Run, RunConfig, SessionConfig, ParallelDispatch, Event, LoopError
]

_KINDS: Dict[str, Tuple[Callable[[Any], object], Callable[[Any], object]]] = {
    "message": (Message.to_dict, message_from_dict),
    "usage": (Usage.to_dict, Usage.from_dict),
    "turn": (Turn.to_dict, Turn.from_dict),
    "run": (Run.to_dict, Run.from_dict),
    "run_config": (RunConfig.to_dict, RunConfig.from_dict),
    "session_config": (SessionConfig.to_dict, SessionConfig.from_dict),
    "parallel_dispatch": (ParallelDispatch.to_dict, ParallelDispatch.from_dict),
    "event": (event_to_dict, event_from_dict),
    "error": (error_to_dict, error_from_dict),
    "run_status": (status_to_dict, status_from_dict),
    "part": (part_to_dict, part_from_dict),
}


# Checked in order: the first type ``obj`` is an instance of names its kind.
_TYPE_KINDS: Tuple[Tuple[Union[type, Tuple[type, ...]], str], ...] = (
    (Message, "message"),
    (Usage, "usage"),
    (Turn, "turn"),
    (Run, "run"),
    (RunConfig, "run_config"),
    (SessionConfig, "session_config"),
    (ParallelDispatch, "parallel_dispatch"),
    (Event, "event"),
    (LoopError, "error"),
    ((TextPart, ThinkingPart, ToolCallPart, ToolResultPart), "part"),
)


def _kind_of(obj: object) -> str:
    for cls, kind in _TYPE_KINDS:
        if isinstance(obj, cls):
            return kind
    if type(obj).__name__ == "RunStatus" and hasattr(obj, "to_dict"):
        return "run_status"  # by name: the registry imports this module's siblings
    raise SchemaError(f"cannot serialize {type(obj).__name__}: {obj!r:.60}")


def dump(obj: object) -> Dict[str, Any]:
    """``{"version": 1, "kind": <kind>, "data": <the object's dict>}``.

    Kinds: message, part, usage, turn, run, run_config, session_config,
    parallel_dispatch, event, error, run_status.

    Raises:
        SchemaError: an object of no known kind.
    """
    kind = _kind_of(obj)
    return {"version": SCHEMA_VERSION, "kind": kind, "data": _KINDS[kind][0](obj)}


def load(envelope: Mapping[str, Any]) -> object:
    """The object a ``dump`` envelope holds (equal to the dumped one).

    Raises:
        SchemaError: a newer version, an unknown kind, or bad data.
    """
    envelope = _mapping(envelope, "envelope")
    _check_version(envelope, "envelope")
    kind = envelope.get("kind")
    entry = _KINDS.get(kind) if isinstance(kind, str) else None
    if entry is None:
        raise SchemaError(f"unknown kind {kind!r}: expected one of {', '.join(sorted(_KINDS))}")
    if "data" not in envelope:
        raise SchemaError(f"envelope of kind {kind!r} has no 'data'")
    try:
        return entry[1](envelope["data"])
    except SchemaError:
        raise
    except (TypeError, ValueError, KeyError) as exc:
        raise SchemaError(f"bad {kind} data {envelope['data']!r:.120}: {exc}") from exc


def dumps(obj: object) -> str:
    """``dump(obj)`` as compact JSON text (standard JSON: a non-finite number is ``null``)."""
    return json.dumps(json_safe(dump(obj)), separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def loads(text: Union[str, bytes]) -> object:
    """The object in ``dumps`` output.

    Raises:
        SchemaError: not JSON, or a bad envelope.
    """
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SchemaError(f"not JSON: {text!r:.60}") from exc
    return load(data)


__all__ = [
    "SCHEMA_VERSION",
    "SchemaError",
    "dump",
    "dumps",
    "error_from_dict",
    "error_to_dict",
    "event_from_dict",
    "event_to_dict",
    "history_from_dict",
    "history_to_dict",
    "load",
    "loads",
    "message_from_dict",
    "message_to_dict",
    "status_from_dict",
    "status_to_dict",
]
