"""``Steering``: guidance from outside the loop, one of the two cross-thread seams.

The other, ``CancelSignal``, lives in the leaf ``loopctl.cancel``.

Both are safe from any thread at any time. A cancel is level-triggered for
the run it lands in: the loop observes it at every checkpoint and re-arms
the signal only at the end of ``finalize`` (one cancel = one cancelled
run). Steering guidance is accepted only while a run is in flight (the
in-flight check and the acceptance share one lock), drained at turn
boundaries, and sealed when the run ends. The slot opens when the run is
launched, before ``start()`` returns, so guidance offered the moment a run
has started is accepted and lands at its first boundary.

Held guidance is bounded: live and sealed together stay within
``max_messages`` messages and ``max_bytes`` bytes of text (UTF-8). Accepted
guidance is never dropped (every accepted push is delivered once or handed
back once): a push that would pass a cap is refused and stores nothing, so
leftovers nobody takes make later pushes refused until they are taken or
cleared.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Union

from loopctl.messages import Message, Role, ThinkingPart, ToolCallPart, ToolResultPart

#: Default cap on guidance held, live and sealed (messages).
MAX_PENDING_MESSAGES = 10_000
#: Default cap on guidance held, live and sealed (bytes of UTF-8 text).
MAX_PENDING_BYTES = 8 * 1024 * 1024


#: Shared stand-ins for "nothing held": never mutated (a push or a seal swaps
#: in a container of the instance's own first).
_NONE_LIVE: list[Message] = []
_NONE_SEALED: deque[tuple[Message, int]] = deque()


def _size(message: Message) -> int:
    return sum(len(getattr(p, "text", "").encode("utf-8", "surrogatepass")) for p in message.parts)


def guidance(message: Union[Message, str]) -> Message:
    """``message`` as guidance: a user message (text becomes one; another role's parts are kept, not its role, nor reasoning).

    Raises:
        TypeError: neither a ``Message`` nor a str.
        ValueError: a ``Message`` with tool calls or tool results (they
            answer or ask for a call: never guidance).
    """
    if isinstance(message, str):
        return Message.user(message)
    if not isinstance(message, Message):
        raise TypeError(f"steering takes a Message or str, got {type(message).__name__}: {message!r:.60}")
    if any(type(p) in (ToolCallPart, ToolResultPart) for p in message.parts):
        kinds = sorted({type(p).__name__ for p in message.parts})
        raise ValueError(f"steering guidance cannot carry tool calls or results, got a {message.role.value!r} "
                         f"message with {kinds}")
    if message.role == Role.USER and not any(type(p) is ThinkingPart for p in message.parts):
        return message
    # A model's reasoning block belongs to its own turn (a provider may replay it, signed): not to guidance.
    return Message(Role.USER, tuple(p for p in message.parts if type(p) is not ThinkingPart))


class Steering:
    """Guidance from outside the loop, delivered at the next turn boundary.

    ``push`` is accepted only while a run is in flight (from the moment
    ``start()`` returns), and only while the guidance held, live and
    sealed, stays within the caps with it. Guidance the run never reached is
    sealed when it ends: ``take_leftovers`` hands it back; later runs never
    deliver it. Sealed guidance counts against the same caps and is never
    dropped: a push that live plus sealed guidance leave no room for is
    refused (take or clear the leftovers to make room).

    Args:
        max_messages: at most this many messages are held (live and sealed).
        max_bytes: at most this many bytes of text (UTF-8) are held (live
            and sealed).
    """

    def __init__(self, max_messages: int = MAX_PENDING_MESSAGES, max_bytes: int = MAX_PENDING_BYTES) -> None:
        self._lock = threading.Lock()
        self._open = False
        # Both made on first use: most loops never hear any guidance, and a
        # host holding thousands of loops pays for every container in each
        # full collection of the cyclic GC.
        self._live: list[Message] = _NONE_LIVE
        self._sealed: deque[tuple[Message, int]] = _NONE_SEALED  # (message, its size), oldest first
        self._arrived = 0
        self._live_bytes = 0
        self._sealed_bytes = 0
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.set_limits(max_messages, max_bytes)

    def set_limits(self, max_messages: int, max_bytes: int) -> None:
        """Change the caps on held guidance (counts and bytes; both >= 1).

        Guidance already held is kept, even above lowered caps: pushes are
        refused until it fits.

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
            message: plain text, or a ``Message`` of text (and images):
                either becomes a user message (a system or assistant
                message's parts are kept, its role is not).

        Returns:
            True if accepted; False (nothing stored) when no run is in
            flight, or when the guidance held (live and sealed) with it would
            pass ``max_messages`` or ``max_bytes``.

        Raises:
            TypeError: neither a ``Message`` nor a str.
            ValueError: a ``Message`` with tool calls or tool results (they
                answer or ask for a call: never guidance).
        """
        msg = guidance(message)
        size = _size(msg)
        with self._lock:
            if not self._open:
                return False
            if (
                len(self._live) + len(self._sealed) >= self.max_messages
                or self._live_bytes + self._sealed_bytes + size > self.max_bytes
            ):
                return False
            if self._live is _NONE_LIVE:
                self._live = [msg]
            else:
                self._live.append(msg)
            self._live_bytes += size
            self._arrived += 1
            return True

    def take_leftovers(self) -> list[Message]:
        """Remove and return sealed guidance (from ended runs), in push order."""
        with self._lock:
            out = [m for m, _ in self._sealed]
            self._sealed = _NONE_SEALED
            self._sealed_bytes = 0
            return out

    def queued(self) -> list[Message]:
        """Guidance accepted for the run in flight and not delivered yet, left in place (push order).

        Each of these reaches the run at its next turn boundary, or is sealed
        (a leftover) if the run ends first.
        """
        with self._lock:
            return list(self._live)

    def sealed(self) -> list[Message]:
        """Sealed guidance (from ended runs, or handed back by sub-agents' runs), left in place."""
        with self._lock:
            return [m for m, _ in self._sealed]

    def take_all(self) -> list[Message]:
        """Remove and return sealed plus live guidance (the shutdown collect)."""
        with self._lock:
            out = [m for m, _ in self._sealed] + self._live
            self._sealed = _NONE_SEALED
            self._live = _NONE_LIVE
            self._live_bytes = self._sealed_bytes = 0
            return out

    def clear(self) -> None:
        """Drop all guidance, sealed and live."""
        with self._lock:
            self._sealed = _NONE_SEALED
            self._live = _NONE_LIVE
            self._live_bytes = self._sealed_bytes = 0

    @property
    def held(self) -> tuple[int, int]:
        """Messages and bytes of text held now, live and sealed.

        Within the caps, unless they were lowered or a sub-agent's run handed
        guidance back since.
        """
        with self._lock:
            return len(self._live) + len(self._sealed), self._live_bytes + self._sealed_bytes

    @property
    def is_open(self) -> bool:
        """True while a run accepts guidance."""
        return self._open

    # -- the loop's side -------------------------------------------------------

    def _open_slot(self) -> None:
        """Accept guidance for the run being launched (before ``start()`` returns).

        Anything still live belongs to an earlier run that ended without
        closing the slot: seal it, so this run never delivers it.
        """
        with self._lock:
            self._seal_live_locked()
            self._open = True

    def _drain(self) -> list[Message]:
        """Take the live guidance, in push order (the run's thread, at a boundary)."""
        if not self._live:  # racy fast path; a push that misses it lands next time
            return []
        with self._lock:
            out, self._live = self._live, _NONE_LIVE
            if out is _NONE_LIVE:  # cleared since the fast path looked
                return []
            self._live_bytes = 0
            return out

    def _hand_back(self, messages: list[Message]) -> None:
        """Seal guidance a sub-agent's run never reached: it comes back as leftovers.

        Accepted there, so kept here even past this slot's caps (pushes are
        refused until it is taken).
        """
        if messages:
            with self._lock:
                self._own_sealed_locked()
                for m in messages:
                    size = _size(m)
                    self._sealed.append((m, size))
                    self._sealed_bytes += size

    def _close_and_seal(self) -> None:
        """Refuse further pushes and seal what was never drained (idempotent)."""
        with self._lock:
            self._open = False
            self._seal_live_locked()

    def _seal_live_locked(self) -> None:
        if not self._live:
            return
        self._own_sealed_locked()
        for m in self._live:
            self._sealed.append((m, _size(m)))
        self._sealed_bytes += self._live_bytes
        self._live = _NONE_LIVE
        self._live_bytes = 0

    def _own_sealed_locked(self) -> None:
        if self._sealed is _NONE_SEALED:
            self._sealed = deque()


class RunSteering:
    """The run's side of a ``Steering`` (package-internal).

    The loop opens the slot when it launches a run; the run drains it at each
    turn boundary and closes it as it ends; a sub-agent's leftovers are handed
    back to the caller's slot. ``Steering``'s public surface stays the
    caller's side only (push, leftovers, caps).
    """

    __slots__ = ("steering",)

    def __init__(self, steering: Steering) -> None:
        self.steering = steering

    def open(self) -> None:
        """Accept guidance for the run being launched; earlier live guidance is sealed."""
        self.steering._open_slot()

    def drain(self) -> list[Message]:
        """Take the live guidance, in push order (the run's thread, at a boundary)."""
        return self.steering._drain()

    @property
    def arrived(self) -> int:
        """How many pushes were ever accepted: a change means guidance came in meanwhile."""
        return self.steering._arrived

    def close(self) -> None:
        """Refuse further pushes and seal what was never drained (idempotent)."""
        self.steering._close_and_seal()

    def hand_back(self, messages: list[Message]) -> None:
        """Seal guidance a sub-agent's run never reached: it comes back as leftovers."""
        self.steering._hand_back(messages)


__all__ = ["MAX_PENDING_BYTES", "MAX_PENDING_MESSAGES", "RunSteering", "Steering", "guidance"]
