"""What a loop owns outside the run: the managed temp dir and the tool pool.

The temp dir (``loopctl.driver.tempdir``) is made when a tool first reads
``ctx.temp_dir`` and removed by ``close()`` or when the loop is
garbage-collected; if it cannot be made, tools get the system temp dir.
The ``ThreadPoolExecutor`` for parallel tool waves is made on first use
(threads ``loopctl-tools-...``) and shut down without waiting, so a stuck
tool never blocks ``close()``.

Abandoned tool work never starves a later run: when a cancel abandons a
run whose tools are still running, the pool is retired (its stuck workers
finish alone and exit) and the next wave gets a fresh one. The bound on
threads: the live pool (``max(2, max_concurrency)`` workers) plus at most
``MAX_ABANDONED_TOOL_THREADS`` abandoned ones; past that, parallel waves
run their calls one by one on the run's thread instead of starting
threads. ``abandoned_tool_threads`` counts the abandoned calls still
running; a warning is logged each time it reaches a multiple of
``ABANDONED_WARN_EVERY``.
"""

from __future__ import annotations

import logging
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

from loopctl.driver.tempdir import ManagedTempDir

log = logging.getLogger("loopctl")


#: Abandoned tool threads allowed to linger before waves stop starting threads.
MAX_ABANDONED_TOOL_THREADS = 64
#: A warning is logged each time the abandoned count reaches a multiple of this.
ABANDONED_WARN_EVERY = 8


def _shutdown(box: list[Optional[ThreadPoolExecutor]]) -> None:
    pool = box[0]
    box[0] = None
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)


class ToolTally:
    """One run's tool calls, counted under its loop's tally lock (made when the run's first call runs).

    Its own small object, not fields of the run: the pool threads of an
    abandoned wave hold it until their stuck calls return, and must not keep
    the rest of the run alive meanwhile.
    """

    __slots__ = ("running", "abandoned", "inline", "inline_counted")

    def __init__(self) -> None:
        self.running = 0  # pool calls executing now
        self.abandoned = False  # set when a cancel abandoned the run's calls
        self.inline = False  # a call runs on the run's own thread now (a lock-free flag)
        self.inline_counted = False  # that inline call was counted as abandoned


class LoopResources:
    """The temp dir and the tool executor of one loop."""

    __slots__ = (
        "_abandoned",
        "_owner",
        "_pool_box",
        "_pool_finalizer",
        "_pool_size",
        "_tally",
        "_temp",
        "session_id",
    )

    def __init__(self, owner: Any, session_id: str) -> None:
        self.session_id = session_id
        self._temp = ManagedTempDir(owner, session_id)
        self._pool_box: list[Optional[ThreadPoolExecutor]] = [None]
        self._pool_size = 0
        # The pool's finalizer is made with the first pool: most loops never
        # need one (a single call runs inline), and a finalizer per loop is
        # four more objects for the cyclic GC to walk per run in flight.
        self._owner = weakref.ref(owner)
        self._pool_finalizer: Optional[weakref.finalize[..., None]] = None
        self._tally = threading.Lock()
        self._abandoned = 0

    # -- tool work accounting --------------------------------------------------------

    @property
    def abandoned_tool_threads(self) -> int:
        """Tool calls of cancelled runs that are still running (their threads are stuck)."""
        return self._abandoned

    def tool_started(self, tally: ToolTally) -> None:
        """One of the run's calls starts executing (any thread)."""
        with self._tally:
            tally.running += 1
            if tally.abandoned:  # started after its run was given up: stuck all the same
                self._abandoned += 1

    def tool_ended(self, tally: ToolTally) -> None:
        """One of the run's calls stopped executing (any thread)."""
        with self._tally:
            tally.running -= 1
            if tally.abandoned:
                self._abandoned -= 1

    def inline_ended(self, tally: ToolTally) -> None:
        """An inline call (on the run's thread) of an abandoned run returned: uncount it."""
        with self._tally:
            if tally.inline_counted:
                tally.inline_counted = False
                self._abandoned -= 1

    def abandon(self, tally: ToolTally) -> None:
        """The run was cancelled away from its tools: count the stuck calls, retire the pool."""
        with self._tally:
            # Written before ``inline`` is read; the run's thread writes
            # ``inline`` before it reads this: one of the two sees the other.
            tally.abandoned = True
            stuck = tally.running
            if tally.inline:
                tally.inline_counted = True
                stuck += 1
            before = self._abandoned
            self._abandoned = before + stuck
        if stuck <= 0:
            return
        if self._abandoned // ABANDONED_WARN_EVERY > before // ABANDONED_WARN_EVERY:
            log.warning(
                "%d abandoned tool calls are still running (tools that ignore ctx.cancel)",
                self._abandoned,
            )
        # Its workers may be the stuck ones: the next wave gets fresh threads.
        pool, self._pool_box[0] = self._pool_box[0], None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    @property
    def temp_base(self) -> Optional[Path]:
        """The base the temp dir is made under; None disables it."""
        return self._temp.base

    @temp_base.setter
    def temp_base(self, base: Optional[Path]) -> None:
        self._temp.base = base

    @property
    def temp_path(self) -> Optional[Path]:
        """Where the temp dir is (or will be); None when disabled."""
        return self._temp.path

    def ensure_temp_dir(self) -> Optional[Path]:
        """Make the temp dir on first use (any thread); the system temp dir if that fails."""
        return self._temp.ensure()

    def executor(self, workers: int) -> Optional[ThreadPoolExecutor]:
        """The tool pool, made on first use; None past the abandoned-thread bound."""
        if self._abandoned >= MAX_ABANDONED_TOOL_THREADS:
            return None
        want = max(2, workers)
        pool = self._pool_box[0]
        if pool is not None and self._pool_size < want:
            # A wider wave than the pool was made for: replace it; the old
            # workers finish what they hold and exit.
            pool.shutdown(wait=False)
            pool = None
        if pool is None:
            pool = ThreadPoolExecutor(
                max_workers=want,
                thread_name_prefix=f"loopctl-tools-{self.session_id[:8]}",
            )
            self._pool_box[0] = pool
            self._pool_size = want
            owner = self._owner()
            if self._pool_finalizer is None and owner is not None:
                self._pool_finalizer = weakref.finalize(owner, _shutdown, self._pool_box)
        return pool

    def close(self) -> None:
        """Shut the pool (without waiting) and remove the temp dir; idempotent."""
        _shutdown(self._pool_box)
        self._temp.close()


__all__ = ["ABANDONED_WARN_EVERY", "MAX_ABANDONED_TOOL_THREADS", "LoopResources", "ToolTally"]
