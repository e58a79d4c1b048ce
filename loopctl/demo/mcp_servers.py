"""``loopctl run --mcp "COMMAND ARGS"``: MCP servers whose tools join the demo agent.

Each ``--mcp`` value is a command line (split like a shell would) run as a
stdio MCP server through ``loopctl.contrib.mcp`` (extra ``[mcp]``,
imported only when the option is used). If one fails to start, the ones
already started are closed and the error (naming the command and its
stderr tail) ends the command.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from loopctl.errors import ConfigError


def open_mcp_servers(commands: Sequence[str]) -> tuple[list[Any], list[Any]]:
    """Start one stdio MCP server per command line; (servers, their tools).

    Raises:
        ConfigError: ``mcp`` is not installed, or a command line is empty.
        LoopError: a server did not start (``MCPServerError``).
    """
    if not commands:
        return [], []
    try:
        from loopctl.contrib.mcp import MCPServer
    except ImportError as exc:
        raise ConfigError("--mcp needs the MCP extra: pip install 'loopctl[mcp]' (Python >= 3.10)") from exc
    servers: list[Any] = []
    tools: list[Any] = []
    try:
        for line in commands:
            argv = shlex.split(line)
            if not argv:
                raise ConfigError(f"--mcp needs a command line, got {line!r}")
            server = MCPServer.stdio(argv[0], argv[1:])
            servers.append(server)
            tools.extend(server.tools())
    except BaseException:
        for server in servers:
            server.close()
        raise
    return servers, tools


def close_mcp_servers(servers: Sequence[Any]) -> None:
    """Close every server (idempotent)."""
    for server in servers:
        server.close()


__all__ = ["close_mcp_servers", "open_mcp_servers"]
