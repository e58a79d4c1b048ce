"""``MCPServer``: an MCP server's tools for synchronous code.

The facade over one server (a stdio command or a streamable-HTTP URL). It
owns the ``LoopThread`` (started on first use, joined by ``close()``) and
the current ``Connection``; loopctl's tool threads call ``call_tool``, which
submits the request to the loop and waits for the answer or the call's
cancel signal, whichever comes first. Rules it keeps:

- A cancel (run cancel or tool timeout) cancels the request's scope on the
  loop, so the SDK sends ``notifications/cancelled``; the caller returns
  after at most ``CANCEL_FLUSH_S`` more, and the connection stays usable.
- Failures of a call are soft errors (``ToolOutput.error``): ``isError``
  results, error responses, a server that exits mid-call. A lost
  connection is reopened by the next call (a stdio server is started again),
  at most ``max_restarts`` times in a row without a successful call.
- A server that cannot start fails ``connect()`` / ``__enter__`` /
  ``tools()`` with ``MCPServerError`` naming the command and its stderr tail.
- The values of ``env`` and ``headers`` are registered secrets while the
  server lives: a server echoing one (stderr, a result, an error) shows
  ``<redacted>`` at every outlet.
- A ``notifications/tools/list_changed`` marks the listing stale;
  ``tools()`` re-reads it then (and after a reconnect).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import weakref
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional, TypeVar, Union

import mcp_types as types
from mcp.shared.exceptions import MCPError

from loopctl.contrib.mcp.connection import CallCancelled, CallHandle, Connection, is_connection_lost
from loopctl.contrib.mcp.content import result_output
from loopctl.contrib.mcp.errors import (
    MCPServerError,
    describe_exception,
    root_cause,
    start_failed,
    thread_label,
)
from loopctl.contrib.mcp.loop_thread import LoopThread
from loopctl.contrib.mcp.naming import Attachment, claimable, register_tools
from loopctl.contrib.mcp.tool import MCPTool
from loopctl.contrib.mcp.transports import Spec, StdioSpec, http_spec, stdio_spec
from loopctl.providers.secrets import secret_forms
from loopctl.text import install_log_filter, register_secrets
from loopctl.timeouts import bounded, required_seconds, seconds
from loopctl.tools.base import ToolContext, ToolOutput
from loopctl.tools.registry import ToolRegistry

T = TypeVar("T")

#: After a cancel, how long the caller waits for the cancellation to be sent.
CANCEL_FLUSH_S = 0.05
#: How long ``close()`` waits for the session to end before stopping the loop.
CLOSE_TIMEOUT_S = 10.0


class _Interrupted(Exception):
    """The caller's cancel signal fired while it waited (internal)."""


def wait_future(fut: concurrent.futures.Future[Any], cancel: Any) -> bool:
    """Block until ``fut`` is done (True) or ``cancel`` fires (False)."""
    add = getattr(cancel, "add_listener", None)
    if add is None:
        concurrent.futures.wait([fut])
        return True
    woken = threading.Event()
    fut.add_done_callback(lambda _f: woken.set())
    add(woken.set)
    try:
        woken.wait()
    finally:
        cancel.remove_listener(woken.set)
    return fut.done()


