"""loopctl: a synchronous, thread-based runtime for LLM agents.

The brain (``loopctl.machine``) decides; the hands (``BareLoop``) do the IO;
the wire (``loopctl.providers``) talks to models. Cancel and steer a run
from any thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Protocol, runtime_checkable

from loopctl.cancel import CancelSignal
from loopctl.config import ParallelDispatch, RunConfig, SessionConfig
from loopctl.driver.handle import RunHandle
from loopctl.driver.loop import BareLoop
from loopctl.driver.signals import Steering
from loopctl.errors import (
    Cancelled,
    ConfigError,
    ContextExceeded,
    ContextOverflow,
    FallbackExhausted,
    LoopBusy,
    LoopDetected,
    LoopError,
    MaxTurnsExceeded,
    ModelError,
    OutputValidationError,
    RateLimited,
    RateLimitEscalation,
    SessionBusy,
    SessionCorrupt,
    ToolRecoveryExhausted,
    UserInputRequired,
)
from loopctl.events import Observer
from loopctl.hosting.registry import RunRegistry, RunStatus
from loopctl.machine import MachineState
from loopctl.messages import (
    Message,
    ModelRequest,
    ModelResponse,
    RequestOptions,
    Role,
    StopReason,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolResultPart,
    Usage,
)
from loopctl.records import Run, Session, Turn
from loopctl.tools import Tool, ToolContext, ToolError, ToolOutput, ToolRegistry, tool

__version__ = "0.1.0.dev0"


@runtime_checkable
class Loop(Protocol):
    """The engine contract any loop provides (``BareLoop`` satisfies it)."""

    def run(self, input: str, config: Optional[RunConfig] = None) -> Run:
        """Run ``input`` to its end on this loop; the run's record (raises its ``LoopError``)."""
        ...

    def should_continue(self) -> bool:
        """Whether the run in flight has more to do (False once it reached an end)."""
        ...

    def finalize(self, error: Optional[LoopError] = None) -> Run:
        """The exit door every run leaves through; the last run's record."""
        ...

    def state(self) -> MachineState:
        """The machine's state."""
        ...

    def cancel(self, reason: Optional[str] = None) -> bool:
        """Cancel the run in flight; False (no effect) when there is none."""
        ...

    def stop_reason(self) -> Optional[LoopError]:
        """Why the last run ended (None when it completed)."""
        ...


if TYPE_CHECKING:

    def _bare_loop_is_a_loop(loop: BareLoop) -> Loop:
        return loop  # `mypy --strict loopctl` fails here when BareLoop stops satisfying Loop


__all__ = [
    "BareLoop",
    "CancelSignal",
    "Cancelled",
    "ConfigError",
    "ContextExceeded",
    "ContextOverflow",
    "FallbackExhausted",
    "Loop",
    "LoopBusy",
    "LoopDetected",
    "LoopError",
    "MaxTurnsExceeded",
    "Message",
    "ModelError",
    "OutputValidationError",
    "RateLimited",
    "ModelRequest",
    "ModelResponse",
    "Observer",
    "ParallelDispatch",
    "RateLimitEscalation",
    "RequestOptions",
    "Role",
    "Run",
    "RunConfig",
    "RunHandle",
    "RunRegistry",
    "RunStatus",
    "Session",
    "SessionBusy",
    "SessionConfig",
    "SessionCorrupt",
    "Steering",
    "StopReason",
    "TextPart",
    "ThinkingPart",
    "Tool",
    "ToolCallPart",
    "ToolContext",
    "ToolError",
    "ToolOutput",
    "ToolRegistry",
    "ToolResultPart",
    "Turn",
    "Usage",
    "tool",
    "UserInputRequired",
    "ToolRecoveryExhausted",
]
