"""The two cross-thread seams: ``CancelSignal`` and ``Steering``.

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
from collections.abc import Callable
from typing import Optional, Union

from loopctl.messages import Message

log = logging.getLogger("loopctl")


class _Flag(threading.Event):
    """One cancel flag: an Event that also keeps the reason it was set with."""

    def __init__(self) -> None:
        super().__init__()
        self.reason: Optional[str] = None


class CancelSignal:
    """A resettable, thread-safe cancel flag with waiters and listeners.

    ``reset()`` swaps in a fresh flag, so anything still holding the old one
    (a tool thread that was abandoned) keeps seeing it fired, with its reason.
    """

    __slots__ = ("_event", "_lock", "_listeners", "_reason", "_parent", "__weakref__")

    def __init__(self) -> None:
        self._event: _Flag = _Flag()
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []
        self._reason: Optional[str] = None
        self._parent: Optional[CancelSignal] = None

    def cancel(self, reason: Optional[str] = None) -> None:
        """Fire the signal (idempotent); wakes every waiter and listener."""
        if self._parent is not None:
            self._parent._cancel_event(self._event, reason)
            return
        with self._lock:
            if self._event.is_set():
                return
            self._reason = reason
            self._event.reason = reason
            self._event.set()
            listeners = list(self._listeners)
        for fn in listeners:
            try:
                fn()
            except Exception:  # a listener must never break cancel()
                log.exception("cancel listener %r raised", fn)

    def _cancel_event(self, event: _Flag, reason: Optional[str]) -> None:
        # A view cancels its parent only while the parent still has its flag.
        if self._event is event:
            self.cancel(reason)
        elif not event.is_set():
            event.reason = reason
            event.set()

    def is_cancelled(self) -> bool:
        """True once the signal has fired (until the loop re-arms it)."""
        return self._event.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until cancelled or ``timeout`` seconds pass; True if cancelled."""
        return self._event.wait(timeout)

    @property
    def reason(self) -> Optional[str]:
        """The reason given to the ``cancel`` that fired the signal, if any.

        A view (``ToolContext.cancel``) keeps its run's reason after the loop
        re-armed its own signal.
        """
        return self._event.reason

    def reset(self) -> None:
        """Re-arm the signal (the loop's, at the end of ``finalize``)."""
        if self._parent is not None:
            return
        with self._lock:
            if self._event.is_set():
                self._event = _Flag()
            self._reason = None

    def add_listener(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` (on the cancelling thread) when the signal fires.

        If it has already fired, ``fn`` is called at once. On a view the
        listener is held by the parent signal.
        """
        parent = self._parent
        if parent is not None:
            # Register on the parent only while it still holds this view's flag,
            # checked and added under its lock: a flag the parent has re-armed
            # away from was fired, so ``fn`` runs now instead of never.
            with parent._lock:
                live = parent._event is self._event and not self._event.is_set()
                if live:
                    parent._listeners.append(fn)
            if not live:
                fn()
            return
        with self._lock:
            self._listeners.append(fn)
            fired = self._event.is_set()
        if fired:
            fn()

    def remove_listener(self, fn: Callable[[], None]) -> None:
        """Forget a listener added with ``add_listener`` (no error if absent)."""
        if self._parent is not None:
            self._parent.remove_listener(fn)
            return
        with self._lock:
            try:
                self._listeners.remove(fn)
            except ValueError:
                pass

    def view(self) -> CancelSignal:
        """A signal bound to the current flag: fired now or later, it stays fired.

        Given to tools as ``ToolContext.cancel`` so an abandoned tool still
        sees its run's cancel after the loop re-arms its own signal.
        """
        v = CancelSignal()
        v._event = self._event
        v._parent = self
        return v

    def __repr__(self) -> str:
        return f"CancelSignal(cancelled={self.is_cancelled()})"


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