class MCPServer:
    """An MCP server whose tools loopctl can call; a context manager.

    Build one with ``MCPServer.stdio(...)`` or ``MCPServer.http(...)``. The
    connection opens on ``__enter__``, ``connect()`` or the first ``tools()``;
    ``close()`` (idempotent) ends it, stops a stdio server and joins the
    ``loopctl-mcp-...`` thread.

    Attributes:
        name: a short name used in messages, thread and logger names.
        description: the command line, or the URL without credentials.
        start_timeout: seconds a start (spawn + initialize) may take.
        max_restarts: reconnects allowed in a row without a successful call.
    """

    def __init__(self, spec: Spec, *, name: Optional[str] = None, start_timeout: float = 30.0,
                 max_restarts: int = 3) -> None:
        start_timeout = required_seconds(start_timeout, "MCPServer start_timeout")
        if not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
        self.spec = spec
        # The values of ``env`` and ``headers``, masked at every outlet (errors,
        # the stderr log and tail, events, records) for as long as this server lives.
        register_secrets(self, secret_forms(spec.secrets()))
        self.name = name or spec.label()
        self.description = spec.describe()
        self.start_timeout = start_timeout
        self.max_restarts = max_restarts
        # One child logger per server; dots would nest it under made-up parents.
        # The server's stderr lines are untrusted text: masked like every outlet's.
        self.logger = install_log_filter(logging.getLogger(f"loopctl.mcp.{thread_label(self.name).replace('.', '_')}"))
        self._lock = threading.Lock()
        self._thread: Optional[LoopThread] = None
        self._conn: Optional[Connection] = None
        self._failed: Optional[Connection] = None  # a failed start still winding down
        self._pending: Optional[concurrent.futures.Future[Connection]] = None
        self._restarts = 0
        self._closed = False
        self._changed = threading.Event()
        self._listing: Optional[tuple[Connection, list[types.Tool]]] = None

    @classmethod
    def stdio(cls, command: str, args: Sequence[str] = (), env: Optional[Mapping[str, str]] = None,
              cwd: Optional[Union[str, Path]] = None, **options: Any) -> MCPServer:
        """A server run as a subprocess (MCP over its stdin/stdout).

        Args:
            command: the executable (looked up on ``PATH``).
            args: its arguments.
            env: extra environment variables, over the SDK's safe defaults
                (``PATH``, ``HOME``, ...); values never appear in messages.
            cwd: its working directory.
            options: ``name``, ``start_timeout``, ``max_restarts``.
        """
        return cls(stdio_spec(command, args, env, cwd), **options)

    @classmethod
    def http(cls, url: str, headers: Optional[Mapping[str, str]] = None, **options: Any) -> MCPServer:
        """A server reached over streamable HTTP at ``url``.

        Args:
            headers: sent with every request (e.g. ``Authorization``); their
                values never appear in messages.
            options: ``name``, ``start_timeout``, ``max_restarts``.
        """
        return cls(http_spec(url, headers), **options)

    # -- lifecycle ------------------------------------------------------------------

    def __enter__(self) -> MCPServer:
        try:
            self.connect()
        except BaseException:
            self.close()  # ``__exit__`` will not run: release the loop thread now
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> None:
        """Open the connection now (a no-op when it is open).

        Raises:
            MCPServerError: the server did not start (command and stderr tail
                in the message), or this server is closed.
        """
        self._connection(None)

    @property
    def is_closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._closed

    def close(self) -> None:
        """End the session, stop a stdio server, join the loop thread (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conn, thread, failed = self._conn, self._thread, self._failed
            self._conn = self._pending = self._failed = None
        if thread is None:
            return
        for c in (conn, failed):
            if c is None:
                continue
            try:
                thread.submit(c.close()).result(CLOSE_TIMEOUT_S)
            except Exception as exc:  # closing is best effort; the loop stop below cleans up
                self.logger.debug("closing MCP server %s: %s", self.name, describe_exception(exc))
        thread.stop()

    # -- tools ------------------------------------------------------------------------

    @property
    def tools_changed(self) -> bool:
        """True when the server announced a new tool list that ``tools()`` has not read yet."""
        return self._changed.is_set()

    def wait_tools_changed(self, timeout: Optional[float] = None) -> bool:
        """Block until the server announces a new tool list (True) or ``timeout`` passes."""
        return self._changed.wait(bounded(timeout))

    def tools(self, prefix: str = "", *, timeout: Optional[float] = None) -> list[MCPTool]:
        """The server's tools as loopctl ``Tool``s (re-listed when the list changed).

        Args:
            prefix: put before every tool name (avoids clashes between servers).
            timeout: each tool's ``timeout`` in seconds (None: no limit).

        Raises:
            MCPServerError: the server did not start or could not list its tools.
        """
        timeout = seconds(timeout, "MCP tool timeout")
        conn = self._connection(None)
        listing = self._listing
        if listing is None or listing[0] is not conn or self._changed.is_set():
            self._changed.clear()
            listing = (conn, self._run(conn.list_tools(), "list its tools"))
            self._listing = listing
        return [MCPTool(self, t, prefix, timeout) for t in listing[1]]

    def sync(self, registry: ToolRegistry, prefix: str = "", *, timeout: Optional[float] = None,
             override: bool = False) -> list[str]:
        """Register the server's current tools into ``registry`` (e.g. ``loop.tools``).

        Only tools that are new, or whose schema changed, are registered (this
        server's same-named tool is replaced in place). All or nothing: a
        name taken by another source's tool (a local tool, another server's)
        or two of the server's tools whose names map to one loopctl name
        (``a.b`` and ``a_b``) raise ``ToolConflict`` naming both and register
        nothing. Pass a ``prefix`` to keep the names apart, or
        ``override=True`` to let this server's tool replace another source's
        (the first of two colliding server tools is kept); an approval-gated
        tool is never replaced. Call it between runs, or use ``attach``.

        Returns:
            The names registered, in the server's order.

        Raises:
            MCPServerError: the server did not start or could not list its tools.
            ToolConflict: a name collision (see above).
        """
        chosen = claimable(self.tools(prefix, timeout=timeout), registry, override, None)
        return register_tools(registry, chosen, override)

    def attach(self, registry: ToolRegistry, prefix: str = "", *, timeout: Optional[float] = None,
               override: bool = False) -> list[str]:
        """Register the server's tools into ``registry`` and keep them current between turns.

        Collisions are refused as in ``sync``. After a ``list_changed``
        notification, the next model turn (of this run or a later one) sees
        the new list: new or changed tools are registered, tools the server
        dropped are unregistered; a new name that collides with another
        source's tool is skipped with a warning (the other tool stays: a
        server renaming its tools can never take over a local one).
        ``override=True`` covers the names that collide now, no later ones;
        a tool it replaced is registered again when the server drops that name.

        Returns:
            The names registered now, in the server's order.

        Raises:
            MCPServerError: the server did not start or could not list its tools.
            ToolConflict: a name collision (see ``sync``).
        """
        attachment = Attachment(self, prefix, timeout)
        added = attachment.attach(registry, override)
        registry.add_refresher(attachment)
        return added

    def _run(self, coro: Coroutine[object, object, T], what: str) -> T:
        thread = self._thread
        if thread is None:  # pragma: no cover - a connection implies a thread
            coro.close()
            raise MCPServerError(f"MCP server {self.description!r} is not running", self.description)
        fut = thread.submit(coro)
        try:
            return fut.result(self.start_timeout)
        except concurrent.futures.TimeoutError as exc:
            fut.cancel()
            raise MCPServerError(f"MCP server {self.description!r} did not {what} within "
                                 f"{self.start_timeout:g}s", self.description) from exc
        except Exception as exc:
            raise MCPServerError(f"MCP server {self.description!r} could not {what}: "
                                 f"{describe_exception(exc)}", self.description) from exc

    # -- calls --------------------------------------------------------------------

    def call_tool(self, name: str, arguments: dict[str, Any],
                  ctx: Optional[ToolContext] = None) -> ToolOutput:
        """Call tool ``name`` (its name on the server) and wait; never raises.

        Returns the result as text (``isError`` and every failure as a soft
        error). ``ctx.cancel`` firing cancels the request on the server.
        """
        cancel = ctx.cancel if ctx is not None else None
        try:
            conn = self._connection(cancel)
        except _Interrupted:
            return ToolOutput.error(f"MCP tool '{name}' on server '{self.name}' cancelled")
        except MCPServerError as exc:
            return ToolOutput.error(str(exc))
        handle = CallHandle()
        thread = self._thread
        if thread is None:  # closed between the two lines above
            return ToolOutput.error(f"MCP server '{self.name}' is closed")
        try:
            fut = thread.submit(conn.call(name, arguments, handle))
        except RuntimeError:  # its loop stopped: closed meanwhile
            return ToolOutput.error(f"MCP server '{self.name}' is closed")
        if not wait_future(fut, cancel):
            thread.call_soon(handle.cancel)
            try:  # give the loop a moment to send notifications/cancelled
                fut.result(CANCEL_FLUSH_S)
            except BaseException:  # the call is over for us either way
                pass
            return ToolOutput.error(f"MCP tool '{name}' on server '{self.name}' cancelled")
        return self._outcome(name, conn, fut, ctx)

    def _outcome(self, name: str, conn: Connection, fut: concurrent.futures.Future[Any],
                 ctx: Optional[ToolContext]) -> ToolOutput:
        if fut.cancelled():
            return ToolOutput.error(f"MCP server '{self.name}' is closed")
        exc = fut.exception()
        if exc is None:
            self._restarts = 0
            return result_output(fut.result(), ctx.temp_dir if ctx is not None else None)
        leaf = root_cause(exc)
        if isinstance(leaf, CallCancelled):
            return ToolOutput.error(f"MCP tool '{name}' on server '{self.name}' cancelled")
        if is_connection_lost(leaf) or not conn.is_alive:
            conn.mark_lost()
            last = conn.stderr_tail().splitlines()[-1:]
            said = f" (its last stderr line: {last[0]!r})" if last else ""
            return ToolOutput.error(
                f"MCP server '{self.name}' exited or closed the connection during '{name}'{said}; "
                "the next call reconnects"
            )
        if isinstance(leaf, MCPError):
            return ToolOutput.error(f"MCP server '{self.name}' refused '{name}': {leaf.message}")
        return ToolOutput.error(f"MCP tool '{name}' on server '{self.name}' failed: "
                                f"{describe_exception(leaf)}")

    # -- the connection -------------------------------------------------------------

    def _connection(self, cancel: object) -> Connection:
        """The live connection, opening (or reopening) it when needed.

        Raises:
            MCPServerError: closed, did not start, or out of restarts.
            _Interrupted: ``cancel`` fired while waiting for a start.
        """
        while True:
            with self._lock:
                if self._closed:
                    raise MCPServerError(f"MCP server {self.description!r} is closed", self.description)
                conn = self._conn
                if conn is not None and conn.is_alive:
                    return conn
                fut = self._pending
                if fut is None:
                    fut = self._start_locked(conn)
            if not wait_future(fut, cancel):
                raise _Interrupted()
            with self._lock:
                if self._pending is fut:
                    self._pending = None
                    if not fut.cancelled() and fut.exception() is None:
                        self._conn = fut.result()
            # A failed start keeps the loop thread (a next start reuses it; close()
            # joins it): the failure is reported now while a slow server process is
            # stopped in the background, never after its teardown.
            if fut.cancelled():
                raise MCPServerError(f"MCP server {self.description!r} is closed", self.description)
            exc = fut.exception()
            if exc is not None:
                if isinstance(exc, MCPServerError):
                    raise exc
                raise start_failed(self.description, exc, "") from exc

    def _start_locked(self, dead: Optional[Connection]) -> concurrent.futures.Future[Connection]:
        if self._thread is None:
            self._thread = LoopThread(thread_label(self.name))
            # A server dropped without close(): stop its thread (and so its
            # subprocess) when it is collected, or at interpreter exit. Only
            # asked, never joined: the collector runs this on whatever thread
            # it interrupted, maybe one holding a lock the loop thread needs
            # to finish (a logging handler's, the server's stderr lines).
            weakref.finalize(self, self._thread.stop, 0.0)
        if dead is not None:
            self._conn = None
            if self._restarts >= self.max_restarts:
                raise MCPServerError(
                    f"MCP server {self.description!r} stopped answering and was restarted "
                    f"{self._restarts} times without a successful call; not restarting it again",
                    self.description, dead.stderr_tail())
            self._restarts += 1
            self.logger.info("MCP server %s lost its connection; reconnecting (%d/%d)",
                                self.name, self._restarts, self.max_restarts)
            self._thread.submit(dead.close())
        fut = self._thread.submit(self._open())
        self._pending = fut
        return fut

    async def _open(self) -> Connection:
        conn = Connection(self.spec, self.logger, self._changed.set)
        try:
            await conn.open(self.start_timeout)
        except Exception as exc:
            self._failed = conn  # close() waits for its transport to wind down
            why = ""
            leaf = root_cause(exc)
            if isinstance(leaf, TimeoutError) or type(leaf).__name__ == "TimeoutError":
                why = f"no answer to initialize within {self.start_timeout:g}s"
            elif is_connection_lost(leaf):
                why = "it closed the connection (exited?) before initializing"
            elif isinstance(leaf, FileNotFoundError):
                why = f"command not found ({describe_exception(leaf)})"
            raise start_failed(self.description, exc, conn.stderr_tail(), why) from exc
        return conn

    def __repr__(self) -> str:
        kind = "stdio" if isinstance(self.spec, StdioSpec) else "http"
        return f"<MCPServer {self.name!r} ({kind})>"


__all__ = ["CANCEL_FLUSH_S", "MCPServer", "wait_future"]
