"""The audit trail: ``Session`` holds a ``Run`` per run, a run holds its ``Turn``s.

Records are what happened, never what the model sees: compaction does not
touch them. Totals are derived from the turns, never stored twice. Every
run gets its entry, success or failure. A record leaves the process only
through ``to_dict``: every text in it masked (``loopctl.text.redact``) and
every float finite, so the JSON of a record never carries a credential,
``NaN`` or ``Infinity``.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Iterable, Mapping
from typing import Any, Optional, Union

import attrs

import loopctl.errors as _errors
from loopctl.approvals.values import ApprovalDecision
from loopctl.config import RunConfig
from loopctl.errors import LoopError
from loopctl.messages import StopReason, ToolCallPart, Usage, part_from_dict, part_to_dict
from loopctl.text import json_safe, redact, redact_value


def _outlet(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` as it may leave: every text masked, every float finite."""
    out: dict[str, Any] = json_safe(redact_value(data))
    return out


def _to_calls(value: Iterable[ToolCallPart]) -> tuple[ToolCallPart, ...]:
    return tuple(_masked_call(c) for c in value)


def _masked_call(call: ToolCallPart) -> ToolCallPart:
    # The record keeps its own copy only when something in the call was masked.
    masked = redact_value(call.input)
    invalid = None if call.invalid is None else redact(call.invalid)
    if masked is call.input and invalid is call.invalid:
        return call
    return attrs.evolve(call, input=masked, invalid=invalid)


def _masked_text(value: str) -> str:
    return redact(value) if type(value) is str else value


def _masked_optional(value: Optional[str]) -> Optional[str]:
    return redact(value) if type(value) is str else value


def _to_stop_reason(value: Union[StopReason, str]) -> StopReason:
    return StopReason(value)


@attrs.frozen
class Turn:
    """One model call of a run and what it asked for.

    ``turn`` counts from 0 within the run; ``input`` is the display text of
    what the turn answered (the run input on turn 0). The record is made
    masked: its texts and the calls' arguments as ``loopctl.text.redact``
    leaves them.
    """

    turn: int
    input: str = attrs.field(converter=_masked_text)
    output: str = attrs.field(converter=_masked_text)
    tool_calls: tuple[ToolCallPart, ...] = attrs.field(default=(), converter=_to_calls)
    input_tokens: int = 0
    output_tokens: int = 0
    stop_reason: StopReason = attrs.field(default=StopReason.END_TURN, converter=_to_stop_reason)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (texts masked)."""
        return _outlet({
            "turn": self.turn,
            "input": self.input,
            "output": self.output,
            "tool_calls": [part_to_dict(c) for c in self.tool_calls],
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "stop_reason": self.stop_reason.value,
        })

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Turn:
        """Rebuild from ``to_dict`` output."""
        calls = tuple(part_from_dict(c) for c in data.get("tool_calls", ()))
        return cls(
            turn=int(data["turn"]),
            input=data.get("input", ""),
            output=data.get("output", ""),
            tool_calls=calls,  # type: ignore[arg-type]
            input_tokens=int(data.get("input_tokens", 0)),
            output_tokens=int(data.get("output_tokens", 0)),
            stop_reason=StopReason(data.get("stop_reason", "end_turn")),
        )


@attrs.define(eq=False)
class Run:
    """One call of ``run()``: its input, output, turns and how it ended.

    ``stop_reason`` is None on success and the ``LoopError`` on failure;
    ``start``/``end`` are wall-clock timestamps (``time.time()``).
    ``output_value`` is the validated answer of a run that asked for an
    ``output_type`` (an instance of it); ``output`` is still the text.
    ``approvals`` holds every approval decision of the run (who, when,
    approved or denied and why), in the order they were taken. ``output``
    and the decisions' texts and arguments are kept masked, as the turns'
    texts (``loopctl.text.redact``); ``output_value`` is the answer as
    validated. ``input`` is what the model is given, so it is kept whole
    here and masked in ``to_dict`` (as at every outlet).
    ``subagent_usage`` sums the tokens of the sub-agent runs this run
    delegated to (see ``BareLoop.as_tool``); ``usage`` adds the run's own.
    """

    id: str
    input: str
    output: Optional[str] = attrs.field(default=None, converter=_masked_optional)
    turns: list[Turn] = attrs.field(factory=list)
    config: RunConfig = attrs.field(factory=RunConfig)
    start: float = attrs.field(factory=time.time)
    end: Optional[float] = None
    stop_reason: Optional[LoopError] = None
    output_value: object = None
    approvals: list[ApprovalDecision] = attrs.field(factory=list)
    subagent_usage: Usage = Usage()

    @property
    def usage(self) -> Usage:
        """Tokens of the run's own turns plus those of its sub-agents' runs."""
        sub = self.subagent_usage
        return Usage(self.input_tokens + sub.input_tokens, self.output_tokens + sub.output_tokens)

    @property
    def turn_count(self) -> int:
        """How many model calls the run made."""
        return len(self.turns)

    @property
    def input_tokens(self) -> int:
        """Input tokens summed over the turns."""
        return sum(t.input_tokens for t in self.turns)

    @property
    def output_tokens(self) -> int:
        """Output tokens summed over the turns."""
        return sum(t.output_tokens for t in self.turns)

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    @property
    def tool_call_count(self) -> int:
        """Tool calls the model asked for, summed over the turns."""
        return sum(len(t.tool_calls) for t in self.turns)

    @property
    def duration(self) -> float:
        """Seconds from start to end (to now while the run is in flight)."""
        return (self.end if self.end is not None else time.time()) - self.start

    @property
    def succeeded(self) -> bool:
        """True when the run ended without an error."""
        return self.end is not None and self.stop_reason is None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (texts masked); the error travels as its type name, message and fields."""
        err = self.stop_reason
        return _outlet({
            "id": self.id,
            "input": self.input,
            "output": self.output,
            "turns": [t.to_dict() for t in self.turns],
            "config": self.config.to_dict(),
            "start": self.start,
            "end": self.end,
            "stop_reason": None if err is None else _error_to_dict(err),
            "output_value": json_form(self.output_value),
            "approvals": [a.to_dict() for a in list(self.approvals)],
            "subagent_usage": self.subagent_usage.to_dict(),
        })

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Run:
        """Rebuild from ``to_dict`` output; the error becomes its loopctl type."""
        raw = data.get("stop_reason")
        err = _error_from_dict(raw) if raw else None
        return cls(
            id=data["id"],
            input=data.get("input", ""),
            output=data.get("output"),
            turns=[Turn.from_dict(t) for t in data.get("turns", ())],
            config=RunConfig.from_dict(data.get("config") or {}),
            start=float(data.get("start") or 0.0),
            end=data.get("end"),
            stop_reason=err,
            output_value=data.get("output_value"),
            approvals=[ApprovalDecision.from_dict(a) for a in data.get("approvals", ())],
            subagent_usage=Usage.from_dict(data.get("subagent_usage") or {}),
        )


