"""Which of a server's tools may enter a registry: the MCP side of "no silent replacement".

``claimable`` takes one listing and the registry: two of the server's tools
whose names map to one loopctl name (``a.b`` and ``a_b``) collide, and a
name another source's tool holds is refused by the registry's own rule
(``ToolRegistry.check``: never over an approval-gated tool, otherwise only
with ``override``). At ``attach``/``sync`` a collision raises
``ToolConflict`` naming both and nothing is registered; on a refresh
between turns the colliding tool is skipped with a warning, so a server
renaming its tools can never take another tool's place.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Optional

from loopctl.contrib.mcp.tool import MCPTool
from loopctl.tools.registry import ToolConflict, ToolRegistry, describe_tool


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


__all__ = ["claimable", "register_tools"]
