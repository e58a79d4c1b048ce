"""The tool pipeline: middleware layers around the registry core.

A layer is a ``ToolMiddleware`` (or any callable ``(ctx, next) ->
ToolOutput``). The first layer registered is the outermost; each receives a
mutable ``DispatchContext`` and the ``next`` layer, and may rewrite
``ctx.tool_name`` / ``ctx.input``, call ``next(ctx)`` (zero or more times),
or short-circuit with its own ``ToolOutput``. The core looks the (possibly
rewritten) name up in the registry and invokes the tool; ``ctx.tool_name``
after the call is the *resolved* name. The chain is composed once at build
time, so per call it costs one function call per layer.

In a loop, a rewrite never gets around the loop's admission gate: the
dispatcher hands the core the gate (``DispatchContext.gate``), and the core
runs the call only as it was admitted (and approved), or, when a layer
changed its name or arguments, as the gate admits the changed call again
(validated against the tool's schema; refused with a soft error when it
now needs a person's approval, as a recovery correction is).

Layers run on whatever thread runs the call (the run's thread, or a worker
of the loop's pool when calls overlap): a layer with state must lock it.
Install with ``loop.with_pipeline(ToolPipeline.builder().with_middleware(m))``
(the loop adds its registry as the core); standalone, use
``ToolPipeline.builder().with_core(registry).build()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Optional, Tuple, Union

import attrs

from loopctl.checks import shown
from loopctl.errors import ConfigError
from loopctl.tools.base import Tool, ToolContext, ToolOutput
from loopctl.tools.registry import ToolRegistry
from loopctl.tools.timeout import call_with_timeout

Next = Callable[["DispatchContext"], ToolOutput]
#: The core's question before it runs a call: the tool and the arguments to run it with, or why not (a soft error).
Gate = Callable[["DispatchContext"], Union[Tuple[Tool, Mapping[str, Any]], str]]


@attrs.define(eq=False)
class DispatchContext:
    """One call as the middleware sees it (mutable: layers may rewrite it).

    Attributes:
        tool_name: the name the core will look up (rewritable).
        input: the arguments (rewritable).
        requested_name: the name the model asked for (read-only by convention).
        call_id: the model's id for this call.
        turn: the turn number.
        attempt: 0 for the first attempt, +1 per recovery retry.
        tool_context: the ``ToolContext`` the tool will receive (None standalone).
        registry: the registry the core looks names up in.
        gate: set by a loop: what the core asks before it runs the call (the
            call as admitted, or a layer's rewrite admitted again); None
            standalone, where the core looks the name up and runs it.
    """

    tool_name: str
    input: Mapping[str, Any]
    requested_name: str = ""
    call_id: str = ""
    turn: int = 0
    attempt: int = 0
    tool_context: Optional[ToolContext] = None
    registry: Optional[ToolRegistry] = None
    gate: Optional[Gate] = None

    @property
    def cancel(self) -> object:
        """The run's cancel signal (None when there is no tool context)."""
        return self.tool_context.cancel if self.tool_context is not None else None

    def lookup(self, name: Optional[str] = None) -> Optional[Tool]:
        """The registry's tool for ``name`` (default: the current ``tool_name``)."""
        if self.registry is None:
            return None
        return self.registry.get(self.tool_name if name is None else name)


class ToolMiddleware:
    """Base class for a pipeline layer; the default passes the call through."""

    def dispatch(self, ctx: DispatchContext, next: Next) -> ToolOutput:
        """Handle one call: rewrite ``ctx``, call ``next(ctx)``, or answer yourself."""
        return next(ctx)


MiddlewareLike = Union[ToolMiddleware, Callable[[DispatchContext, Next], ToolOutput]]


def not_found_text(name: str, registry: ToolRegistry) -> str:
    """The registry-miss soft error: ``Tool not found: x. Available: a, b``."""
    names = registry.names()
    shown = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "")
    return f"Tool not found: {name}. Available: {shown or 'none'}"


def invoke_tool(tool: Tool, input: Mapping[str, Any], ctx: Optional[ToolContext]) -> ToolOutput:
    """Invoke ``tool`` (never raises), under its own ``timeout`` when it has one."""
    if tool.timeout is not None:
        return call_with_timeout(tool.name, tool.timeout, ctx, lambda c: _guarded(tool, input, c))
    return _guarded(tool, input, ctx)


def _guarded(tool: Tool, input: Mapping[str, Any], ctx: Optional[ToolContext]) -> ToolOutput:
    try:
        out = tool.invoke(input, ctx)  # type: ignore[arg-type]
    except Exception as exc:  # invoke converts; this guards custom overrides
        return ToolOutput.error(f"Tool '{tool.name}' raised {type(exc).__name__}: {exc}")
    if not isinstance(out, ToolOutput):
        return ToolOutput.error(f"Tool '{tool.name}' invoke() returned {type(out).__name__}, not ToolOutput")
    return out


