"""``@tool``: a typed, documented function becomes a ``Tool``.

Everything is decided at decoration time: the name (the function's, or
``name=``), the description (the docstring before its sections, or
``description=``), the input schema (from the type hints, see
``loopctl.tools.schema``) and the per-parameter descriptions (the
docstring's ``Args:`` section). A mistake there raises ``ConfigError`` at
once. At call time the input is validated against that schema, converted
to the declared types, and passed as keyword arguments; a parameter
annotated ``ToolContext`` receives the call's context and is not
advertised. ``**kwargs`` lets the schema accept extra fields. String hints
(``from __future__ import annotations``, Python 3.9's ``list[int]``) are
resolved with ``typing.get_type_hints`` in the function's module plus the
locals of the scope that applies the decorator (so a tool defined in a
function may name a class defined beside it).
"""

from __future__ import annotations

import inspect
import sys
import types
import typing
from collections.abc import Mapping
from typing import Any, Callable, Optional, TypeVar, Union, overload

import attrs

from loopctl.checks import shown
from loopctl.errors import ConfigError
from loopctl.messages import ToolSchema
from loopctl.timeouts import seconds
from loopctl.tools.base import Tool, ToolContext, ToolError, ToolOutput, to_output
from loopctl.tools.docstrings import description as doc_description
from loopctl.tools.docstrings import parse_args_section
from loopctl.tools.schema import (
    NO_DEFAULT,
    Converter,
    compile_annotation,
    json_default,
    resolve_hints,
)
from loopctl.tools.validation import check, compile_schema

ResourceKey = Union[str, Callable[[Mapping[str, Any]], Optional[str]]]
F = TypeVar("F", bound=Callable[..., Any])

_UNION_TYPE = getattr(types, "UnionType", None)  # ``X | None`` on Python >= 3.10


def _is_context(hint: object) -> bool:
    """True for ``ToolContext``, ``Optional[ToolContext]``, ``ToolContext | None`` and ``None | ToolContext``."""
    if hint is ToolContext:
        return True
    origin = typing.get_origin(hint)
    if origin is typing.Union or (_UNION_TYPE is not None and origin is _UNION_TYPE):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return len(args) == 1 and args[0] is ToolContext
    return False


@attrs.frozen
class _Conversion:
    """Valid JSON arguments to keyword arguments: each parameter's converter, then ``**kwargs``' one."""

    params: tuple[tuple[str, Converter], ...]
    names: frozenset[str]
    extra: Optional[Converter]

    def apply(self, input: Mapping[str, Any]) -> dict[str, Any]:
        kwargs = dict(input)
        for pname, conv in self.params:
            if pname in kwargs:
                kwargs[pname] = conv(kwargs[pname])
        extra = self.extra
        if extra is not None:
            for k in kwargs:
                if k not in self.names:
                    kwargs[k] = extra(kwargs[k])
        return kwargs


