"""Finished runs stay queryable for a while, then the registry forgets them.

A run's tap appends ``(ended_at, entry)`` to ``ending`` when it emits
``run_end``. Pruning (on the registry's next access, under its lock; there
is no thread for it) compacts each ended run whose thread is done (a run
still in finalize's tail is looked at again next time) and drops finished
runs older than ``keep`` seconds from the registry's tables.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Dict, List, Tuple

from loopctl.checks import shown
from loopctl.errors import ConfigError
from loopctl.hosting.entry import _Entry
from loopctl.timeouts import required_seconds


class FinishedRuns:
    """Ended runs in end order, pruned ``keep`` seconds after they finished.

    Raises:
        ConfigError: ``keep`` is not a finite number >= 0, or ``clock`` is not callable.
    """

    def __init__(self, keep: object, clock: Callable[[], float]) -> None:
        self._keep = required_seconds(keep, "RunRegistry.keep_finished_s", zero=True)
        if not callable(clock):
            raise ConfigError(f"RunRegistry.clock must be callable, got {shown(clock)}")
        self._clock = clock
        self.ending: deque[Tuple[float, _Entry]] = deque()  # appended by the runs' taps
        self._waiting: List[Tuple[float, _Entry]] = []  # ended, thread not done yet
        self._finished: deque[Tuple[float, _Entry]] = deque()

    def prune(self, entries: Dict[str, _Entry], live: Dict[str, _Entry]) -> None:
        """Compact the runs that are done; drop from ``entries`` and ``live`` those kept long enough."""
        ending, waiting = self.ending, self._waiting
        if ending or waiting:
            # Compact the runs whose thread is done; the rest (still in
            # finalize's tail) are looked at again on the next access.
            while ending:
                waiting.append(ending.popleft())
            still = []
            for item in waiting:
                if item[1].handle is not None and not item[1].handle.done():
                    still.append(item)
                else:
                    item[1].compact()
                    self._finished.append(item)
            self._waiting = still
        q = self._finished
        if not q:
            return
        horizon = self._clock() - self._keep
        while q and q[0][0] <= horizon:
            _, entry = q.popleft()
            if entries.get(entry.run_id) is entry:
                del entries[entry.run_id]
                live.pop(entry.run_id, None)


__all__ = ["FinishedRuns"]
