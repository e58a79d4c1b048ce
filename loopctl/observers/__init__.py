"""The observer events and ``Observer``, at the import path the docs teach.

A stable alias of ``loopctl.events`` (where each event is declared once):
``from loopctl.observers import Observer, RunEnd`` and
``from loopctl.events import Observer, RunEnd`` name the same classes. The
names are the events package's own list, so the two can never drift apart.
"""

from __future__ import annotations

from loopctl.events import *  # noqa: F403
from loopctl.events import __all__ as __all__  # noqa: PLC0414
