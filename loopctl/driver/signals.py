"""``Steering``: guidance from outside the loop, one of the two cross-thread seams.

The other, ``CancelSignal``, lives in the leaf ``loopctl.cancel``.

Both are safe from any thread at any time. A cancel is level-triggered for
the run it lands in: the loop observes it at every checkpoint and re-arms
the signal only at the end of ``finalize`` (one cancel = one cancelled
run). Steering guidance is accepted only while a run is in flight (the
in-flight check and the acceptance share one lock), drained at turn
boundaries, and sealed when the run ends. Pending guidance is bounded: at
most ``max_messages`` messages and ``max_bytes`` bytes of text (UTF-8) wait
undrained; a push past either cap is refused and stores nothing.
"""

from __future__ import annotations

import threading
from typing import Union

from loopctl.messages import Message

#: Default cap on guidance waiting to be drained (messages).
MAX_PENDING_MESSAGES = 10_000
#: Default cap on guidance waiting to be drained (bytes of UTF-8 text).
MAX_PENDING_BYTES = 8 * 1024 * 1024


def _size(message: Message) -> int:
    return sum(len(getattr(p, "text", "").encode("utf-8", "surrogatepass")) for p in message.parts)


class Steering:
    """Guidance from outside the loop, delivered at the next turn boundary.

    ``push`` is accepted only while a run is in flight, and only while the
    guidance still waiting for a turn boundary stays within the caps. Guidance
    the run never reached is sealed when it ends: ``take_leftovers`` hands it
    back; later runs never deliver it.

    Args:
        max_messages: at most this many pushed messages wait undrained.
        max_bytes: at most this many bytes of text (UTF-8) wait undrained.
    """

    def __init__(self, max_messages: int = MAX_PENDING_MESSAGES, max_bytes: int = MAX_PENDING_BYTES) -> None:
        self._lock = threading.Lock()
        self._open = False
        self._live: list[Message] = []
        self._sealed: list[Message] = []
        self._arrived = 0
        self._live_bytes = 0
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.set_limits(max_messages, max_bytes)

    def set_limits(self, max_messages: int, max_bytes: int) -> None:
        """Change the caps on undrained guidance (counts and bytes; both >= 1).

        Raises:
            ValueError: a cap below 1 (names the cap and the value).
        """
        for name, value in (("max_messages", max_messages), ("max_bytes", max_bytes)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"steering {name} must be an int >= 1, got {value!r}")
        with self._lock:
            self.max_messages = max_messages
            self.max_bytes = max_bytes

    def push(self, message: Union[Message, str]) -> bool:
        """Offer guidance to the run in flight.

        Args:
            message: a ``Message`` or plain text (becomes a user message).

        Returns:
            True if accepted; False (nothing stored) when no run is in flight,
            or when it would take the undrained guidance past ``max_messages``
            or ``max_bytes``.
        """
        if isinstance(message, Message):
            msg = message
        elif isinstance(message, str):
            msg = Message.user(message)
        else:
            raise TypeError(
                f"steering push takes a Message or str, got {type(message).__name__}: {message!r:.60}"
            )
        size = _size(msg)
        with self._lock:
            if not self._open:
                return False
            if len(self._live) >= self.max_messages or self._live_bytes + size > self.max_bytes:
                return False
            self._live.append(msg)
            self._live_bytes += size
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
            self._live_bytes = 0
            return out

    def clear(self) -> None:
        """Drop all guidance, sealed and live."""
        with self._lock:
            self._sealed, self._live = [], []
            self._live_bytes = 0

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
                self._live_bytes = 0
            self._open = True

    def _drain(self) -> list[Message]:
        """Take the live guidance, in push order (the run's thread, at a boundary)."""
        if not self._live:  # racy fast path; a push that misses it lands next time
            return []
        with self._lock:
            out, self._live = self._live, []
            self._live_bytes = 0
            return out

    def _hand_back(self, messages: list[Message]) -> None:
        """Seal guidance a sub-agent's run never reached: it comes back as leftovers."""
        if messages:
            with self._lock:
                self._sealed.extend(messages)

    def _close_and_seal(self) -> None:
        """Refuse further pushes and seal what was never drained (idempotent)."""
        with self._lock:
            self._open = False
            if self._live:
                self._sealed.extend(self._live)
                self._live = []
                self._live_bytes = 0


__all__ = ["MAX_PENDING_BYTES", "MAX_PENDING_MESSAGES", "Steering"]
