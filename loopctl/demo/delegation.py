"""The demo's sub-agent set-up (``loopctl run --subagent``): arithmetic goes to a ``calculator``.

The top-level agent keeps ``lookup`` and gets one more tool, ``calculator``:
a sub-agent (``BareLoop.as_tool``) with its own model client and the
``add`` and ``multiply`` tools. The offline model hands any arithmetic it
cannot do itself to that tool, so the live view shows the sub-agent's
calls indented under the parent's ``calculator`` call.
"""

from __future__ import annotations

from typing import Callable, Optional

from loopctl.config import SessionConfig
from loopctl.demo.arithmetic import CALCULATOR
from loopctl.demo.tools import AddTool, LookupTool, MultiplyTool
from loopctl.driver.loop import BareLoop
from loopctl.providers.base import ModelClient
from loopctl.tools.base import Tool

CALCULATOR_DESCRIPTION = (
    "A sub-agent that does arithmetic with its own add and multiply tools. "
    "Give it one task, e.g. 'What is (2 + 3) * 4?'; it answers with the result."
)


def delegating_tools(
    make_client: Callable[[], ModelClient], delay: float = 0.0, approval_policy: Optional[Callable[[object], bool]] = None
) -> list[Tool]:
    """``lookup`` plus the ``calculator`` sub-agent (a loop with ``add`` and ``multiply``).

    Args:
        make_client: makes the sub-agent's own model client.
        delay: seconds each demo tool call waits (on the cancel signal).
        approval_policy: the sub-agent's approval policy (``--ask``), if any.
    """
    calculator = BareLoop(
        make_client(),
        [AddTool(delay), MultiplyTool(delay)],
        SessionConfig(system_prompt="You do arithmetic with the add and multiply tools."),
    )
    if approval_policy is not None:
        calculator.with_approval(approval_policy)
    return [LookupTool(delay=delay), calculator.as_tool(CALCULATOR, CALCULATOR_DESCRIPTION)]


__all__ = ["CALCULATOR_DESCRIPTION", "delegating_tools"]
