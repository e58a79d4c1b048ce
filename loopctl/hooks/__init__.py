"""Hooks, at the import path the docs teach.

A stable alias of ``loopctl.events.hooks`` (hooks live beside the events):
both paths name the same classes, from the hooks module's own list.
"""

from __future__ import annotations

from loopctl.events.hooks import *  # noqa: F403
from loopctl.events.hooks import __all__ as __all__  # noqa: PLC0414
