"""Where a server is: a command to run (stdio) or a URL (streamable HTTP).

Each spec knows how to describe itself for messages (``describe()``: the
command line, or the URL without credentials) and how to open its
transport on an ``AsyncExitStack`` (the SDK's ``stdio_client`` or
``streamable_http_client``). Values of ``env`` and ``headers`` never appear
in a description or a repr, and ``secrets()`` names them for the one
redaction every outlet goes through (the facade registers them).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, Optional, Union

import attrs

from loopctl.contrib.mcp.errors import safe_url
from loopctl.contrib.mcp.stderr import StderrSink
from loopctl.providers.secrets import header_secrets

#: Connect/write timeout and the (long) read timeout of the HTTP client, seconds.
HTTP_TIMEOUT_S = 30.0
HTTP_READ_TIMEOUT_S = 300.0


def _hidden(value: object) -> str:
    return "<hidden>" if value else "None"


@attrs.frozen
class StdioSpec:
    """A server run as a subprocess speaking MCP on its stdin/stdout."""

    command: str
    args: tuple[str, ...] = ()
    env: Optional[Mapping[str, str]] = attrs.field(default=None, repr=_hidden)
    cwd: Optional[Union[str, Path]] = None

    def describe(self) -> str:
        """The command line."""
        return shlex.join([self.command, *self.args])

    def label(self) -> str:
        """A short name: the command's base name."""
        return Path(self.command).name or "stdio"

    def secrets(self) -> list[str]:
        """The values given in ``env``, but for those the SDK passes the server anyway.

        The SDK gives every server a few variables of this process (``PATH``,
        ``HOME``, ...); the same value given again in ``env`` is that, not a
        secret (masking it would hide every path under the home directory).
        """
        if not self.env:
            return []
        from mcp.client.stdio import get_default_environment

        inherited = get_default_environment()
        return [str(v) for k, v in self.env.items() if inherited.get(k) != v]

    async def open(self, stack: AsyncExitStack, stderr: Optional[StderrSink]) -> Any:
        """Spawn the process; its (read, write) streams."""
        from mcp import StdioServerParameters, stdio_client

        params = StdioServerParameters(
            command=self.command,
            args=list(self.args),
            env=dict(self.env) if self.env is not None else None,
            cwd=self.cwd,
        )
        if stderr is None:
            return await stack.enter_async_context(stdio_client(params))
        try:
            return await stack.enter_async_context(stdio_client(params, errlog=stderr.errlog))
        finally:
            stderr.release_write_end()  # the child has its own copy now (or never will)


@attrs.frozen
class HttpSpec:
    """A server reached over streamable HTTP."""

    url: str = attrs.field(repr=safe_url)
    headers: Optional[Mapping[str, str]] = attrs.field(default=None, repr=_hidden)

    def describe(self) -> str:
        """The URL without userinfo, query or fragment."""
        return safe_url(self.url)

    def label(self) -> str:
        """A short name: the URL's host."""
        return safe_url(self.url).split("://", 1)[-1].split("/", 1)[0] or "http"

    def secrets(self) -> list[str]:
        """The header values that may authorise (all but the plain ones, like ``Accept``)."""
        return header_secrets(self.headers or {})

    async def open(self, stack: AsyncExitStack, stderr: Optional[StderrSink]) -> Any:
        """Open the HTTP client and the transport; the (read, write) streams."""
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        client = httpx2.AsyncClient(
            headers=dict(self.headers) if self.headers else None,
            timeout=httpx2.Timeout(HTTP_TIMEOUT_S, read=HTTP_READ_TIMEOUT_S),
        )
        await stack.enter_async_context(client)
        return await stack.enter_async_context(streamable_http_client(self.url, http_client=client))


Spec = Union[StdioSpec, HttpSpec]


def stdio_spec(
    command: str,
    args: Sequence[str] = (),
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[Union[str, Path]] = None,
) -> StdioSpec:
    """A validated ``StdioSpec``.

    Raises:
        ValueError: an empty command, or ``args`` given as one string.
    """
    if not isinstance(command, str) or not command.strip():
        raise ValueError(f"MCPServer.stdio needs a command, got {command!r}")
    if isinstance(args, str):
        raise ValueError(f"MCPServer.stdio args must be a sequence of strings, not the string {args!r}")
    return StdioSpec(command, tuple(str(a) for a in args), dict(env) if env is not None else None, cwd)


def http_spec(url: str, headers: Optional[Mapping[str, str]] = None) -> HttpSpec:
    """A validated ``HttpSpec``.

    Raises:
        ValueError: the URL is not http(s).
    """
    if not isinstance(url, str) or not url.lower().startswith(("http://", "https://")):
        raise ValueError(f"MCPServer.http needs an http(s) URL, got {safe_url(str(url))!r}")
    return HttpSpec(url, dict(headers) if headers else None)


__all__ = ["HttpSpec", "Spec", "StdioSpec", "http_spec", "stdio_spec"]
