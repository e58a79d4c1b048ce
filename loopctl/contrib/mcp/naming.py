"""Which of a server's tools may enter a registry: the MCP side of "no silent replacement".

``claimable`` takes one listing and the registry: two of the server's tools
whose names map to one loopctl name (``a.b`` and ``a_b``) collide, and a
name another source's tool holds is refused by the registry's own rule
(``ToolRegistry.check``: never over an approval-gated tool, otherwise only
with ``override``). At ``attach``/``sync`` a collision raises
``ToolConflict`` naming both and nothing is registered; on a refresh
between turns the colliding tool is skipped with a warning, so a server
renaming its tools can never take another tool's place.

``Attachment`` is one ``attach``: ``override=True`` is the user's consent
for the names that collide *then*, no more. A refresh never overrides (a
later rename cannot reach a tool the user never offered), and a tool the
consent displaced is registered again when the server drops that name.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Optional, Protocol

from loopctl.contrib.mcp.tool import MCPTool
from loopctl.tools.base import Tool
from loopctl.tools.registry import ToolConflict, ToolRegistry, describe_tool


class Lister(Protocol):
    """What an attachment needs of its server (``MCPServer`` is one)."""

    name: str
    logger: logging.Logger

    @property
    def tools_changed(self) -> bool:
        """A new tool list was announced and not read yet."""
        ...

    @property
    def is_closed(self) -> bool:
        """The server was closed."""
        ...

    def tools(self, prefix: str = "", *, timeout: Optional[float] = None) -> list[MCPTool]:
        """The server's current tools."""
        ...


def claimable(
    listed: Sequence[MCPTool], registry: ToolRegistry, override: bool, skip_to: Optional[logging.Logger]
) -> list[MCPTool]:
    """The listed tools the server may register, in its order.

    Args:
        listed: the server's tools (``MCPServer.tools(prefix)``).
        registry: where they would go.
        override: the user allows replacing another source's tool (never an
            approval-gated one); of two colliding server tools, the first wins.
        skip_to: None raises on a collision; a logger skips the tool and warns there.

    Raises:
        ToolConflict: a collision, when ``skip_to`` is None.
    """
    chosen: list[MCPTool] = []
    seen: dict[str, MCPTool] = {}
    for t in listed:
        first = seen.get(t.name)
        try:
            if first is not None:
                if override:
                    continue  # the first listed keeps the name
                raise ToolConflict(
                    f"{describe_tool(t)} has the same name as {describe_tool(first)} "
                    "(both map to one loopctl name); use override=True to keep the first",
                    t.name, describe_tool(first), describe_tool(t))
            registry.check(t, override=override)
        except ToolConflict as exc:
            if skip_to is None:
                raise
            skip_to.warning("MCP tool skipped: %s", exc)
            continue
        seen[t.name] = t
        chosen.append(t)
    return chosen


def register_tools(registry: ToolRegistry, tools: Sequence[MCPTool], override: bool) -> list[str]:
    """Register the tools that are new or changed (schema, timeout, source); their names."""
    added: list[str] = []
    for t in tools:
        old = registry.get(t.name)
        if old is None or old.schema() != t.schema() or old.timeout != t.timeout or old.source is not t.source:
            registry.register(t, override=override)
            added.append(t.name)
    return added


class Attachment:
    """One ``MCPServer.attach``: registers the server's tools, then refreshes them between turns.

    Attributes:
        provided: the names this attachment registered (what a refresh may unregister).
        displaced: another source's tools that ``override=True`` replaced at
            attach, by name; each is registered again when the server drops its name.
    """

    def __init__(self, server: Lister, prefix: str, timeout: Optional[float]) -> None:
        self.server = server
        self.prefix = prefix
        self.timeout = timeout
        self.provided: set[str] = set()
        self.displaced: dict[str, Tool] = {}

    def attach(self, registry: ToolRegistry, override: bool) -> list[str]:
        """Register the server's tools now (``ToolConflict`` as in ``sync``); the names registered."""
        server = self.server
        chosen = claimable(server.tools(self.prefix, timeout=self.timeout), registry, override, None)
        for t in chosen:
            old = registry.get(t.name)
            if old is not None and getattr(old, "source", None) is not server:
                self.displaced[t.name] = old
        added = register_tools(registry, chosen, override)
        self.provided = {t.name for t in chosen}
        return added

    def __call__(self, registry: ToolRegistry) -> None:
        """The refresher: after a ``list_changed``, register the new list, unregister the dropped names."""
        server = self.server
        if not server.tools_changed or server.is_closed:
            return
        # Never override here: the consent given at attach covered the names colliding then.
        now = claimable(server.tools(self.prefix, timeout=self.timeout), registry, False, server.logger)
        register_tools(registry, now, False)
        names = {t.name for t in now}
        for gone in self.provided - names:
            if registry.unregister(gone, source=server):
                self._restore(registry, gone)
        self.provided = names

    def _restore(self, registry: ToolRegistry, name: str) -> None:
        old = self.displaced.pop(name, None)
        if old is not None and name not in registry:
            registry.register(old)
            self.server.logger.info("%s is registered again: server %r dropped its tool of that name",
                                    describe_tool(old), self.server.name)


__all__ = ["Attachment", "claimable", "register_tools"]
