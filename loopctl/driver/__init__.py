"""The hands: the blocking driver that runs the machine's decisions.

Owns threads, the clock and IO; ties providers, tools and context together.
"""

from __future__ import annotations

from loopctl.cancel import CancelSignal
from loopctl.driver.handle import RunHandle
from loopctl.driver.loop import BareLoop
from loopctl.driver.signals import Steering

__all__ = ["BareLoop", "CancelSignal", "RunHandle", "Steering"]