def json_form(value: Any) -> object:
    """A typed answer as plain JSON values (attrs, dataclasses, enums, lists, dicts)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, enum.Enum):
        return json_form(value.value)
    if attrs.has(type(value)):
        return {
            (f.alias or f.name): json_form(getattr(value, f.name))
            for f in attrs.fields(type(value))
            if f.init
        }
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: json_form(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): json_form(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_form(v) for v in value]
    return str(value)


def _error_to_dict(err: LoopError) -> dict[str, Any]:
    # Structured fields travel when JSON-safe (scalars, tuples/lists of them);
    # the attached ``run`` never does (it is the record being serialized).
    fields: dict[str, Any] = {}
    for key, value in vars(err).items():
        if key in ("run", "message") or key.startswith("_"):
            continue
        if isinstance(value, _SCALARS):
            fields[key] = value
        elif isinstance(value, (tuple, list)) and all(isinstance(v, _SCALARS) for v in value):
            fields[key] = list(value)
    return _outlet({"type": type(err).__name__, "message": str(err), "fields": fields})


def _error_from_dict(raw: Mapping[str, Any]) -> LoopError:
    cls_ = getattr(_errors, str(raw.get("type")), None)
    if not (isinstance(cls_, type) and issubclass(cls_, LoopError)):
        cls_ = LoopError
    message = str(raw.get("message", ""))
    err = cls_.__new__(cls_)
    Exception.__init__(err, message)
    err.message = message
    for key, value in (raw.get("fields") or {}).items():
        setattr(err, key, tuple(value) if isinstance(value, list) else value)
    return err


_SCALARS = (str, int, float, bool, type(None))


@attrs.define(eq=False)
class Session:
    """A loop's audit trail: its id and every run, in order."""

    id: str
    runs: list[Run] = attrs.field(factory=list)

    @property
    def current_run(self) -> Optional[Run]:
        """The newest run, or None before the first."""
        return self.runs[-1] if self.runs else None

    @property
    def total_turns(self) -> int:
        """Turns over every run."""
        return sum(r.turn_count for r in self.runs)


__all__ = ["Run", "Session", "Turn", "json_form"]
