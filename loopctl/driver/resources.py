"""What a loop owns outside the run: the managed temp dir and the tool pool.

The temp dir (``loopctl.driver.tempdir``) is made when a tool first reads
``ctx.temp_dir`` and removed by ``close()`` or when the loop is
garbage-collected; if it cannot be made, tools get the system temp dir.
The ``ThreadPoolExecutor`` for parallel tool waves is made on first use
(threads ``loopctl-tools-...``) and shut down without waiting, so a stuck
tool never blocks ``close()``.
"""

from __future__ import annotations

import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

from loopctl.driver.tempdir import ManagedTempDir


def _shutdown(box: list[Optional[ThreadPoolExecutor]]) -> None:
    pool = box[0]
    box[0] = None
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)


class LoopResources:
    """The temp dir and the tool executor of one loop."""

    def __init__(self, owner: Any, session_id: str) -> None:
        self.session_id = session_id
        self._temp = ManagedTempDir(owner, session_id)
        self._pool_box: list[Optional[ThreadPoolExecutor]] = [None]
        self._pool_size = 0
        self._pool_finalizer = weakref.finalize(owner, _shutdown, self._pool_box)

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

    def executor(self, workers: int) -> ThreadPoolExecutor:
        """The tool pool, made on first use."""
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
        return pool

    def close(self) -> None:
        """Shut the pool (without waiting) and remove the temp dir; idempotent."""
        _shutdown(self._pool_box)
        self._temp.close()


__all__ = ["LoopResources"]
