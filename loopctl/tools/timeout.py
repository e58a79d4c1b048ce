"""Running one tool call under a deadline, on a thread we can walk away from.

A Python thread cannot be killed. ``call_with_timeout`` runs the call on a
fresh daemon thread named ``loopctl-tool-timeout-<tool>-<n>`` and waits for
it, the deadline, or the run's cancel, whichever comes first. On a timeout
the thread is abandoned: its result is dropped, and its ``ToolContext``
carries a ``CallCancel`` (fired now) instead of the run's signal, so a
cooperative tool sees ``ctx.cancel.is_cancelled()`` and stops, while the
run itself is NOT cancelled and goes on. A tool that ignores the signal
keeps its thread until it returns; nothing waits for it (``close()`` does
not either).
"""

from __future__ import annotations

import contextvars
import itertools
import re
import threading
from typing import Any, Callable, Optional

import attrs

from loopctl.tools.base import ToolContext, ToolOutput

_seq = itertools.count(1)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class CallCancel:
    """One call's cancel signal: fires on its own ``cancel()`` or the run's.

    It has the read side of ``CancelSignal`` (``is_cancelled``, ``wait``,
    ``reason``, ``add_listener``/``remove_listener``), which is all a tool
    uses. ``detach()`` stops following the run's signal.
    """

    def __init__(self, parent: Any = None) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []
        self._reason: Optional[str] = None
        self._parent = parent
        if parent is not None:
            parent.add_listener(self._on_parent)

    def _on_parent(self) -> None:
        self.cancel(getattr(self._parent, "reason", None) or "run cancelled")

    def cancel(self, reason: Optional[str] = None) -> None:
        """Fire (idempotent); wakes waiters and calls listeners."""
        with self._lock:
            if self._event.is_set():
                return
            self._reason = reason
            self._event.set()
            listeners = list(self._listeners)
        for fn in listeners:
            try:
                fn()
            except Exception:  # pragma: no cover - a listener must not break cancel
                pass

    def detach(self) -> None:
        """Stop following the parent signal (the call is over)."""
        parent, self._parent = self._parent, None
        if parent is not None:
            parent.remove_listener(self._on_parent)

    def is_cancelled(self) -> bool:
        """True once fired."""
        return self._event.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until fired or ``timeout`` passes; True if fired."""
        return self._event.wait(timeout)

    @property
    def reason(self) -> Optional[str]:
        """Why it fired (``"timed out after 2s"``, the run's reason, ...)."""
        return self._reason

    def add_listener(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` when fired (at once if already fired)."""
        with self._lock:
            fired = self._event.is_set()
            if not fired:
                self._listeners.append(fn)
        if fired:
            fn()

    def remove_listener(self, fn: Callable[[], None]) -> None:
        """Forget ``fn`` (no error if absent)."""
        with self._lock:
            try:
                self._listeners.remove(fn)
            except ValueError:
                pass

    def __repr__(self) -> str:
        return f"CallCancel(cancelled={self.is_cancelled()})"


def format_seconds(seconds: float) -> str:
    """``2`` -> ``"2s"``, ``0.05`` -> ``"0.05s"``."""
    return f"{seconds:g}s"


def timed_out_text(tool: str, seconds: float) -> str:
    """The soft error text of a timed-out call."""
    return f"Tool '{tool}' timed out after {format_seconds(seconds)}"


def call_with_timeout(
    tool: str,
    seconds: float,
    ctx: Optional[ToolContext],
    fn: Callable[[Optional[ToolContext]], ToolOutput],
) -> ToolOutput:
    """Run ``fn(ctx')`` with a deadline; a soft error when it passes.

    ``ctx'`` is a copy of ``ctx`` whose ``cancel`` is a ``CallCancel``
    following the run's signal. If the run is cancelled first, the result
    is a soft ``cancelled`` error the dispatcher discards anyway.
    """
    parent = ctx.cancel if ctx is not None else None
    child = CallCancel(parent)
    inner = attrs.evolve(ctx, cancel=child) if ctx is not None else None
    box: list[ToolOutput] = []
    done = threading.Event()

    def target() -> None:
        try:
            box.append(fn(inner))
        except BaseException as exc:  # fn converts exceptions; this guards the guard
            box.append(ToolOutput.error(f"Tool '{tool}' raised {type(exc).__name__}: {exc}"))
        finally:
            child.detach()
            done.set()

    wake = done.set
    child.add_listener(wake)
    thread = threading.Thread(
        target=contextvars.copy_context().run, args=(target,), name=f"loopctl-tool-timeout-{_UNSAFE.sub('_', tool)[:40]}-{next(_seq)}", daemon=True
    )
    thread.start()
    finished = done.wait(seconds)
    child.remove_listener(wake)
    if finished and box:
        return box[0]
    # Abandoned: stop following the run's signal now (not when the stuck
    # thread ends), so no listener outlives the call on the loop's signal.
    if child.is_cancelled():
        child.detach()
        return ToolOutput.error(f"Tool '{tool}' cancelled")
    child.cancel(f"timed out after {format_seconds(seconds)}")
    child.detach()
    if box:  # it finished in the instant between the deadline and here
        return box[0]
    return ToolOutput.error(timed_out_text(tool, seconds))


__all__ = ["CallCancel", "call_with_timeout", "format_seconds", "timed_out_text"]
