"""The two cross-thread seams: ``CancelSignal`` (from ``loopctl.cancel``) and ``Steering``.

Both are safe from any thread at any time. A cancel is level-triggered for
the run it lands in: the loop observes it at every checkpoint and re-arms
the signal only at the end of ``finalize`` (one cancel = one cancelled
run). Steering guidance is accepted only while a run is in flight (the
in-flight check and the acceptance share one lock), drained at turn
boundaries, and sealed when the run ends.
"""

from __future__ import annotations

import logging
import threading
from typing import Union

from loopctl.cancel import CancelSignal
from loopctl.messages import Message

log = logging.getLogger("loopctl")


class Steering:
    """Guidance from outside the loop, delivered at the next turn boundary.

    ``push`` is accepted only while a run is in flight. Guidance the run
    never reached is sealed when it ends: ``take_leftovers`` hands it back;
    later runs never deliver it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = False
        self._live: list[Message] = []
        self._sealed: list[Message] = []
        self._arrived = 0

    def push(self, message: Union[Message, str]) -> bool:
        """Offer guidance to the run in flight.

        Args:
            message: a ``Message`` or plain text (becomes a user message).

        Returns:
            True if accepted; False (nothing stored) when no run is in flight.
        """
        if isinstance(message, Message):
            msg = message
        elif isinstance(message, str):
            msg = Message.user(message)
        else:
            raise TypeError(
                f"steering push takes a Message or str, got {type(message).__name__}: {message!r:.60}"
            )
        with self._lock:
            if not self._open:
                return False
            self._live.append(msg)
            self._arrived += 1
            return True

    def take_leftovers(self) -> list[Message]:
        """Remove and return sealed guidance (from ended runs), in push order."""
        with self._lock:
            out, self._sealed = self._sealed, []
            return out

    def take_all(self) -> list[Message]:
        """Remove and return sealed plus live guidance (the shutdown collect)."""
        with self._lock:
            out = self._sealed + self._live
            self._sealed, self._live = [], []
            return out

    def clear(self) -> None:
        """Drop all guidance, sealed and live."""
        with self._lock:
            self._sealed, self._live = [], []

    @property
    def is_open(self) -> bool:
        """True while a run accepts guidance."""
        return self._open

    # -- the loop's side -------------------------------------------------------

    def _open_slot(self) -> None:
        """Accept guidance for the run that starts now (called after ``accept_input``).

        Anything still live belongs to an earlier run that ended without
        closing the slot: seal it, so this run never delivers it.
        """
        with self._lock:
            if self._live:
                self._sealed.extend(self._live)
                self._live = []
            self._open = True

    def _drain(self) -> list[Message]:
        """Take the live guidance, in push order (the run's thread, at a boundary)."""
        if not self._live:  # racy fast path; a push that misses it lands next time
            return []
        with self._lock:
            out, self._live = self._live, []
            return out

    def _close_and_seal(self) -> None:
        """Refuse further pushes and seal what was never drained (idempotent)."""
        with self._lock:
            self._open = False
            if self._live:
                self._sealed.extend(self._live)
                self._live = []


__all__ = ["CancelSignal", "Steering"]