class FunctionTool(Tool):
    """A ``Tool`` made by ``@tool`` from a function (see the module docstring).

    Calling the object calls the function directly (handy in tests).
    """

    def __init__(
        self,
        func: Callable[..., object],
        *,
        name: Optional[str] = None,
        description: Optional[str] = None,
        concurrency_safe: bool = False,
        read_only: bool = False,
        resource_key: Optional[ResourceKey] = None,
        timeout: Optional[float] = None,
        requires_approval: bool = False,
        approval_timeout: Optional[float] = None,
        idempotent: bool = False,
        localns: Optional[Mapping[str, Any]] = None,
    ) -> None:
        if not callable(func):
            raise ConfigError(f"@tool needs a function, got {shown(func)}")
        fname = getattr(func, "__name__", type(func).__name__)
        self.name = name if name is not None else fname
        where = f"tool {shown(self.name)}"
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(f"@tool on {fname}: the tool name must be a non-empty str, got {shown(self.name)}")
        if inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func):
            raise ConfigError(f"{where}: tool functions must be synchronous (loopctl is thread-based)")
        doc = inspect.getdoc(func)
        text = description if description is not None else doc_description(doc)
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(f"{where}: a tool needs a description: add a docstring or pass description=")
        self.description = text.strip()
        timeout = seconds(timeout, f"{where}: timeout")
        approval_timeout = seconds(approval_timeout, f"{where}: approval_timeout")
        if not isinstance(requires_approval, bool):
            raise ConfigError(f"{where}: requires_approval must be a bool, got {shown(requires_approval)}")
        if resource_key is not None and not (isinstance(resource_key, str) or callable(resource_key)):
            raise ConfigError(f"{where}: resource_key must be a str or a callable(input), got {shown(resource_key)}")
        self.concurrency_safe = bool(concurrency_safe)
        self.read_only = bool(read_only)
        self.idempotent = bool(idempotent)
        self.timeout = timeout
        self.requires_approval = requires_approval
        self.approval_timeout = approval_timeout
        self._resource_key = resource_key
        self.func = func
        self.__wrapped__ = func
        self.__doc__ = func.__doc__
        self._build(func, doc, where, localns)

    def _build(
        self, func: Callable[..., object], doc: Optional[str], where: str, localns: Optional[Mapping[str, Any]]
    ) -> None:
        try:
            sig = inspect.signature(func)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: cannot read the signature: {exc}") from exc
        hints = resolve_hints(func, where, localns)
        docs = parse_args_section(doc)
        props: dict[str, Any] = {}
        required: list[str] = []
        convs: list[tuple[str, Optional[Converter]]] = []
        self._context_param: Optional[str] = None
        extra: object = False
        extra_conv: Optional[Converter] = None
        for pname, p in sig.parameters.items():
            pwhere = f"{where}, parameter {pname!r}"
            if p.kind is p.VAR_POSITIONAL or p.kind is p.POSITIONAL_ONLY:
                raise ConfigError(f"{pwhere}: tools take keyword arguments only (no *args or positional-only)")
            hint = hints.get(pname, inspect.Parameter.empty)
            if p.kind is p.VAR_KEYWORD:
                if hint is inspect.Parameter.empty or hint is Any:
                    extra = True
                else:
                    c = compile_annotation(hint, pwhere, localns=localns)
                    extra, extra_conv = c.schema, c.convert
                continue
            if hint is inspect.Parameter.empty:
                more = " (for a method or state, subclass Tool instead)" if pname in ("self", "cls") else ""
                raise ConfigError(f"{pwhere}: has no type annotation{more}")
            if _is_context(hint):
                if self._context_param is not None:
                    raise ConfigError(f"{pwhere}: only one parameter may take the ToolContext")
                self._context_param = pname
                continue
            if p.default is None:
                hint = Optional[hint]  # ``x: int = None`` means Optional on every Python
            c = compile_annotation(hint, pwhere, localns=localns)
            prop = dict(c.schema)
            if pname in docs and docs[pname]:
                prop["description"] = docs[pname]
            if p.default is p.empty:
                required.append(pname)
            else:
                d = json_default(p.default)
                if d is not NO_DEFAULT:
                    prop["default"] = d
            props[pname] = prop
            convs.append((pname, c.convert))
        self._schema: dict[str, Any] = {
            "type": "object",
            "properties": props,
            "required": required,
            "additionalProperties": extra,
        }
        self._accept = compile_schema(self._schema)
        self._conversion = _Conversion(
            tuple((n, c) for n, c in convs if c is not None), frozenset(props), extra_conv
        )

    # -- the Tool protocol -------------------------------------------------------

    def input_schema(self) -> Mapping[str, Any]:
        """The JSON Schema built from the type hints (a fresh copy of the top level)."""
        return dict(self._schema)

    def schema(self) -> ToolSchema:
        """What the model is told about this tool (one value shared by every loop using it).

        Made again only when ``name`` or ``description`` changed since.
        """
        made: Optional[ToolSchema] = self.__dict__.get("_made_schema")
        if made is None or made.name != self.name or made.description != self.description:
            made = self._made_schema = super().schema()
        return made

    def validate(self, input: Mapping[str, Any]) -> Optional[str]:
        """Check ``input`` against the schema; a message naming the bad field(s), or None."""
        if self._accept(input):
            return None
        return check(self._schema, input)

    def resource_key(self, input: Mapping[str, Any]) -> Optional[str]:
        """The ``resource_key`` option: a fixed str, or the callable's answer for ``input``."""
        key = self._resource_key
        if key is None or isinstance(key, str):
            return key
        try:
            return key(input)
        except Exception:  # a bad input fails validation later; plan it alone-ish
            return f"\x00unkeyable:{self.name}"

    def convert(self, input: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments for the function (``input`` must be valid)."""
        return self._conversion.apply(input)

    def call(self, input: Mapping[str, Any], ctx: ToolContext) -> object:
        """Convert ``input`` and call the function (the context injected if asked for)."""
        kwargs = self.convert(input)
        if self._context_param is not None:
            kwargs[self._context_param] = ctx
        return self.func(**kwargs)

    def invoke(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        """Validate, convert, call, convert the result; never raises."""
        problem = None if self._accept(input) else check(self._schema, input)
        if problem is not None:
            return ToolOutput.error(f"Invalid input for tool '{self.name}': {problem}")
        try:
            kwargs = self.convert(input)
        except Exception as exc:  # e.g. an attrs validator on a nested class
            return ToolOutput.error(f"Invalid input for tool '{self.name}': {type(exc).__name__}: {exc}")
        if self._context_param is not None:
            kwargs[self._context_param] = ctx
        try:
            return to_output(self.func(**kwargs))
        except ToolError as exc:
            return ToolOutput.error(f"Tool '{self.name}' failed: {exc}")
        except Exception as exc:
            return ToolOutput.error(f"Tool '{self.name}' raised {type(exc).__name__}: {exc}")

    def __call__(self, *args: object, **kwargs: object) -> Any:  # whatever the function returns
        return self.func(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<FunctionTool {self.name!r}>"


def _caller_locals() -> Optional[dict[str, Any]]:
    """The locals of the scope applying the decorator (two frames up).

    Lets string hints (``from __future__ import annotations``) name classes
    defined in the same function as the tool.
    """
    try:
        frame = sys._getframe(2)
    except (AttributeError, ValueError):  # pragma: no cover - other Pythons
        return None
    return dict(frame.f_locals) if frame.f_code.co_name != "<module>" else None


@overload
def tool(func: F) -> FunctionTool: ...


@overload
def tool(
    func: None = None,
    *,
    name: Optional[str] = None,
    description: Optional[str] = None,
    concurrency_safe: bool = False,
    read_only: bool = False,
    resource_key: Optional[ResourceKey] = None,
    timeout: Optional[float] = None,
    requires_approval: bool = False,
    approval_timeout: Optional[float] = None,
    idempotent: bool = False,
) -> Callable[[F], FunctionTool]: ...


def tool(
    func: Optional[Callable[..., object]] = None,
    *,
    name: Optional[str] = None,
    description: Optional[str] = None,
    concurrency_safe: bool = False,
    read_only: bool = False,
    resource_key: Optional[ResourceKey] = None,
    timeout: Optional[float] = None,
    requires_approval: bool = False,
    approval_timeout: Optional[float] = None,
    idempotent: bool = False,
) -> object:
    """Turn a typed, documented function into a ``Tool``.

    Use bare (``@tool``) or with options (``@tool(name="search", concurrency_safe=True)``).

    Args:
        name: the tool's name (default: the function's name).
        description: the tool's description (default: the docstring's text
            before its ``Args:``/``Returns:`` sections).
        concurrency_safe: calls may overlap other safe calls in a parallel wave.
        read_only: the tool changes nothing (informational; policies may use it).
        resource_key: calls sharing this key never run in the same wave; a
            str, or a callable ``(input) -> Optional[str]``.
        timeout: seconds after which a call gives up with a soft timeout error.
        requires_approval: every call waits for a person's approval
            (``handle.approve`` / ``handle.deny``) before it runs.
        approval_timeout: seconds a call may wait for that approval before
            it is denied ("approval timed out"); None defers to
            ``RunConfig.approval_timeout`` (default: wait for ever).
        idempotent: running a call twice has the effect of running it once, so
            a durable run (``CeleryRunRegistry(resume=...)``) may run again a
            call its lost worker had in flight; otherwise that call comes back
            to the model as an "interrupted, effect unknown" error result.

    Raises:
        ConfigError: an unsupported or missing annotation, no description,
            a bad option value.
    """
    options = dict(
        name=name,
        description=description,
        concurrency_safe=concurrency_safe,
        read_only=read_only,
        resource_key=resource_key,
        timeout=timeout,
        requires_approval=requires_approval,
        approval_timeout=approval_timeout,
        idempotent=idempotent,
    )
    if func is not None:
        return FunctionTool(func, localns=_caller_locals(), **options)  # type: ignore[arg-type]

    def decorate(f: Callable[..., object]) -> FunctionTool:
        return FunctionTool(f, localns=_caller_locals(), **options)  # type: ignore[arg-type]

    return decorate


__all__ = ["FunctionTool", "ResourceKey", "tool"]
