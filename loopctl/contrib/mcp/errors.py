"""``MCPServerError`` and the one place foreign MCP/transport exceptions are read.

A server that cannot be started or reached raises ``MCPServerError`` (a
``LoopError``) naming the server (its command, or its URL without
credentials) and, for a stdio server, the tail of what it wrote to stderr.
Environment values and HTTP header values are never part of a message nor
of the stderr tail: the server registers them as secrets, masked here.
"""

from __future__ import annotations

import re
import sys
from typing import Optional
from urllib.parse import urlsplit, urlunsplit

from loopctl.errors import LoopError
from loopctl.text import masked_head, redact

_GROUP: tuple[type[BaseException], ...] = ()
if sys.version_info >= (3, 11):
    _GROUP = (BaseExceptionGroup,)  # noqa: F821 - a builtin since 3.11
else:  # pragma: no cover - anyio brings the backport on 3.10
    try:
        from exceptiongroup import BaseExceptionGroup as _Backport

        _GROUP = (_Backport,)
    except ImportError:
        pass


class MCPServerError(LoopError):
    """An MCP server could not be started, reached or kept running.

    Attributes:
        server: the server's description (command line, or URL without credentials).
        stderr_tail: the last lines the server wrote to stderr ("" if none / HTTP).
    """

    def __init__(self, message: str, server: str, stderr_tail: str = "") -> None:
        self.server = server
        self.stderr_tail = redact(stderr_tail)  # the server's own words: untrusted, masked like the message
        if stderr_tail:
            message += "\nserver stderr (last lines):\n" + _indent(self.stderr_tail)
        super().__init__(message)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def root_cause(exc: BaseException) -> BaseException:
    """The first leaf of an exception group (task groups wrap what failed)."""
    while _GROUP and isinstance(exc, _GROUP) and getattr(exc, "exceptions", ()):
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    return exc


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` of the root cause, one line, bounded."""
    leaf = root_cause(exc)
    text = " ".join(str(leaf).split())
    name = type(leaf).__name__
    return f"{name}: {masked_head(text, 300)}" if text else name


def safe_url(url: str) -> str:
    """``url`` without userinfo, query or fragment (they may carry tokens)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<invalid url>"
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def thread_label(text: str) -> str:
    """A short label for a thread name."""
    return _UNSAFE.sub("_", text)[:40] or "server"


def start_failed(server: str, exc: Optional[BaseException], tail: str, why: str = "") -> MCPServerError:
    """The error for a server that did not start (its cause chained by the caller)."""
    reason = why or (describe_exception(exc) if exc is not None else "unknown reason")
    return MCPServerError(f"MCP server {server!r} failed to start: {reason}", server, tail)


__all__ = ["MCPServerError", "describe_exception", "root_cause", "safe_url", "start_failed", "thread_label"]
