"""CancelSignal: a resettable, thread-safe cancel flag shared across threads.

A leaf (stdlib only), so tools and providers can use it without importing
the driver. A cancel is level-triggered for the run it lands in; the loop
re-arms its signal only at the end of ``finalize``. A *view* is bound to
one run's flag and stays fired after the loop re-arms; a *child* is an
independent signal that follows its parent until detached.
"""

from __future__ import annotations

import logging
import os
import threading
from _thread import LockType
from collections.abc import Callable
from typing import Optional, Union

log = logging.getLogger("loopctl")

#: The cancel reason of a run a host hands back to its queue (a worker's warm
#: shutdown): the run stops here and goes on elsewhere, so tracing records it
#: as handed back, never as cancelled.
HANDED_BACK = "the worker shut down and handed the run back"


#: Guards every flag's waiters and every signal's listeners. One lock for all
#: signals, not one each: a host holds thousands of loops, and every object a
#: loop owns is walked by each full collection of the cyclic GC. It is held
#: only for a few instructions and never while calling out.
_guard = threading.Lock()


def _fresh_guard() -> None:
    # A fork while another thread held the guard would leave the child's copy
    # locked for ever; the child has only the forking thread, so a new one is safe.
    global _guard
    _guard = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_guard)


class Flag:
    """A flag set once (with the reason it was set with); threads can wait on it.

    A lighter ``threading.Event``: one tracked object, where an Event is six
    (its condition, lock, bound methods and waiter deque); nothing is
    allocated for waiting until a thread waits (then one lock for that wait).
    A cancel signal's flag, and a run's done and wake-up flags.
    """

    __slots__ = ("reason", "_fired", "_waiters", "by_view")

    def __init__(self) -> None:
        self.reason: Optional[str] = None
        self._fired = False
        self._waiters: Optional[list[LockType]] = None
        # Fired through a run's view (its own tools, say): the cancel is that run's.
        self.by_view = False

    def is_set(self) -> bool:
        """True once the flag is set."""
        return self._fired

    def set(self, reason: Optional[str] = None) -> None:
        """Set the flag (idempotent) and wake every thread waiting on it."""
        with _guard:
            if not self._fired:
                self.fire(reason)

    def fire(self, reason: Optional[str]) -> None:
        """Set the flag and wake its waiters; the caller holds ``_guard``."""
        self.reason = reason
        self._fired = True
        waiters, self._waiters = self._waiters, None
        for w in waiters or ():
            w.release()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until the flag is set or ``timeout`` seconds pass; True if set."""
        if self._fired:
            return True
        if timeout is not None and timeout <= 0:
            return False
        if timeout is not None and timeout > threading.TIMEOUT_MAX:
            timeout = threading.TIMEOUT_MAX
        waiter = threading.Lock()
        waiter.acquire()
        with _guard:
            if self._fired:
                return True
            if self._waiters is None:
                self._waiters = [waiter]
            else:
                self._waiters.append(waiter)
        try:
            waiter.acquire(True, -1 if timeout is None else timeout)
        finally:
            with _guard:
                waiters = self._waiters
                if waiters is not None and waiter in waiters:
                    waiters.remove(waiter)
                    if not waiters:
                        self._waiters = None
        return self._fired


def _notify(listeners: tuple[Callable[[], None], ...]) -> None:
    for fn in listeners:
        try:
            fn()
        except Exception:  # a listener must never break cancel()
            log.exception("cancel listener %r raised", fn)


class CancelSignal:
    """A resettable, thread-safe cancel flag with waiters and listeners.

    ``reset()`` swaps in a fresh flag, so anything still holding the old one
    (a tool thread that was abandoned) keeps seeing it fired, with its reason.
    """

    __slots__ = ("_event", "_listeners", "_parent", "_follows", "__weakref__")

    def __init__(self) -> None:
        self._event: Flag = Flag()
        # The listeners: None, one callable (a loop's run in flight, the usual
        # case: no list for it), or a list of two or more.
        self._listeners: Union[None, Callable[[], None], list[Callable[[], None]]] = None
        self._parent: Optional[CancelSignal] = None  # set on a view: the signal it reads
        self._follows: Optional[CancelSignal] = None  # set on a child: the signal it follows

    def cancel(self, reason: Optional[str] = None) -> None:
        """Fire the signal (idempotent); wakes every waiter and listener."""
        _notify(self._set(reason))

    def fire(self, reason: Optional[str] = None) -> Callable[[], None]:
        """Fire the flag now; the listeners run when the returned callable is called.

        For a caller that must fire under a lock of its own, which a listener
        may wait for: the flag is set before ``fire`` returns (so whoever
        checks it under that lock sees it), and the listeners are called
        after the lock is released. ``cancel()`` is ``fire()()``.
        """
        owed = self._set(reason)
        return lambda: _notify(owed)

    def _set(self, reason: Optional[str]) -> tuple[Callable[[], None], ...]:
        if self._parent is not None:
            return self._parent._fire(self._event, reason)
        return self._fire(None, reason)

    def _fire(self, expected: Optional[Flag], reason: Optional[str]) -> tuple[Callable[[], None], ...]:
        """Set the flag; the listeners owed a call (none if it was already set)."""
        # A view fires its parent only while the parent still holds the view's
        # flag, checked and set under one lock: a signal re-armed since (the
        # next run's) is never touched; the view's own flag still fires.
        with _guard:
            event = self._event
            if expected is not None and event is not expected:
                if not expected.is_set():
                    expected.fire(reason)
                return ()
            if event.is_set():
                return ()
            event.fire(reason)
            event.by_view = expected is not None
            held = self._listeners
            return tuple(held) if isinstance(held, list) else () if held is None else (held,)

    def is_cancelled(self) -> bool:
        """True once the signal has fired (until the loop re-arms it)."""
        return self._event.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until cancelled or ``timeout`` seconds pass; True if cancelled.

        A ``timeout`` beyond what the platform can wait waits that long instead.
        """
        if timeout is not None and timeout > threading.TIMEOUT_MAX:
            timeout = threading.TIMEOUT_MAX
        return self._event.wait(timeout)

    @property
    def reason(self) -> Optional[str]:
        """The reason given to the ``cancel`` that fired the signal, if any.

        A view (``ToolContext.cancel``) keeps its run's reason after the loop
        re-armed its own signal.
        """
        return self._event.reason

    def reset(self, keep_fired: bool = False) -> None:
        """Re-arm the signal (the loop's, at the end of ``finalize``).

        The flag is replaced even when it never fired: a cancel already on
        its way through the ended run's view (it passed the "still running"
        check just before the run ended) must land on that run's flag, never
        on the one the next run reads.

        Args:
            keep_fired: a cancel that has fired stays fired (with its
                reason) on the new flag: the loop passes it when the cancel
                came after the ended run's ending point, so the next run
                takes it. Checked and swapped in one step, so a cancel
                fired meanwhile is never lost. One fired through the ended
                run's view (a tool of that run that outlived it) is that
                run's and never carries over.
        """
        if self._parent is not None:
            return
        fresh = Flag()
        with _guard:
            old = self._event
            if keep_fired and old.is_set() and not old.by_view:
                fresh.fire(old.reason)
            self._event = fresh

    def add_listener(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` (on the cancelling thread) when the signal fires.

        If it has already fired, ``fn`` is called at once. On a view the
        listener is held by the parent signal.
        """
        parent = self._parent
        if parent is not None:
            # Register on the parent only while it still holds this view's flag,
            # checked and added under its lock. A flag the parent has re-armed
            # away from belongs to an ended run: if it fired, ``fn`` runs now
            # instead of never; if not, that run can no longer be cancelled.
            with _guard:
                live = parent._event is self._event and not self._event.is_set()
                if live:
                    parent._add(fn)
            if not live and self._event.is_set():
                fn()
            return
        with _guard:
            self._add(fn)
            fired = self._event.is_set()
        if fired:
            fn()

    def _add(self, fn: Callable[[], None]) -> None:
        # The caller holds ``_guard``.
        listeners = self._listeners
        if listeners is None:
            self._listeners = fn
        elif isinstance(listeners, list):
            listeners.append(fn)
        else:
            self._listeners = [listeners, fn]

    def remove_listener(self, fn: Callable[[], None]) -> None:
        """Forget a listener added with ``add_listener`` (no error if absent)."""
        if self._parent is not None:
            self._parent.remove_listener(fn)
            return
        with _guard:
            listeners = self._listeners
            if isinstance(listeners, list):
                if fn in listeners:
                    listeners.remove(fn)
                    if len(listeners) == 1:
                        self._listeners = listeners[0]
            elif listeners == fn:  # equal, not identical: a bound method is made anew each time
                self._listeners = None

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
    "Flag",
]
