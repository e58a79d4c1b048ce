"""What a loop is made of: the components the builder installs.

One mutable record, filled by the builder's setters before the first run
and read by the run object and the dispatcher (neither of which holds the
loop itself). Only ``routed_model`` changes after the first run: the model
the fallback chain routes to, which outlives a run.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import attrs

from loopctl.config import SessionConfig
from loopctl.context.tokens import TokenCounter
from loopctl.hooks import HookExecutor
from loopctl.messages import RequestOptions
from loopctl.tools.registry import ToolRegistry


@attrs.define(eq=False)
class LoopParts:
    """The configured components of one loop (see the builder for each one's meaning)."""

    client: Any
    tools: ToolRegistry
    session_config: SessionConfig
    counter: TokenCounter
    context_manager: Any
    stream_handler: Any
    loop_detector: Any
    convergence: Any
    turn_mode: str = "streaming"
    request_options: RequestOptions = RequestOptions()
    memory: Any = None
    hooks: Optional[HookExecutor] = None
    health: Any = None
    reflector: Any = None
    recovery: Any = None
    pipeline: Any = None
    text_streamer: Optional[Callable[[str], None]] = None
    contributors: list[Any] = attrs.Factory(list)
    fallback: Any = None  # loopctl.fallback.FallbackManager
    routed_model: Optional[str] = None
    tool_extras: dict[str, Any] = attrs.Factory(dict)
    approval_policy: Optional[Callable[[Any], bool]] = None  # see ``with_approval``

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


__all__ = ["LoopParts"]
