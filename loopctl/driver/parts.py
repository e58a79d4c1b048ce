"""What a loop is made of: one frozen, typed description of the agent.

The builder replaces the whole description (``attrs.evolve``) for each
setting, before the first run; a run is handed the description current at
its launch, and the dispatcher the same one. The components themselves may
keep state (a detector's counts, a breaker's failures): the description
fixes which ones the loop uses. The one value that changes after the first
run is the model the fallback chain routes to (``route``), which outlives a
run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

import attrs

from loopctl.approvals import ApprovalContext
from loopctl.config import SessionConfig
from loopctl.context.contributors import ContextContributor
from loopctl.context.memory import Memory
from loopctl.context.tokens import TokenCounter
from loopctl.events.hooks import HookExecutor
from loopctl.messages import RequestOptions
from loopctl.providers.base import ModelClient
from loopctl.providers.stream_handler import StreamHandler
from loopctl.tools.recovery import RecoveryStrategy, Reflector
from loopctl.tools.registry import ToolRegistry

if TYPE_CHECKING:
    from loopctl.detection import ConvergenceDetector, LoopDetector
    from loopctl.fallback import FallbackManager
    from loopctl.tools.health import ToolHealthRegistry
    from loopctl.tools.pipeline import ToolPipeline


@attrs.define(eq=False)
class ModelRoute:
    """The model the fallback chain routes requests to (None: the client's own)."""

    model: Optional[str] = None


@attrs.frozen(eq=False)
class LoopParts:
    """The configured components of one loop (see the builder for each one's meaning)."""

    client: ModelClient
    tools: ToolRegistry
    session_config: SessionConfig
    counter: TokenCounter
    # A ``ContextManager`` or any object with its ``compact(messages, **options)``.
    context_manager: object
    stream_handler: StreamHandler
    loop_detector: Optional[LoopDetector]
    convergence: Optional[ConvergenceDetector]
    turn_mode: str = "streaming"
    request_options: RequestOptions = RequestOptions()
    memory: Optional[Memory] = None
    hooks: Optional[HookExecutor] = None
    health: Optional[ToolHealthRegistry] = None
    reflector: Optional[Reflector] = None
    recovery: Optional[RecoveryStrategy] = None
    pipeline: Optional[ToolPipeline] = None
    text_streamer: Optional[Callable[[str], None]] = None
    contributors: tuple[ContextContributor, ...] = ()
    fallback: Optional[FallbackManager] = None
    route: ModelRoute = attrs.Factory(ModelRoute)
    tool_extras: dict[str, Any] = attrs.Factory(dict)
    approval_policy: Optional[Callable[[ApprovalContext], bool]] = None  # see ``with_approval``

    def model_name(self) -> str:
        """The client's model name ("" when it has none)."""
        return str(getattr(self.client, "model", "") or "")

    def provider_name(self) -> Optional[str]:
        """The client's ``provider`` (``"openai"``, ...), or None when it names none."""
        provider = getattr(self.client, "provider", None)
        return provider if isinstance(provider, str) and provider else None

    def window(self) -> Optional[int]:
        """The context window, or None when window policy is off (0)."""
        w = self.session_config.context_window
        return w if w > 0 else None


__all__ = ["LoopParts", "ModelRoute"]
