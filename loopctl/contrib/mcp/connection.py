"""One live MCP session, on the server's event loop: open, list, call, close.

``Connection`` lives on the ``LoopThread`` and is driven only by coroutines
submitted there. ``open()`` starts a serving task that enters the transport
and the SDK's ``ClientSession`` (the initialize handshake), then parks until
``close()``; entering and leaving those async context managers happen in
that one task, as anyio requires. Calls run in their own tasks, each inside
an anyio ``CancelScope`` that ``CallHandle.cancel`` cancels: the SDK then
sends MCP's ``notifications/cancelled`` for the request before the call
task ends. A transport that closes (the server exited) marks the
connection dead; the facade opens a new one on the next call.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from contextlib import AsyncExitStack
from typing import Any, Callable, Optional

import anyio
import mcp_types as types
from mcp import ClientSession
from mcp.shared.exceptions import MCPError

from loopctl.contrib.mcp.stderr import StderrSink
from loopctl.contrib.mcp.transports import Spec, StdioSpec

# The SDK logs transport trouble (a failed session DELETE, a stray stdout
# line) at WARNING; with no logging configured Python's last-resort handler
# would print that on the user's terminal. A NullHandler keeps it off the
# terminal and changes nothing for apps that configure logging (records
# still propagate to their handlers).
logging.getLogger("mcp").addHandler(logging.NullHandler())

#: How long a closing or failed connection waits for the server's stderr to end.
STDERR_DRAIN_S = 1.0


class CallCancelled(Exception):
    """A call was cancelled through its ``CallHandle`` (internal)."""


class CallHandle:
    """Cancels one in-flight call; ``cancel()`` runs on the loop thread."""

    def __init__(self) -> None:
        self._scope: Optional[anyio.CancelScope] = None
        self.cancelled = False

    def bind(self, scope: anyio.CancelScope) -> None:
        """Attach the call's scope (loop thread); a cancel that came first cancels it now."""
        self._scope = scope
        if self.cancelled:
            scope.cancel()

    def cancel(self) -> None:
        """Cancel the call's scope (or the call before it starts)."""
        self.cancelled = True
        if self._scope is not None:
            self._scope.cancel()


class WatchedReadStream:
    """The transport's read stream, telling the connection when it ends.

    The session reads it with ``async for``; when that ends (a stdio server
    exited, an HTTP stream closed) ``on_end`` marks the connection lost at
    once, so the next call reconnects instead of failing on a dead one.
    Everything else is delegated.
    """

    def __init__(self, inner: Any, on_end: Callable[[], None]) -> None:
        self._inner = inner
        self._on_end = on_end

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._on_end()
            raise

    def __aiter__(self) -> WatchedReadStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self._inner.__anext__()
        except StopAsyncIteration:
            self._on_end()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> WatchedReadStream:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> Any:
        return await self._inner.__aexit__(*exc)


