"""One loop per conversation key, made once by whoever asks first.

Concurrent first requests for a key race to make its loop: one caller
becomes the creator and runs the factory, the others wait for it. A factory
that raises lets a waiter try again (it becomes the creator). After
``close_locked`` no loop is made, and a loop finished meanwhile is closed
at once rather than leaked. The registry's lock guards the table, so a
conversation loop and a run start are never half-seen by ``close``.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import TYPE_CHECKING, Callable, Dict, List, Optional

from loopctl.errors import LoopError

if TYPE_CHECKING:
    from loopctl.driver.loop import BareLoop


class _LoopSlot:
    """A conversation's loop, created once by whoever asked first."""

    __slots__ = ("ready", "loop")

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.loop: Optional[BareLoop] = None


class ConversationLoops:
    """The loops ``RunRegistry.loop_for`` made, by key; ``lock`` is the registry's."""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self._slots: Dict[Hashable, _LoopSlot] = {}
        self.closed = False

    def loop_for(self, key: Hashable, factory: Callable[[], BareLoop]) -> BareLoop:
        """The loop for ``key`` (made by ``factory()`` on first use).

        Raises:
            LoopError: closed.
        """
        while True:
            with self._lock:
                if self.closed:
                    raise LoopError("this RunRegistry is closed; no new conversations")
                slot = self._slots.get(key)
                creator = slot is None
                if slot is None:
                    slot = self._slots[key] = _LoopSlot()
            if creator:
                try:
                    loop = factory()
                except BaseException:
                    with self._lock:
                        del self._slots[key]
                    slot.ready.set()  # waiters retry (one becomes the creator)
                    raise
                with self._lock:
                    closed = self.closed
                    slot.loop = loop
                slot.ready.set()
                if closed:  # close() ran meanwhile and could not see this loop
                    loop.close()
                    raise LoopError("this RunRegistry is closed; no new conversations")
                return loop
            slot.ready.wait()
            if slot.loop is not None:
                return slot.loop

    def close_locked(self) -> List[BareLoop]:
        """No more loops (the caller holds the lock); the loops made so far, for the caller to close."""
        self.closed = True
        return [s.loop for s in self._slots.values() if s.loop is not None]


__all__ = ["ConversationLoops"]
