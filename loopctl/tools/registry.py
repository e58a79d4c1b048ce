"""ToolRegistry: tools by name, in registration order; no silent replacement.

A tool's ``source`` says what provides it (None: the application's own
code; an MCP server for its tools). The registry is the one place that
decides whether a same-named tool may replace another:

- from the same source, it replaces it in place (your own code
  re-registering, a server updating its tool; a local replacement logs a
  warning);
- from another source, it is refused with ``ToolConflict`` naming both,
  unless the caller passes ``override=True`` (then it replaces it, with a
  warning) - the way out is a prefix on the other source's names;
- a tool that ``requires_approval`` is never replaced by another source's
  tool, not even with ``override``: nothing can shadow an approval gate;
- a source updating its own gated tool never lowers the gate: the new tool
  keeps ``requires_approval`` (and ``approval_timeout``), so a gate the
  application set on a server's tool survives the server's updates.

Refreshers let a tool source (an MCP server whose tool list changes, say)
update the registry between turns: the driver calls ``refresh()`` on the
run's thread before each model turn, never during a tool phase.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Callable, Optional

from loopctl.errors import ConfigError
from loopctl.messages import ToolSchema
from loopctl.timeouts import seconds
from loopctl.tools.base import Tool

log = logging.getLogger("loopctl")


class ToolConflict(ConfigError):
    """A tool would replace a same-named tool of another source; the message names both.

    Attributes:
        name: the contested name.
        existing: the registered tool (described).
        incoming: the tool that was refused (described).
    """

    def __init__(self, message: str, name: str, existing: str, incoming: str) -> None:
        super().__init__(message)
        self.name = name
        self.existing = existing
        self.incoming = incoming


def describe_tool(tool: Tool) -> str:
    """Who provides ``tool``, in words (``local tool 'x'``, or its source's repr)."""
    if getattr(tool, "source", None) is None:
        return f"local tool {tool.name!r}"
    return repr(tool)


def replacement_problem(old: Tool, new: Tool, override: bool) -> Optional[str]:
    """Why ``new`` may not replace the same-named ``old`` (None: it may)."""
    if old is new or getattr(old, "source", None) is getattr(new, "source", None):
        return None
    both = f"{describe_tool(new)} has the same name as {describe_tool(old)}"
    if getattr(old, "requires_approval", False):
        return f"{both}, which requires approval and can never be replaced by another source's tool; use a prefix"
    if not override:
        return f"{both}; use a prefix for one of them, or override=True to replace it"
    return None


def keep_gate(old: Tool, new: Tool) -> None:
    """Give ``new``, replacing ``old`` of the same source, the approval gate set on ``old``.

    Only the application decides which tools wait for a person: a source
    (an MCP server re-listing its tool) cannot lift a gate by sending a new
    version. The application's own tools (no source) are its to change. A
    tool that cannot take the gate (read-only attributes) raises here, so
    the replacement never happens.
    """
    source = getattr(new, "source", None)
    if old is new or source is None or source is not getattr(old, "source", None):
        return
    if getattr(old, "requires_approval", False):
        _gate(new, getattr(old, "approval_timeout", None))


def _gate(tool: Tool, approval_timeout: Optional[float]) -> None:
    if getattr(tool, "requires_approval", False):
        return
    tool.requires_approval = True
    if getattr(tool, "approval_timeout", None) is None:
        tool.approval_timeout = approval_timeout


class ToolRegistry:
    """Tools by name. ``register`` replaces a same-named tool in place."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._schemas: Optional[tuple[ToolSchema, ...]] = None
        self._names: Optional[frozenset[str]] = None
        self._generation = 0  # bumped whenever the tools change
        self._refreshers: tuple[Callable[[ToolRegistry], None], ...] = ()  # few, and most loops have none
        #: True once a refresher was added (read before every model turn: a plain attribute).
        self.has_refreshers = False
        # Gates of source tools the source dropped, by (name, source): one the
        # source lists again comes back gated (made on first use: most loops never drop one).
        self._dropped_gates: Optional[dict[tuple[str, int], Optional[float]]] = None
        for t in tools:
            self.register(t)

    def check(self, tool: Tool, *, override: bool = False) -> None:
        """Raise ``ToolConflict`` when ``register(tool, override=override)`` would be refused."""
        old = self._tools.get(tool.name)
        if old is not None:
            problem = replacement_problem(old, tool, override)
            if problem is not None:
                raise ToolConflict(problem, tool.name, describe_tool(old), describe_tool(tool))

    def register(self, tool: Tool, *, override: bool = False) -> Tool:
        """Add ``tool``; a same-named tool of the same source is replaced, keeping its position.

        Raises:
            ToolConflict: a same-named tool of another source is registered
                (and ``override`` is False, or it requires approval).
            ConfigError: the tool's ``timeout`` or ``approval_timeout`` is
                not a finite positive number of seconds (or None).
        """
        if not isinstance(tool, Tool):
            raise TypeError(f"register() takes a Tool, got {type(tool).__name__} {tool!r:.60}")
        if not tool.name:
            raise ValueError(f"tool {tool!r} has an empty name")
        # A Tool subclass sets these as plain attributes: checked here, as @tool checks its own.
        seconds(getattr(tool, "timeout", None), f"tool {tool.name!r}: timeout")
        seconds(getattr(tool, "approval_timeout", None), f"tool {tool.name!r}: approval_timeout")
        self.check(tool, override=override)
        old = self._tools.get(tool.name)
        if old is not None:
            keep_gate(old, tool)
        elif self._dropped_gates is not None and getattr(tool, "source", None) is not None:
            key = (tool.name, id(tool.source))
            if key in self._dropped_gates:
                _gate(tool, self._dropped_gates[key])
                del self._dropped_gates[key]
        if old is not None and old is not tool and getattr(old, "source", None) is None:
            log.warning("tool %r replaced in registry", tool.name)
        elif old is not None and getattr(old, "source", None) is not getattr(tool, "source", None):
            log.warning("%s replaced by %s (override)", describe_tool(old), describe_tool(tool))
        self._tools[tool.name] = tool
        self._forget_derived()
        return tool

    def unregister(self, name: str, *, source: object = None) -> bool:
        """Remove the tool named ``name``; False when there is none.

        With ``source``, only a tool of that source is removed (a source
        dropping its tool never removes another source's same-named tool).
        """
        old = self._tools.get(name)
        if old is None or (source is not None and getattr(old, "source", None) is not source):
            return False
        old_source = getattr(old, "source", None)
        if old_source is not None and getattr(old, "requires_approval", False):
            # Keyed by id(source): a later source given a recycled id inherits the gate (more gated, never less).
            if self._dropped_gates is None:
                self._dropped_gates = {}
            self._dropped_gates[(name, id(old_source))] = getattr(old, "approval_timeout", None)
        del self._tools[name]
        self._forget_derived()
        return True

    def _forget_derived(self) -> None:
        # The tools changed: what is computed from them is made again on next use.
        self._generation += 1
        self._schemas = None
        self._names = None

    def add_refresher(self, refresher: Callable[[ToolRegistry], None]) -> None:
        """Call ``refresher(registry)`` before each model turn of every run.

        It may register or unregister tools; the turn's request and the
        machine's list of available tools follow. It runs on the run's thread
        outside the run's fence (a cancel never waits for it); an exception is
        logged and ignored.
        """
        self._refreshers = (*self._refreshers, refresher)
        self.has_refreshers = True

    def refresh(self) -> None:
        """Run every refresher (the driver calls this before each model turn)."""
        for refresher in self._refreshers:
            try:
                refresher(self)
            except Exception:
                log.exception("tool refresher %r raised; the tool list is unchanged by it", refresher)

    def get(self, name: str) -> Optional[Tool]:
        """The tool named ``name``, or None."""
        return self._tools.get(name)

    def names(self) -> list[str]:
        """Tool names, sorted."""
        return sorted(self._tools)

    def name_set(self) -> frozenset[str]:
        """Tool names as a set (cheap membership tests; cached, so every run shares one)."""
        if self._names is None:
            self._names = frozenset(self._tools)
        return self._names

    def schemas(self) -> tuple[ToolSchema, ...]:
        """Every tool's schema, in registration order (cached).

        A tool's ``schema()`` is its own code, which the driver calls outside
        the run's fence: a list made while the tools changed (a run abandoned
        inside it, another run refreshing them) is returned, never kept.
        """
        made = self._schemas
        if made is None:
            generation = self._generation
            made = tuple(t.schema() for t in tuple(self._tools.values()))
            if generation == self._generation:
                self._schemas = made
        return made

    @property
    def has_approval_tools(self) -> bool:
        """True when some tool's every call needs a person's approval.

        Read anew at each dispatch, never cached: a gate set on a registered
        tool (``registry.get("x").requires_approval = True``) holds from the next call.
        """
        return any(getattr(t, "requires_approval", False) for t in tuple(self._tools.values()))

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)


__all__ = ["ToolConflict", "ToolRegistry", "describe_tool", "keep_gate", "replacement_problem"]
