"""The hands: the blocking driver that runs the machine's decisions.

Owns threads, the clock and IO; ties providers, tools and context together.
``loop.py`` holds ``BareLoop`` (configuration, machine, signals; ``run`` and
``start``), ``builder.py`` its setup and setters, ``run.py`` the per-run
``RunDriver`` (its three handlers in timeline order, then ``finalize``);
``llm_turn``, ``dispatch`` and ``compaction`` do one handler's IO each;
``emission`` is the only caller of observers and hooks; ``handle`` holds a
run's fence and ``RunHandle``; ``signals`` the ``Steering`` slot;
``approvals`` a run's approval slot and ``approval_gate`` which calls of a
batch wait for a person and how the batch runs around them.
"""

from __future__ import annotations

from loopctl.cancel import CancelSignal
from loopctl.driver.handle import RunHandle
from loopctl.driver.loop import BareLoop
from loopctl.driver.signals import Steering

__all__ = ["BareLoop", "CancelSignal", "RunHandle", "Steering"]
