"""Ctrl-C while a run is in flight: the first cancels the run, a second exits at once.

The handler is installed only on the main thread and never raises, so no
``KeyboardInterrupt`` lands inside ``start()`` or a lock; before exiting
hard it restores the terminal. It only counts: Python runs it between any
two steps of the main thread, maybe inside the lock a cancel takes (waiting
on the run does), so the cancel itself is made by ``poll()``, which the main
thread calls from its wait loop.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from loopctl.demo.terminal import restore_terminal

EXIT_CANCELLED = 130


class Interrupts:
    """SIGINT while a run is in flight: the first cancels it, a second exits at once.

    The handler never raises, so no ``KeyboardInterrupt`` can land inside
    ``start()`` or a lock; the first Ctrl-C cancels the run at the next
    ``poll()`` (or at ``attach()`` when it came before the handle existed).
    Off the main thread it installs nothing.
    """

    def __init__(self) -> None:
        self._handle: Any = None
        self.count = 0
        self._cancelled = False
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
            self._installed = True
        return self

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.count > 1:
            restore_terminal()
            os._exit(EXIT_CANCELLED)

    def attach(self, handle: Any) -> None:
        """The run to cancel on Ctrl-C (cancelled now if Ctrl-C came first)."""
        self._handle = handle
        self.poll()

    def poll(self) -> None:
        """Cancel the attached run if Ctrl-C came (once; call it while waiting on the run)."""
        if self.count and not self._cancelled and self._handle is not None:
            self._cancelled = True
            self._handle.cancel("interrupted (Ctrl-C)")

    def __exit__(self, *exc: Any) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)


__all__ = ["EXIT_CANCELLED", "Interrupts"]
