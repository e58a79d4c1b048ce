"""The demo app: the ``loopctl`` command, its live view, the demo tools and
the embedded offline demo model with its arithmetic.

Nothing in the library imports this package; it is an application built on
the library's public pieces. ``OfflineModel`` and ``demo_tools`` are
importable from here.
"""

from __future__ import annotations

from loopctl.demo.model import OfflineModel
from loopctl.demo.tools import demo_tools

__all__ = ["OfflineModel", "demo_tools"]
