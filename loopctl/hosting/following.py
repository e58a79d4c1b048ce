"""Following one run's event buffer: the iterator behind ``RunRegistry.events``.

The run's tap only appends to the entry's bounded buffer and wakes parked
readers; each reader waits on its own lock, takes a batch under the entry's
lock and turns events into dicts outside it, so a slow reader never slows
the run. A reader that fell behind the buffer gets one ``gap`` event.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any, Dict, Optional, Tuple

from loopctl.hosting.entry import _Entry


def follow_entry(
    entry: _Entry, after: int, timeout: Optional[float]
) -> Iterator[Tuple[int, Dict[str, Any]]]:
    """The entry's events after ``after`` as ``(seq, event_dict)``; waits, ends after ``run_end``.

    The entry's lock is held only to take a batch; the dicts are made outside
    it. A consumer behind the buffer first gets a ``gap``; a wait longer than
    ``timeout`` ends the iterator.
    """
    pos = after
    lock = entry.lock
    while True:
        with lock:
            if entry.seq <= pos and not entry.ended:
                deadline = None if timeout is None else time.monotonic() + timeout
                while entry.seq <= pos and not entry.ended:
                    waiter = entry.park()
                    lock.release()
                    try:
                        if deadline is None:
                            woken = waiter.acquire()
                        else:
                            woken = waiter.acquire(True, max(0.0, deadline - time.monotonic()))
                    finally:
                        lock.acquire()
                    if not woken:
                        if entry.waiters is not None and waiter in entry.waiters:
                            entry.waiters.remove(waiter)
                        if entry.seq <= pos and not entry.ended:
                            return
            last = entry.seq
            if last <= pos:
                return  # ended, and everything was yielded
            buf = entry.buf
            begin = max(pos + 1, last - len(buf) + 1)
            batch = [*itertools.islice(reversed(buf), last - begin + 1)]
        if begin > pos + 1:
            yield entry.gap(begin - 1, begin - pos - 1)
        for seq, event in enumerate(reversed(batch), begin):
            yield seq, event.to_dict()
        pos = last


__all__ = ["follow_entry"]
