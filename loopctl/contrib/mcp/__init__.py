"""MCP servers as loopctl tools, from synchronous code (extra ``[mcp]``, Python >= 3.10).

``MCPServer.stdio(command, args=(), env=None, cwd=None)`` runs a server as a
subprocess; ``MCPServer.http(url, headers=None)`` reaches one over
streamable HTTP. ``server.tools(prefix="")`` returns loopctl ``Tool``s::

    with MCPServer.stdio("mcp-server-time") as time_server:
        loop = BareLoop(client, [*time_server.tools(), add])

Each server runs the SDK's asyncio client on its own ``loopctl-mcp-...``
thread; calls are cancellable like any tool. See ``docs/mcp.md``.
"""

from __future__ import annotations

try:
    import mcp as _mcp_sdk  # noqa: F401  (the extra; a clear message when it is missing)
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "loopctl.contrib.mcp needs the [mcp] extra (Python >= 3.10): pip install 'loopctl[mcp]'"
    ) from exc

from loopctl.contrib.mcp.content import block_text, result_output
from loopctl.contrib.mcp.errors import MCPServerError
from loopctl.contrib.mcp.server import MCPServer
from loopctl.contrib.mcp.tool import MCPTool

__all__ = ["MCPServer", "MCPServerError", "MCPTool", "block_text", "result_output"]
