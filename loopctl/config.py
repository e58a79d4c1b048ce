"""Session and run configuration: frozen, validated, never clamped.

A value out of range raises ``ConfigError`` naming the field and the value
(we differ from the original on purpose: nothing is silently clamped). The
one exception is a duration longer than the platform can wait
(``loopctl.timeouts``): it means "practically for ever" and is clamped to
``threading.TIMEOUT_MAX``; infinities and NaN are refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import attrs

from loopctl.checks import flag, integer, shown
from loopctl.errors import ConfigError
from loopctl.timeouts import clamp, seconds

_DISPATCH_MODES = ("parallel", "sequential")
_OUTPUT_MODES = (None, "native", "tool", "prompt")


def _name(inst: object, attribute: attrs.Attribute[Any]) -> str:
    return f"{type(inst).__name__}.{attribute.name}"


def _int_range(lo: int, hi: Optional[int] = None) -> Any:
    def check(inst: object, attribute: attrs.Attribute[object], value: object) -> None:
        integer(value, _name(inst, attribute), lo, hi)

    return check


def _bool(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    flag(value, _name(inst, attribute))


def _optional_str(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{_name(inst, attribute)} must be a str or None, got {shown(value)}")


def _optional_seconds(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    seconds(value, _name(inst, attribute))


def _mode(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value not in _DISPATCH_MODES:
        raise ConfigError(
            f"ParallelDispatch.mode must be 'parallel' or 'sequential', got {shown(value)}"
        )


def _output_mode(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value not in _OUTPUT_MODES:
        raise ConfigError(
            f"RunConfig.output_mode must be None, 'native', 'tool' or 'prompt', got {shown(value)}"
        )


def type_ref(output_type: object) -> Optional[str]:
    """``"module:qualname"`` for an importable class (None for a schema dict or a local class)."""
    module = getattr(output_type, "__module__", None)
    qualname = getattr(output_type, "__qualname__", None)
    if not isinstance(output_type, type) or not module or not qualname or "<locals>" in qualname:
        return None
    return f"{module}:{qualname}"


@attrs.frozen
class ParallelDispatch:
    """How one turn's tool calls are dispatched.

    Args:
        mode: ``"parallel"`` (concurrency-safe calls overlap; unsafe ones run
            alone) or ``"sequential"`` (one by one).
        max_concurrency: the most calls running at once (>= 1).
    """

    mode: str = attrs.field(default="parallel", validator=_mode)
    max_concurrency: int = attrs.field(default=8, validator=_int_range(1))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict."""
        return {"mode": self.mode, "max_concurrency": self.max_concurrency}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ParallelDispatch:
        """Rebuild from ``to_dict`` output (validated)."""
        return cls(**_known_fields(cls, data))


def _known_fields(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` minus ``version``; an unknown key is a ``ConfigError`` naming it."""
    names = {f.name for f in attrs.fields(cls)}
    unknown = sorted(shown(k) for k in data if k not in names and k != "version")
    if unknown:
        raise ConfigError(
            f"{cls.__name__} has no field {', '.join(unknown)}; "
            f"expected some of {', '.join(sorted(names))}"
        )
    return {k: v for k, v in data.items() if k != "version"}


def _to_dispatch(value: object) -> ParallelDispatch:
    if isinstance(value, ParallelDispatch):
        return value
    if isinstance(value, str):
        return ParallelDispatch(mode=value)
    if isinstance(value, Mapping):
        return ParallelDispatch.from_dict(value)
    raise ConfigError(f"RunConfig.parallel must be a ParallelDispatch, got {shown(value)}")


@attrs.frozen
class SessionConfig:
    """Settings that hold for every run of a loop.

    Args:
        system_prompt: sent with every request.
        context_window: the model's window in tokens; 0 disables all window policy.
        compact_threshold: percent (0-100) of the window above which the loop
            compacts; 0 disables the threshold trigger only.
        auto_compact: False turns off the threshold trigger (the 95% emergency
            line still fires).
    """

    system_prompt: Optional[str] = attrs.field(default=None, validator=_optional_str)
    context_window: int = attrs.field(default=200_000, validator=_int_range(0))
    compact_threshold: int = attrs.field(default=80, validator=_int_range(0, 100))
    auto_compact: bool = attrs.field(default=True, validator=_bool)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict."""
        return attrs.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SessionConfig:
        """Rebuild from ``to_dict`` output (validated)."""
        return cls(**_known_fields(cls, data))


@attrs.frozen
class RunConfig:
    """Settings for one run.

    Args:
        max_turns: the most model calls the run may make (>= 0).
        parallel: tool dispatch policy.
        memory_top_k: memory entries retrieved per turn (0 disables).
        reset_managers: reset breaker and detectors at the start of the run.
        output_type: the answer's type (an attrs class, a dataclass, a
            TypedDict, an Enum or Literal, ``list[...]`` of those, a plain
            ``int``/``float``/``str``/``bool``, or a JSON Schema dict); the run's
            ``Run.output_value`` is then the validated answer. None: plain text.
        output_retries: how many times an answer that does not fit is sent
            back with its problems before the run fails (>= 0).
        output_mode: how the answer's shape reaches the model: ``"native"``
            (the server's structured output), ``"tool"`` (a final-answer
            tool), ``"prompt"`` (instructions); None picks the client's best.
        approval_timeout: seconds a tool call may wait for a person's
            approval before it is denied ("approval timed out"), unless its
            tool sets its own; None (the default) waits for ever.
    """

    max_turns: int = attrs.field(default=200, validator=_int_range(0))
    parallel: ParallelDispatch = attrs.field(factory=ParallelDispatch, converter=_to_dispatch)
    memory_top_k: int = attrs.field(default=3, validator=_int_range(0))
    reset_managers: bool = attrs.field(default=False, validator=_bool)
    output_type: object = None
    output_retries: int = attrs.field(default=2, validator=_int_range(0))
    output_mode: Optional[str] = attrs.field(default=None, validator=_output_mode)
    approval_timeout: Optional[float] = attrs.field(default=None, converter=clamp, validator=_optional_seconds)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (an answer type travels as its import path, a schema as itself)."""
        out: dict[str, Any] = {
            "max_turns": self.max_turns,
            "parallel": self.parallel.to_dict(),
            "memory_top_k": self.memory_top_k,
            "reset_managers": self.reset_managers,
        }
        if self.approval_timeout is not None:  # older readers never see an unknown key
            out["approval_timeout"] = self.approval_timeout
        if self.output_type is not None:
            t = self.output_type
            out["output_type"] = dict(t) if isinstance(t, Mapping) else {"ref": type_ref(t)}
            out["output_retries"] = self.output_retries
            out["output_mode"] = self.output_mode
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunConfig:
        """Rebuild from ``to_dict`` output (validated); an answer type is imported when it can be."""
        fields = _known_fields(cls, data)
        if "output_type" in fields:
            fields["output_type"] = _load_output_type(fields["output_type"])
        return cls(**fields)


def _load_output_type(raw: object) -> object:
    # A class travels as "module:qualname"; where it cannot be imported the answer
    # stays in its JSON form (``Run.output_value`` is then plain JSON).
    if not isinstance(raw, Mapping) or set(raw) != {"ref"}:
        return raw
    ref = raw.get("ref")
    if not isinstance(ref, str) or ":" not in ref:
        return None
    import importlib

    module, _, qualname = ref.partition(":")
    try:
        obj: object = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    return obj


__all__ = ["ParallelDispatch", "RunConfig", "SessionConfig", "type_ref"]
