"""``MCPTool``: one tool of an MCP server as a loopctl ``Tool``.

Name, description and input schema come from the server's ``tools/list``
(the name with the optional prefix, and characters model APIs refuse
replaced by ``_``; the server is always called with its own name). A tool
the server marks ``readOnlyHint`` is ``read_only`` and ``concurrency_safe``
(it may overlap other calls in a parallel wave); others run alone. The
public ``timeout`` works as on any tool: the dispatcher runs the call under
it, and on expiry the call's cancel signal fires, which cancels the MCP
request (``notifications/cancelled``) like a run's cancel does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Optional, Protocol

import mcp_types as types

from loopctl.tools.base import Tool, ToolContext, ToolOutput

_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_MAX_NAME = 64


def local_name(prefix: str, remote: str) -> str:
    """The loopctl name of remote tool ``remote``: prefixed, API-safe, at most 64 chars."""
    return _NAME_UNSAFE.sub("_", prefix + remote)[:_MAX_NAME]


class ToolCaller(Protocol):
    """What a tool needs of its server (``MCPServer`` is one)."""

    name: str

    def call_tool(self, name: str, arguments: dict[str, Any], ctx: Optional[ToolContext] = None) -> ToolOutput:
        """Call tool ``name`` on the server."""
        ...


class MCPTool(Tool):
    """A tool served by an MCP server; ``call`` sends ``tools/call`` and waits.

    Attributes:
        server: the ``MCPServer`` it belongs to.
        remote_name: the tool's name on the server.
    """

    def __init__(self, server: ToolCaller, remote: types.Tool, prefix: str = "",
                 timeout: Optional[float] = None) -> None:
        self.server = server
        self.source = server  # a registry never lets another source's tool silently replace it
        self.remote_name = remote.name
        self.name = local_name(prefix, remote.name)
        self.description = remote.description or remote.title or ""
        schema = dict(remote.input_schema or {})
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        self._input_schema = schema
        hints = remote.annotations
        self.read_only = bool(hints is not None and hints.read_only_hint)
        self.concurrency_safe = self.read_only
        self.timeout = timeout

    def input_schema(self) -> Mapping[str, Any]:
        """The server's JSON Schema for the input."""
        return self._input_schema

    def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        """Call the tool on the server; cancel-aware, never raises for server failures."""
        return self.server.call_tool(self.remote_name, dict(input), ctx)

    def __repr__(self) -> str:
        remote = f" (remote name {self.remote_name!r})" if self.remote_name != self.name else ""
        return f"<MCPTool {self.name!r}{remote} of {self.server.name!r}>"


__all__ = ["MCPTool", "ToolCaller", "local_name"]
