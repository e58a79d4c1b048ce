"""Running one tool call under a deadline, on a thread we can walk away from.

A Python thread cannot be killed. ``call_with_timeout`` runs the call on a
fresh daemon thread named ``loopctl-tool-timeout-<tool>-<n>`` and waits for
it, the deadline, or the run's cancel, whichever comes first. On a timeout
the thread is abandoned: its result is dropped, and its ``ToolContext``
carries a child ``CancelSignal`` (fired now) instead of the run's signal, so a
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
from typing import Callable, Optional

import attrs

from loopctl.cancel import CancelSignal
from loopctl.timeouts import bounded
from loopctl.tools.base import ToolContext, ToolOutput

_seq = itertools.count(1)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


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

    ``ctx'`` is a copy of ``ctx`` whose ``cancel`` is a child ``CancelSignal``
    following the run's signal. If the run is cancelled first, the result
    is a soft ``cancelled`` error the dispatcher discards anyway.
    """
    parent = ctx.cancel if ctx is not None else None
    child = parent.child() if isinstance(parent, CancelSignal) else CancelSignal()
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
    finished = done.wait(bounded(seconds))  # a custom tool's huge timeout never overflows the wait
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


__all__ = ["call_with_timeout", "format_seconds", "timed_out_text"]
