"""ToolRegistry: tools by name, in registration order.

Refreshers let a tool source (an MCP server whose tool list changes, say)
update the registry between turns: the driver calls ``refresh()`` on the
run's thread before each model turn, never during a tool phase.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Callable, Optional

from loopctl.messages import ToolSchema
from loopctl.tools.base import Tool

log = logging.getLogger("loopctl")


class ToolRegistry:
    """Tools by name. ``register`` replaces a same-named tool in place."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._schemas: Optional[tuple[ToolSchema, ...]] = None
        self._asks: Optional[bool] = None  # any tool with requires_approval (cached)
        self._refreshers: list[Callable[[ToolRegistry], None]] = []
        #: True once a refresher was added (read before every model turn: a plain attribute).
        self.has_refreshers = False
        for t in tools:
            self.register(t)

    def register(self, tool: Tool) -> Tool:
        """Add ``tool``; a tool of the same name is replaced, keeping its position."""
        if not isinstance(tool, Tool):
            raise TypeError(f"register() takes a Tool, got {type(tool).__name__} {tool!r:.60}")
        if not tool.name:
            raise ValueError(f"tool {tool!r} has an empty name")
        if tool.name in self._tools:
            log.warning("tool %r replaced in registry", tool.name)
        self._tools[tool.name] = tool
        self._schemas = None
        self._asks = None
        return tool

    def unregister(self, name: str) -> bool:
        """Remove the tool named ``name``; False when there is none."""
        if self._tools.pop(name, None) is None:
            return False
        self._schemas = None
        self._asks = None
        return True

    def add_refresher(self, refresher: Callable[[ToolRegistry], None]) -> None:
        """Call ``refresher(registry)`` before each model turn of every run.

        It may register or unregister tools; the turn's request and the
        machine's list of available tools follow. It runs on the run's thread
        outside the run's fence (a cancel never waits for it); an exception is
        logged and ignored.
        """
        self._refreshers.append(refresher)
        self.has_refreshers = True

    def refresh(self) -> None:
        """Run every refresher (the driver calls this before each model turn)."""
        for refresher in list(self._refreshers):
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
        """Tool names as a set (cheap membership tests)."""
        return frozenset(self._tools)

    def schemas(self) -> tuple[ToolSchema, ...]:
        """Every tool's schema, in registration order (cached)."""
        if self._schemas is None:
            self._schemas = tuple(t.schema() for t in self._tools.values())
        return self._schemas

    @property
    def has_approval_tools(self) -> bool:
        """True when some tool's every call needs a person's approval (cached)."""
        if self._asks is None:
            self._asks = any(getattr(t, "requires_approval", False) for t in self._tools.values())
        return self._asks

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)


__all__ = ["ToolRegistry"]
