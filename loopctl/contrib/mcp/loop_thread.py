"""One asyncio event loop on one named thread, for synchronous callers.

The MCP SDK is async; loopctl is not. ``LoopThread`` runs a private event
loop on a thread named ``loopctl-mcp-<name>`` for as long as its server is
open. Synchronous code hands it coroutines (``submit``) and waits on the
returned ``concurrent.futures.Future``; nothing of asyncio leaks out.
``stop()`` cancels what is still running on the loop, closes it and joins
the thread; it is idempotent and bounded.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import threading
from collections.abc import Coroutine
from typing import Callable, Optional, TypeVar

from loopctl.text import install_log_filter

log = install_log_filter(logging.getLogger("loopctl.mcp"))  # a child logger: the parent's filter does not apply

T = TypeVar("T")

#: How long ``stop()`` lets tasks still on the loop unwind before giving up on them.
STOP_GRACE_S = 5.0

# Every loop thread still running, held until its thread ends: at interpreter
# exit each is stopped and joined (bounded), so a server dropped without
# close() (its collector cleanup only asks) still shuts its subprocess down.
_running: set[LoopThread] = set()


class LoopThread:
    """A private asyncio loop running on its own named thread until ``stop()``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"loopctl-mcp-{name}", daemon=True)
        self._lock = threading.Lock()
        self._stopped = False
        _running.add(self)
        try:
            self._thread.start()
        except BaseException:
            _running.discard(self)
            raise
        self._started.wait()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop (use only through ``submit``/``call_soon``)."""
        return self._loop

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._started.set)
        try:
            self._loop.run_forever()
        finally:
            try:
                self._finish()
            finally:
                self._loop.close()
                _running.discard(self)

    def _finish(self) -> None:
        # Let every task still on the loop (a connection winding down, a
        # call nobody waits for any more) unwind, bounded, before closing.
        tasks = [t for t in asyncio.all_tasks(self._loop) if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            gather = asyncio.gather(*tasks, return_exceptions=True)
            try:
                self._loop.run_until_complete(asyncio.wait_for(gather, STOP_GRACE_S))
            except (asyncio.TimeoutError, asyncio.CancelledError):
                log.warning("MCP loop %s: tasks did not finish within %gs", self.name, STOP_GRACE_S)
        try:
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        except RuntimeError:  # pragma: no cover - loop already shutting down
            pass

    def submit(self, coro: Coroutine[object, object, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the loop; a future the calling thread can wait on.

        Raises:
            RuntimeError: the loop thread has stopped (the coroutine is closed).
        """
        with self._lock:
            if self._stopped:
                coro.close()
                raise RuntimeError(f"MCP loop {self.name} is closed")
            return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def call_soon(self, fn: Callable[[], object]) -> None:
        """Run ``fn()`` on the loop thread soon (a no-op once stopped)."""
        with self._lock:
            if not self._stopped:
                self._loop.call_soon_threadsafe(fn)

    def is_current(self) -> bool:
        """True when called on the loop's own thread."""
        return threading.current_thread() is self._thread

    def stop(self, timeout: Optional[float] = None) -> None:
        """Stop the loop and join its thread (idempotent; never from the loop thread)."""
        with self._lock:
            if not self._stopped:
                self._stopped = True
                self._loop.call_soon_threadsafe(self._loop.stop)
        if not self.is_current():
            self._thread.join(timeout)


@atexit.register
def _stop_all() -> None:
    for t in list(_running):
        t.stop(STOP_GRACE_S + 1.0)


__all__ = ["LoopThread"]
