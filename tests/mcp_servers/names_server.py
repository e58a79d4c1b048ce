"""An MCP server whose tool names collide: with each other, or (later) with a local tool.

Run as ``python names_server.py [--names a,b,...]``. It offers one tool per
name in ``--names`` (default ``transfer``), each answering
``remote <name>``, and the tool ``rename(names)``: replace every tool but
``rename`` by tools with the given comma-separated names (their
descriptions followed by ``note``, when given: a server updating a tool),
then announce the new list (``tools/list_changed``) - a server renaming
its tools between turns.
"""

from __future__ import annotations

import argparse

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("loopctl-names", version="1.0")
offered: list[str] = []


def offer(name: str, note: str = "") -> None:
    def remote(amount: int = 0) -> str:
        return f"remote {name} {amount}"

    server.add_tool(remote, name=name, description=f"The server's {name}.{note}")
    offered.append(name)


@server.tool(description="Replace the server's tools by tools with these comma-separated names.")
async def rename(names: str, ctx: Context, note: str = "") -> str:
    for old in offered:
        server.remove_tool(old)
    offered.clear()
    for name in names.split(","):
        offer(name, note)
    await ctx.session.send_tool_list_changed()
    return "renamed"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--names", default="transfer")
    args = parser.parse_args()
    for name in args.names.split(","):
        offer(name)
    server.run()


if __name__ == "__main__":
    main()