def is_connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the transport is gone (not a per-call failure)."""
    if isinstance(exc, MCPError):
        return exc.code == types.CONNECTION_CLOSED
    return isinstance(exc, (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream,
                            ConnectionError, EOFError))


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


class Connection:
    """An MCP client session over one transport, owned by the loop thread."""

    def __init__(self, spec: Spec, logger: logging.Logger, on_tools_changed: Callable[[], None]) -> None:
        self.spec = spec
        self._logger = logger
        self._on_tools_changed = on_tools_changed
        self._session: Optional[ClientSession] = None
        self._stderr: Optional[StderrSink] = None
        self._closing: Optional[asyncio.Event] = None
        self._task: Optional[asyncio.Task[None]] = None
        self._lost = False
        #: Set (from the loop thread) once the connection is lost or closed.
        self.ended = threading.Event()
        self.server_info: Optional[types.Implementation] = None

    # -- state (read from any thread) --------------------------------------------

    @property
    def is_alive(self) -> bool:
        """Open, and neither closed nor lost."""
        task = self._task
        return self._session is not None and not self._lost and task is not None and not task.done()

    def mark_lost(self) -> None:
        """Record that the transport is gone (its stream ended, or a call saw it close)."""
        self._lost = True
        self.ended.set()

    def stderr_tail(self) -> str:
        """The last lines a stdio server wrote to stderr ("" for HTTP)."""
        return self._stderr.tail() if self._stderr is not None else ""

    # -- lifecycle (coroutines for the loop thread) ----------------------------

    async def open(self, timeout: float) -> None:
        """Start the transport and the session; return once initialized.

        Raises:
            BaseException: whatever stopped the start (mapped by the facade);
                ``asyncio.TimeoutError`` when the server did not answer in time.
        """
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        # Whoever waits may have given up (a timeout): mark the outcome read, so
        # asyncio never prints "Future exception was never retrieved" on the terminal.
        ready.add_done_callback(_retrieve)
        self._closing = asyncio.Event()
        if isinstance(self.spec, StdioSpec) and os.name == "posix":  # add_reader on a pipe
            self._stderr = StderrSink(self._logger)
            self._stderr.attach()
        self._task = loop.create_task(self._serve(ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), timeout)
        except asyncio.TimeoutError:
            # Report the failure at the timeout: the transport (a process that
            # may take seconds to stop) winds down on the loop meanwhile.
            self._task.cancel()
            raise
        except BaseException:
            await self._wait_task()
            raise

    async def _serve(self, ready: asyncio.Future[None]) -> None:
        error: Optional[BaseException] = None
        assert self._closing is not None
        try:
            async with AsyncExitStack() as stack:
                read, write = await self.spec.open(stack, self._stderr)
                session = await stack.enter_async_context(
                    ClientSession(WatchedReadStream(read, self.mark_lost), write,
                                  message_handler=self._on_message)
                )
                init = await session.initialize()
                self.server_info = init.server_info
                self._session = session
                ready.set_result(None)
                await self._closing.wait()
        except BaseException as exc:  # reported through ``ready`` or ``is_alive``
            error = exc
        finally:
            self.mark_lost()
            if self._stderr is not None:
                await self._stderr.drain(STDERR_DRAIN_S if not ready.done() else 0.2)
            if not ready.done():
                ready.set_exception(error if error is not None else ConnectionError("closed during start"))
        if error is not None and not ready.done():  # pragma: no cover - set above
            raise error

    async def _on_message(self, message: object) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self._on_tools_changed()
        elif isinstance(message, Exception):
            self._logger.debug("MCP transport reported %s", type(message).__name__)

    async def close(self) -> None:
        """End the session and the transport (stops a stdio server); idempotent."""
        if self._closing is not None:
            self._closing.set()
        await self._wait_task()

    async def _wait_task(self) -> None:
        task = self._task
        if task is None or task.done():
            return
        try:
            await asyncio.shield(task)
        except BaseException:  # the serving task reports through ``ready``
            pass

    # -- requests ----------------------------------------------------------------

    def _live(self) -> ClientSession:
        if self._session is None or self._lost:
            raise MCPError(types.CONNECTION_CLOSED, "Connection closed")
        return self._session

    async def list_tools(self) -> list[types.Tool]:
        """Every tool the server offers (all pages)."""
        session = self._live()
        tools: list[types.Tool] = []
        cursor: Optional[str] = None
        for _ in range(1000):  # a paginator that never ends cannot hang us
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await session.list_tools(params=params)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    async def call(self, name: str, arguments: dict[str, Any], handle: CallHandle) -> types.CallToolResult:
        """``tools/call`` under ``handle``'s cancel scope.

        Raises:
            CallCancelled: ``handle.cancel()`` ended the call (the server was
                sent ``notifications/cancelled``).
            MCPError: the server answered with an error, or the connection closed.
        """
        session = self._live()
        with anyio.CancelScope() as scope:
            handle.bind(scope)
            return await session.call_tool(name, arguments)
        raise CallCancelled(name)


__all__ = ["CallCancelled", "CallHandle", "Connection", "is_connection_lost"]