def core_dispatch(registry: ToolRegistry, ctx: DispatchContext, gated: bool = False) -> ToolOutput:
    """The innermost layer: registry lookup of ``ctx.tool_name`` (or the loop's gate), then invoke.

    ``gated``: the core of a loop's pipeline; a call that reaches it without
    the loop's gate (a layer passed on a context of its own) is refused.
    """
    gate = ctx.gate
    if gate is None and gated:
        return ToolOutput.error(
            f"Tool '{ctx.tool_name}': not run: a middleware layer passed the call on without the loop's "
            "admission gate (pass the DispatchContext it was given, or attrs.evolve it)"
        )
    if gate is not None:
        verdict = gate(ctx)
        if isinstance(verdict, str):
            return ToolOutput.error(verdict)
        return invoke_tool(verdict[0], verdict[1], ctx.tool_context)
    tool = registry.get(ctx.tool_name)
    if tool is None:
        return ToolOutput.error(not_found_text(ctx.tool_name, registry))
    return invoke_tool(tool, ctx.input, ctx.tool_context)


def _as_layer(mw: object) -> Callable[[DispatchContext, Next], ToolOutput]:
    fn = getattr(mw, "dispatch", None)
    if callable(fn):
        return fn  # type: ignore[no-any-return]
    if callable(mw):
        return mw
    raise ConfigError(f"middleware must have dispatch(ctx, next) or be callable(ctx, next), got {shown(mw)}")


def _compose(layers: list[Callable[[DispatchContext, Next], ToolOutput]], core: Next) -> Next:
    chain = core
    for layer in reversed(layers):
        chain = _bind(layer, chain)
    return chain


def _bind(layer: Callable[[DispatchContext, Next], ToolOutput], inner: Next) -> Next:
    def step(ctx: DispatchContext) -> ToolOutput:
        out = layer(ctx, inner)
        if not isinstance(out, ToolOutput):
            return ToolOutput.error(
                f"middleware {type(getattr(layer, '__self__', layer)).__name__} returned "
                f"{type(out).__name__}, not ToolOutput"
            )
        return out

    return step


class ToolPipeline:
    """Middleware around a registry; ``dispatch(ctx)`` runs one call through it."""

    def __init__(
        self, registry: ToolRegistry, middleware: tuple[MiddlewareLike, ...] = (), *, gated: bool = False
    ) -> None:
        """``gated``: a loop's pipeline, whose core runs only calls that carry the loop's gate."""
        if not isinstance(registry, ToolRegistry):
            raise ConfigError(f"a pipeline core must be a ToolRegistry, got {shown(registry)}")
        self.registry = registry
        self.middleware = tuple(middleware)
        reg = registry
        self._chain = _compose([_as_layer(m) for m in self.middleware], lambda c: core_dispatch(reg, c, gated))

    @staticmethod
    def builder() -> ToolPipelineBuilder:
        """A new builder without a core."""
        return ToolPipelineBuilder()

    def dispatch(self, ctx: DispatchContext) -> ToolOutput:
        """Run one call through every layer; a layer that raises gives a soft error."""
        if ctx.registry is None:
            ctx.registry = self.registry
        try:
            return self._chain(ctx)
        except Exception as exc:
            return ToolOutput.error(f"Tool '{ctx.tool_name}' failed in middleware: {type(exc).__name__}: {exc}")

    def call(self, name: str, input: Mapping[str, Any], context: Optional[ToolContext] = None) -> ToolOutput:
        """Standalone convenience: dispatch ``name(input)`` outside any loop."""
        call_id = context.call_id if context is not None else ""
        turn = context.turn if context is not None else 0
        return self.dispatch(DispatchContext(name, input, name, call_id, turn, 0, context, self.registry))

    def __repr__(self) -> str:
        names = ", ".join(type(m).__name__ for m in self.middleware)
        return f"<ToolPipeline [{names}] over {len(self.registry)} tools>"


class ToolPipelineBuilder:
    """Collects layers (first added = outermost); ``with_*`` return the builder."""

    def __init__(self) -> None:
        self._middleware: list[MiddlewareLike] = []
        self._core: Optional[ToolRegistry] = None

    def with_middleware(self, middleware: MiddlewareLike) -> ToolPipelineBuilder:
        """Add a layer inside the ones added before it.

        Raises:
            ConfigError: ``middleware`` has no ``dispatch`` and is not callable.
        """
        _as_layer(middleware)
        self._middleware.append(middleware)
        return self

    def with_core(self, registry: ToolRegistry) -> ToolPipelineBuilder:
        """Set the registry core (standalone use; ``with_pipeline`` refuses a builder with one)."""
        if not isinstance(registry, ToolRegistry):
            raise ConfigError(f"a pipeline core must be a ToolRegistry, got {shown(registry)}")
        self._core = registry
        return self

    @property
    def has_core(self) -> bool:
        """True once ``with_core`` was called."""
        return self._core is not None

    @property
    def middleware(self) -> tuple[MiddlewareLike, ...]:
        """The layers so far, outermost first."""
        return tuple(self._middleware)

    def build(self) -> ToolPipeline:
        """The pipeline over the core set by ``with_core``.

        Raises:
            ConfigError: no core was set.
        """
        if self._core is None:
            raise ConfigError("build() needs a core: call with_core(registry) first (or pass the builder to with_pipeline)")
        return ToolPipeline(self._core, tuple(self._middleware))

    def build_with_core(self, registry: ToolRegistry) -> ToolPipeline:
        """The pipeline over ``registry`` for a loop (what ``with_pipeline`` calls): its core is gated."""
        return ToolPipeline(registry, tuple(self._middleware), gated=True)


__all__ = [
    "DispatchContext",
    "Gate",
    "MiddlewareLike",
    "Next",
    "ToolMiddleware",
    "ToolPipeline",
    "ToolPipelineBuilder",
    "core_dispatch",
    "invoke_tool",
    "not_found_text",
]
