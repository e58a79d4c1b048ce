"""A small MCP server (the SDK's server API) for what real servers cannot show.

Run as ``python suite_server.py [--fail-start] [--http-fd FD]`` (stdio by
default). Its tools:

- ``echo(text)``: the text back;
- ``block(tag)``: waits until the client cancels it; writes ``block started
  <tag>`` to stderr when it begins (tests wait for that line through the
  client's stderr logger) and counts the cancellation it receives;
- ``wait_block(tag, cancelled=False)``: returns once ``block(tag)`` has
  started (or been cancelled) — the synchronisation point over HTTP;
- ``cancellations()``: how many ``block`` calls were cancelled, and their tags;
- ``crash()``: writes ``crashing`` to stderr and exits mid-call (code 3);
- ``fail(reason)``: an ``isError`` result;
- ``image()``: a text block and a 1x1 PNG image block;
- ``grow()``: registers tool ``late`` and sends ``tools/list_changed``;
- ``pid()``: the process id (a restart changes it);
- ``env(name)``: an environment variable's value (a server echoing a secret);
- ``header(name, credentials_only=False)``: an HTTP request header's value,
  or only its part after the auth scheme (over HTTP; "" over stdio).

``--http-fd FD`` serves streamable HTTP (uvicorn) at ``/mcp`` on a listening
socket the test bound to 127.0.0.1 and passed down (no port race).
``--fail-start`` writes a config error to stderr and exits 2 before
speaking MCP. ``--say-env NAME`` first writes ``NAME=<its value>`` to stderr.
"""

from __future__ import annotations

import argparse
import base64
import os
import sys

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ImageContent, TextContent

PNG_1X1 = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)

server = MCPServer("loopctl-suite", version="1.0")
cancelled_tags: list[str] = []
events: dict[tuple[str, str], anyio.Event] = {}


def event(kind: str, tag: str) -> anyio.Event:
    return events.setdefault((kind, tag), anyio.Event())


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@server.tool(description="Echo the text back.")
def echo(text: str) -> str:
    return text


@server.tool(description="Block until the client cancels the call.")
async def block(tag: str) -> str:
    say(f"block started {tag}")
    event("started", tag).set()
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        cancelled_tags.append(tag)
        say(f"block cancelled {tag}")
        event("cancelled", tag).set()
        raise
    return "unreachable"


@server.tool(description="Wait until block(tag) has started, or (cancelled=true) was cancelled.")
async def wait_block(tag: str, cancelled: bool = False) -> str:
    with anyio.fail_after(10):
        await event("cancelled" if cancelled else "started", tag).wait()
    return "cancelled" if cancelled else "started"


@server.tool(description="How many block calls were cancelled, and their tags.")
def cancellations() -> str:
    return f"{len(cancelled_tags)}: {','.join(cancelled_tags)}"


@server.tool(description="Exit the server process in the middle of the call.")
def crash() -> str:
    say("crashing")
    os._exit(3)


@server.tool(description="Fail with an isError result.")
def fail(reason: str) -> str:
    raise ToolError(f"failed on purpose: {reason}")


@server.tool(description="Return a text block and a 1x1 PNG image.")
def image() -> list[TextContent | ImageContent]:
    png = base64.b64encode(PNG_1X1).decode("ascii")
    return [TextContent(type="text", text="a red dot:"), ImageContent(type="image", data=png, mime_type="image/png")]


@server.tool(description="Add the tool 'late' and announce the new tool list.")
async def grow(ctx: Context) -> str:
    if server._tool_manager.get_tool("late") is None:

        def late() -> str:
            return "late tool here"

        server.add_tool(late, name="late", description="A tool added at run time.")
    await ctx.session.send_tool_list_changed()
    return "grown"


@server.tool(description="The server's process id.")
def pid() -> int:
    return os.getpid()


@server.tool(description="An environment variable's value.")
def env(name: str) -> str:
    return os.environ.get(name, "")


@server.tool(description="An HTTP request header's value, or only its credentials after the auth scheme.")
def header(name: str, ctx: Context, credentials_only: bool = False) -> str:
    request = ctx.request_context.request
    value = request.headers.get(name, "") if request is not None else ""
    return value.split(None, 1)[-1] if credentials_only else value


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-start", action="store_true")
    parser.add_argument("--say-env", default=None, help="write NAME=<value> to stderr first")
    parser.add_argument("--http-fd", type=int, default=None,
                        help="serve streamable HTTP on this inherited, listening socket")
    args = parser.parse_args()
    if args.say_env:
        say(f"{args.say_env}={os.environ.get(args.say_env, '')}")
    if args.fail_start:
        say("suite_server: reading config")
        say("boom: cannot open /nonexistent/suite.toml")
        sys.exit(2)
    if args.http_fd is not None:
        import uvicorn

        app = server.streamable_http_app()
        config = uvicorn.Config(app, fd=args.http_fd, log_level="warning")
        anyio.run(uvicorn.Server(config).serve)
    else:
        server.run()


if __name__ == "__main__":
    main()
