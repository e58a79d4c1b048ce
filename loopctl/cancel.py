"""CancelSignal: a resettable, thread-safe cancel flag shared across threads.

A leaf (stdlib only), so tools and providers can use it without importing
the driver. A cancel is level-triggered for the run it lands in; the loop
re-arms its signal only at the end of ``finalize``. A *view* is bound to
one run's flag and stays fired after the loop re-arms; a *child* is an
independent signal that follows its parent until detached.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Optional

log = logging.getLogger("loopctl")

#: The cancel reason of a run a host hands back to its queue (a worker's warm
#: shutdown): the run stops here and goes on elsewhere, so tracing records it
#: as handed back, never as cancelled.
HANDED_BACK = "the worker shut down and handed the run back"


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

    __slots__ = ("_event", "_lock", "_listeners", "_parent", "_follows", "__weakref__")

    def __init__(self) -> None:
        self._event: _Flag = _Flag()
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []
        self._parent: Optional[CancelSignal] = None  # set on a view: the signal it reads
        self._follows: Optional[CancelSignal] = None  # set on a child: the signal it follows

    def cancel(self, reason: Optional[str] = None) -> None:
        """Fire the signal (idempotent); wakes every waiter and listener."""
        if self._parent is not None:
            self._parent._fire(self._event, reason)
        else:
            self._fire(None, reason)

    def _fire(self, expected: Optional[_Flag], reason: Optional[str]) -> None:
        # A view fires its parent only while the parent still holds the view's
        # flag, checked and set under one lock: a signal re-armed since (the
        # next run's) is never touched; the view's own flag still fires.
        with self._lock:
            event = self._event
            if expected is not None and event is not expected:
                if not expected.is_set():
                    expected.reason = reason
                    expected.set()
                return
            if event.is_set():
                return
            event.reason = reason
            event.set()
            listeners = list(self._listeners)
        for fn in listeners:
            try:
                fn()
            except Exception:  # a listener must never break cancel()
                log.exception("cancel listener %r raised", fn)

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

    def child(self) -> CancelSignal:
        """An independent signal that also fires when this one does, until ``detach()``.

        Cancelling the child never cancels this signal. ``TimeoutMiddleware``
        gives one to a timed call: it fires the child on a timeout, while the
        run's own cancel still reaches the call through it.
        """
        c = CancelSignal()
        c._follows = self
        self.add_listener(c._follow)
        return c

    def _follow(self) -> None:
        parent = self._follows
        self.cancel((parent.reason if parent is not None else None) or "run cancelled")

    def detach(self) -> None:
        """Stop following the signal this child was made from (no-op otherwise)."""
        parent, self._follows = self._follows, None
        if parent is not None:
            parent.remove_listener(self._follow)

    def __repr__(self) -> str:
        return f"CancelSignal(cancelled={self.is_cancelled()})"


__all__ = [
    "HANDED_BACK",
    "CancelSignal",
]
