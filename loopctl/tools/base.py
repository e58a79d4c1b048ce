"""Tool value types and the ``Tool`` base class.

A tool's failure is a *soft* error: a ``ToolOutput`` with ``is_error=True``
that the model reads, and the run continues. ``invoke`` is the one entry
the dispatcher uses: it validates input, calls, converts the return value
and turns any exception into such a soft error.

Tool text is untrusted: a ``ToolOutput``'s text is always encodable UTF-8
(a lone surrogate becomes U+FFFD where the output is made, so history,
records, events and every provider see clean text), and a returned value is
encoded as strict JSON (a NaN or infinity becomes the string ``"NaN"``,
``"Infinity"`` or ``"-Infinity"``).
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import Any, Callable, Optional, Union

import attrs

from loopctl.cancel import CancelSignal
from loopctl.messages import ToolSchema
from loopctl.text import clean_text
from loopctl.tools.validation import check


class ToolError(Exception):
    """Raise from a tool to report a soft error (the model sees the message)."""




@attrs.frozen
class ToolOutput:
    """What a tool returns: text, and whether it is a (soft) error.

    ``text`` is cleaned on construction: lone surrogates become U+FFFD.
    """

    text: str = attrs.field(converter=clean_text)
    is_error: bool = False

    @classmethod
    def error(cls, text: str) -> ToolOutput:
        """A soft error result."""
        return cls(text, True)


TempDirSource = Union[Path, None, Callable[[], Optional[Path]]]


@attrs.define(eq=False)
class ToolContext:
    """What a tool call knows about where it runs.

    ``cancel`` is the run's cancel signal: long tools poll
    ``cancel.is_cancelled()`` or wait on ``cancel.wait(t)`` to stop early.
    ``extras`` is a dict the host fills (``BareLoop.tool_extras``).
    ``temp_dir`` is the loop's managed scratch directory; the loop makes it
    when a tool first reads this attribute, so a tool that never reads it
    costs no filesystem work. The constructor takes a path, None, or a
    zero-argument callable that makes and returns the path (called at most
    once, on first read).
    """

    session_id: str
    run_id: str
    turn: int
    call_id: str
    _temp_source: TempDirSource = attrs.field(alias="temp_dir", repr=False)
    cancel: CancelSignal
    extras: dict[str, Any] = attrs.field(factory=dict)
    _temp_resolved: bool = attrs.field(default=False, init=False, repr=False)

    @property
    def temp_dir(self) -> Optional[Path]:
        """The managed temp dir (made now if this is the first read), or None."""
        if not self._temp_resolved:
            source = self._temp_source
            if callable(source):
                source = source()
            self._temp_source = source
            self._temp_resolved = True
        return self._temp_source  # type: ignore[return-value]

    @temp_dir.setter
    def temp_dir(self, value: Optional[Path]) -> None:
        self._temp_source = value
        self._temp_resolved = True


def to_output(value: object) -> ToolOutput:
    """Convert a tool's return value: str as is, ToolOutput as given, else JSON.

    attrs instances become objects, Enum members their values, sets sorted
    lists, paths strings. The JSON is strict: a NaN or infinite float
    becomes the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``. A value
    JSON cannot hold (a circular one, say) falls back to ``str()``.
    """
    if isinstance(value, ToolOutput):
        return value
    if isinstance(value, str):
        return ToolOutput(value)
    try:
        return ToolOutput(_dumps(value))
    except ValueError:  # a NaN or infinity somewhere (or a cycle): the slow path
        pass
    except (TypeError, RecursionError):
        return ToolOutput(str(value))
    try:
        return ToolOutput(_dumps(_finite(value, set())))
    except (TypeError, ValueError, RecursionError):
        return ToolOutput(str(value))


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, default=_json_default)


_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def _finite(value: object, path: set[int]) -> object:
    """``value`` with non-finite floats as strings (containers copied, cycles refused)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else _NON_FINITE[repr(float(value))]
    if isinstance(value, (str, int)) or value is None:
        return value
    if id(value) in path:
        raise ValueError("circular reference")
    path.add(id(value))
    try:
        if isinstance(value, Mapping):
            return {(_finite(k, path) if isinstance(k, float) else k): _finite(v, path) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [_finite(v, path) for v in value]
        return _finite(_json_default(value), path)
    finally:
        path.discard(id(value))


def _json_default(value: Any) -> object:
    if attrs.has(type(value)):
        return {f.name: getattr(value, f.name) for f in attrs.fields(type(value))}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if isinstance(value, PurePath):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


class Tool:
    """Base class for tools that need state; most tools use ``@tool`` instead.

    Subclasses set ``name`` and ``description``, override ``input_schema()``
    (a JSON Schema object) and ``call(input, ctx)``. Optional knobs:
    ``concurrency_safe`` (may overlap other calls in a parallel wave),
    ``read_only`` (informational; permission policies may use it),
    ``idempotent`` (a durable run may run a call again after a worker loss),
    ``timeout`` (seconds; enforced by the dispatcher, see
    ``loopctl.tools.timeout``), ``requires_approval`` (every call waits for
    a person's approval, see docs/approvals.md) with ``approval_timeout``
    (seconds; None defers to ``RunConfig.approval_timeout``), ``source``
    (what provides the tool: None for your own code, the server for an MCP
    tool; a registry never lets one source's tool silently replace
    another's), and the per-call ``is_concurrency_safe`` / ``resource_key`` overrides. ``call`` runs on a worker thread when calls
    overlap, so shared state needs its own lock.
    """

    name: str = ""
    description: str = ""
    concurrency_safe: bool = False
    read_only: bool = False
    idempotent: bool = False
    timeout: Optional[float] = None
    requires_approval: bool = False
    approval_timeout: Optional[float] = None
    source: object = None

    def input_schema(self) -> Mapping[str, Any]:
        """The JSON Schema of the input (an object schema)."""
        return {"type": "object", "properties": {}, "required": []}

    def schema(self) -> ToolSchema:
        """What the model is told about this tool."""
        return ToolSchema(self.name, self.description, self.input_schema())

    def resource_key(self, input: Mapping[str, Any]) -> Optional[str]:
        """Calls sharing a key never run in the same parallel wave."""
        return None

    def is_concurrency_safe(self, input: Mapping[str, Any]) -> bool:
        """Whether this call may overlap other calls (defaults to the flag)."""
        return self.concurrency_safe

    def validate(self, input: Mapping[str, Any]) -> Optional[str]:
        """A message naming the bad field(s), or None when ``input`` is valid.

        The default checks ``input`` against ``input_schema()`` (see
        ``loopctl.tools.validation``): types, required fields, enum values,
        and unknown fields when the schema sets ``additionalProperties: false``.
        """
        return check(self.input_schema(), input)

    def call(self, input: Mapping[str, Any], ctx: ToolContext) -> object:
        """Run the tool; return str, ``ToolOutput`` or any JSON-able value."""
        raise NotImplementedError(f"tool {self.name!r} does not implement call()")

    def invoke(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        """Validate, call and convert; every exception becomes a soft error."""
        problem = self.validate(input)
        if problem is not None:
            return ToolOutput.error(f"Invalid input for tool '{self.name}': {problem}")
        try:
            return to_output(self.call(input, ctx))
        except ToolError as exc:
            return ToolOutput.error(f"Tool '{self.name}' failed: {exc}")
        except Exception as exc:
            return ToolOutput.error(f"Tool '{self.name}' raised {type(exc).__name__}: {exc}")

    def __repr__(self) -> str:
        return f"<Tool {self.name!r}>"


__all__ = ["Tool", "ToolContext", "ToolError", "ToolOutput", "clean_text", "to_output"]
