"""The loop's builder surface: ``set_x`` setters and their fluent ``with_x`` twins.

Every setter raises ``ConfigError`` once the first run has started (the
components are wired into the run's hot path). ``register_observer`` may
also be called between runs, never while one is in flight.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, TypeVar, Union

from loopctl.context.tokens import ConversationMeter, TokenCounter
from loopctl.driver.resources import LoopResources
from loopctl.errors import ConfigError
from loopctl.hooks import HookExecutor
from loopctl.messages import RequestOptions
from loopctl.observers import Observer
from loopctl.tools.registry import ToolRegistry

_TURN_MODES = ("streaming", "non_streaming")
_L = TypeVar("_L", bound="BuilderMixin")


class BuilderMixin:
    """Setters for ``BareLoop`` (mixed in; operates on its private fields)."""

    _started: bool
    _active: Any
    _turn_mode: str
    _request_options: RequestOptions
    _counter: TokenCounter
    _meter: ConversationMeter
    _memory: Any
    _context_manager: Any
    _stream_handler: Any
    _hooks: Optional[HookExecutor]
    _emitter: Any
    _health: Any
    _reflector: Any
    _recovery: Any
    _pipeline: Any
    _tools: ToolRegistry
    _text_streamer: Optional[Callable[[str], None]]
    _contributors: list[Any]
    _resources: LoopResources
    _fallback: Any
    _routed_model: Optional[str]
    _loop_detector: Any
    _convergence: Any
    _client: Any
    _approval_policy: Optional[Callable[[Any], bool]]

    def _model_name(self) -> str:
        return str(getattr(self._client, "model", "") or "")

    def _configurable(self: _L, name: str) -> None:
        if self._started:
            raise ConfigError(f"{name}() must be called before the first run starts")

    def set_turn_mode(self: _L, mode: str) -> None:
        """``"streaming"`` (default) or ``"non_streaming"``."""
        self._configurable("set_turn_mode")
        if mode not in _TURN_MODES:
            raise ConfigError(f"turn mode must be 'streaming' or 'non_streaming', got {mode!r}")
        self._turn_mode = mode

    def with_turn_mode(self: _L, mode: str) -> _L:
        """Fluent ``set_turn_mode``."""
        self.set_turn_mode(mode)
        return self

    def set_request_options(self: _L, options: RequestOptions) -> None:
        """Options sent with every request (model override, max_tokens, ...)."""
        self._configurable("set_request_options")
        if not isinstance(options, RequestOptions):
            raise ConfigError(f"request options must be RequestOptions, got {options!r:.80}")
        self._request_options = options

    def with_request_options(self: _L, options: RequestOptions) -> _L:
        """Fluent ``set_request_options``."""
        self.set_request_options(options)
        return self

    def set_token_counter(self: _L, counter: TokenCounter) -> None:
        """The one token counter used everywhere (also by the context manager)."""
        self._configurable("set_token_counter")
        if not (hasattr(counter, "count_text") and hasattr(counter, "count_message")):
            raise ConfigError(f"token counter needs count_text and count_message: {counter!r:.80}")
        self._counter = counter
        self._meter = ConversationMeter(counter)
        if self._context_manager is not None and hasattr(self._context_manager, "counter"):
            self._context_manager.counter = counter

    def with_token_counter(self: _L, counter: TokenCounter) -> _L:
        """Fluent ``set_token_counter``."""
        self.set_token_counter(counter)
        return self

    def set_memory(self: _L, memory: Any) -> None:
        """A memory store (``store``/``retrieve``/``consolidate``)."""
        self._configurable("set_memory")
        self._memory = memory

    def with_memory(self: _L, memory: Any) -> _L:
        """Fluent ``set_memory``."""
        self.set_memory(memory)
        return self

    def set_context_manager(self: _L, manager: Any) -> None:
        """Replace the default ``ContextManager`` (None disables compaction)."""
        self._configurable("set_context_manager")
        if manager is not None and hasattr(manager, "counter"):
            manager.counter = self._counter
        self._context_manager = manager

    def with_context_manager(self: _L, manager: Any) -> _L:
        """Fluent ``set_context_manager``."""
        self.set_context_manager(manager)
        return self

    def set_stream_handler(self: _L, handler: Any) -> None:
        """How streamed turns are retried and timed out (``StreamHandler``)."""
        self._configurable("set_stream_handler")
        if not hasattr(handler, "stream_turn"):
            raise ConfigError(f"stream handler needs stream_turn(): {handler!r:.80}")
        self._stream_handler = handler

    def with_stream_handler(self: _L, handler: Any) -> _L:
        """Fluent ``set_stream_handler``."""
        self.set_stream_handler(handler)
        return self

    def set_hook_executor(self: _L, hooks: HookExecutor) -> None:
        """Hooks that may veto tool calls and compactions."""
        self._configurable("set_hook_executor")
        if not isinstance(hooks, HookExecutor):
            raise ConfigError(f"hooks must be a HookExecutor, got {hooks!r:.80}")
        self._hooks = hooks
        self._emitter.hooks = hooks

    def with_hook_executor(self: _L, hooks: HookExecutor) -> _L:
        """Fluent ``set_hook_executor``."""
        self.set_hook_executor(hooks)
        return self

    def set_health_registry(self: _L, health: Any) -> None:
        """Per-tool circuit breakers."""
        self._configurable("set_health_registry")
        self._health = health

    def with_health_registry(self: _L, health: Any) -> _L:
        """Fluent ``set_health_registry``."""
        self.set_health_registry(health)
        return self

    def set_reflector(self: _L, reflector: Any) -> None:
        """Analyses failed tool calls for recovery."""
        self._configurable("set_reflector")
        self._reflector = reflector

    def with_reflector(self: _L, reflector: Any) -> _L:
        """Fluent ``set_reflector``."""
        self.set_reflector(reflector)
        return self

    def set_recovery_strategy(self: _L, strategy: Any) -> None:
        """Decides retry / skip / ask / fail for a failed tool call."""
        self._configurable("set_recovery_strategy")
        self._recovery = strategy

    def with_recovery_strategy(self: _L, strategy: Any) -> _L:
        """Fluent ``set_recovery_strategy``."""
        self.set_recovery_strategy(strategy)
        return self

    def set_pipeline(self: _L, builder: Any) -> None:
        """Tool middleware; pass a builder WITHOUT a core (the loop adds its registry)."""
        self._configurable("set_pipeline")
        if getattr(builder, "has_core", False):
            raise ConfigError(
                "set_pipeline() takes a builder without a core: the loop installs its registry"
            )
        if not hasattr(builder, "build"):
            raise ConfigError(f"set_pipeline() takes a ToolPipeline builder, got {builder!r:.80}")
        self._pipeline = builder.build_with_core(self._tools)

    def with_pipeline(self: _L, builder: Any) -> _L:
        """Fluent ``set_pipeline``."""
        self.set_pipeline(builder)
        return self

    def set_text_streamer(self: _L, streamer: Callable[[str], None]) -> None:
        """Called with each streamed text delta (before observers)."""
        self._configurable("set_text_streamer")
        if not callable(streamer):
            raise ConfigError(f"text streamer must be callable, got {streamer!r:.80}")
        self._text_streamer = streamer

    def with_text_streamer(self: _L, streamer: Callable[[str], None]) -> _L:
        """Fluent ``set_text_streamer``."""
        self.set_text_streamer(streamer)
        return self

    def add_contributor(self: _L, contributor: Any) -> None:
        """A ``ContextContributor`` consulted every turn (its message is never persisted)."""
        self._configurable("add_contributor")
        if not hasattr(contributor, "contribute"):
            raise ConfigError(f"a contributor needs contribute(ctx): {contributor!r:.80}")
        self._contributors.append(contributor)

    def with_contributor(self: _L, contributor: Any) -> _L:
        """Fluent ``add_contributor``."""
        self.add_contributor(contributor)
        return self

    def with_temp_dir(self: _L, base: Union[str, Path]) -> _L:
        """Put the managed temp dir under ``base``."""
        self._configurable("with_temp_dir")
        self._resources.temp_base = Path(base)
        return self

    def with_managed_temp_disabled(self: _L) -> _L:
        """No managed temp dir: ``ToolContext.temp_dir`` is None."""
        self._configurable("with_managed_temp_disabled")
        self._resources.temp_base = None
        return self

    def set_fallback(self: _L, manager: Any) -> None:
        """A ``FallbackManager``: model breaker and fallback chain (routing per request)."""
        self._configurable("set_fallback")
        self._fallback = manager

    def with_fallback(self: _L, manager: Any) -> _L:
        """Fluent ``set_fallback``."""
        self.set_fallback(manager)
        return self

    def set_loop_detector(self: _L, detector: Any) -> None:
        """Replace the tool-loop detector (None disables it)."""
        self._configurable("set_loop_detector")
        self._loop_detector = detector

    def with_loop_detector(self: _L, detector: Any) -> _L:
        """Fluent ``set_loop_detector``."""
        self.set_loop_detector(detector)
        return self

    def set_convergence_detector(self: _L, detector: Any) -> None:
        """Replace the final-answer convergence detector (None disables it)."""
        self._configurable("set_convergence_detector")
        self._convergence = detector

    def with_convergence_detector(self: _L, detector: Any) -> _L:
        """Fluent ``set_convergence_detector``."""
        self.set_convergence_detector(detector)
        return self

    def set_approval(self: _L, policy: Optional[Callable[[Any], bool]]) -> None:
        """Ask a person before the calls ``policy(ctx)`` picks (allowed between runs).

        ``policy`` receives an ``ApprovalContext`` (``ctx.tool``,
        ``ctx.arguments`` already validated against the tool's schema, ...)
        and returns True when the call must wait for ``handle.approve`` /
        ``handle.deny``; a policy that raises counts as True. Tools marked
        ``@tool(requires_approval=True)`` always wait. None removes the policy.
        """
        if self._active is not None:
            raise ConfigError("set_approval() cannot be called while a run is in flight")
        if policy is not None and not callable(policy):
            raise ConfigError(f"an approval policy must be callable(ctx) -> bool, got {policy!r:.80}")
        self._approval_policy = policy

    def with_approval(self: _L, policy: Optional[Callable[[Any], bool]]) -> _L:
        """Fluent ``set_approval``."""
        self.set_approval(policy)
        return self

    def register_observer(self: _L, observer: Observer) -> None:
        """Add an observer (allowed between runs, never during one)."""
        if self._active is not None:
            raise ConfigError("register_observer() cannot be called while a run is in flight")
        self._emitter.add_observer(observer)

    def with_observer(self: _L, observer: Observer) -> _L:
        """Fluent ``register_observer``."""
        self.register_observer(observer)
        return self

    def switch_model(self: _L, name: str) -> bool:
        """Switch the client's model between runs; True if the client accepted it.

        Raises:
            ConfigError: an empty name, or a run in flight.
        """
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"model name must be a non-empty str, got {name!r}")
        if self._active is not None:
            raise ConfigError("switch_model() cannot be called while a run is in flight")
        setter: Optional[Callable[[str], bool]] = getattr(self._client, "set_model", None)
        old = self._routed_model or self._model_name()
        if setter is None or not setter(name):
            return False
        if old != name:
            self._emitter.model_switched(old, name)
        if self._fallback is not None and hasattr(self._fallback, "set_primary"):
            self._fallback.set_primary(name)
        self._routed_model = None
        return True


__all__ = ["BuilderMixin"]
