"""The loop's builder surface: ``set_x`` setters and their fluent ``with_x`` twins.

Every setter raises ``ConfigError`` once the first run has started (the
components are wired into the run's hot path). ``register_observer`` may
also be called between runs, never while one is in flight.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from loopctl.context.tokens import ConversationMeter, TokenCounter
from loopctl.errors import ConfigError
from loopctl.hooks import HookExecutor
from loopctl.messages import RequestOptions
from loopctl.observers import Observer

if TYPE_CHECKING:
    from loopctl.driver.loop import BareLoop

_TURN_MODES = ("streaming", "non_streaming")


class BuilderMixin:
    """Setters for ``BareLoop`` (mixed in; operates on its private fields)."""

    def _configurable(self: BareLoop, name: str) -> None:
        if self._started:
            raise ConfigError(f"{name}() must be called before the first run starts")

    def set_turn_mode(self: BareLoop, mode: str) -> None:
        """``"streaming"`` (default) or ``"non_streaming"``."""
        self._configurable("set_turn_mode")
        if mode not in _TURN_MODES:
            raise ConfigError(f"turn mode must be 'streaming' or 'non_streaming', got {mode!r}")
        self._turn_mode = mode

    def with_turn_mode(self: BareLoop, mode: str) -> BareLoop:
        """Fluent ``set_turn_mode``."""
        self.set_turn_mode(mode)
        return self

    def set_request_options(self: BareLoop, options: RequestOptions) -> None:
        """Options sent with every request (model override, max_tokens, ...)."""
        self._configurable("set_request_options")
        if not isinstance(options, RequestOptions):
            raise ConfigError(f"request options must be RequestOptions, got {options!r:.80}")
        self._request_options = options

    def with_request_options(self: BareLoop, options: RequestOptions) -> BareLoop:
        """Fluent ``set_request_options``."""
        self.set_request_options(options)
        return self

    def set_token_counter(self: BareLoop, counter: TokenCounter) -> None:
        """The one token counter used everywhere (also by the context manager)."""
        self._configurable("set_token_counter")
        if not (hasattr(counter, "count_text") and hasattr(counter, "count_message")):
            raise ConfigError(f"token counter needs count_text and count_message: {counter!r:.80}")
        self._counter = counter
        self._meter = ConversationMeter(counter)
        if self._context_manager is not None and hasattr(self._context_manager, "counter"):
            self._context_manager.counter = counter

    def with_token_counter(self: BareLoop, counter: TokenCounter) -> BareLoop:
        """Fluent ``set_token_counter``."""
        self.set_token_counter(counter)
        return self

    def set_memory(self: BareLoop, memory: Any) -> None:
        """A memory store (``store``/``retrieve``/``consolidate``)."""
        self._configurable("set_memory")
        self._memory = memory

    def with_memory(self: BareLoop, memory: Any) -> BareLoop:
        """Fluent ``set_memory``."""
        self.set_memory(memory)
        return self

    def set_context_manager(self: BareLoop, manager: Any) -> None:
        """Replace the default ``ContextManager`` (None disables compaction)."""
        self._configurable("set_context_manager")
        if manager is not None and hasattr(manager, "counter"):
            manager.counter = self._counter
        self._context_manager = manager

    def with_context_manager(self: BareLoop, manager: Any) -> BareLoop:
        """Fluent ``set_context_manager``."""
        self.set_context_manager(manager)
        return self

    def set_stream_handler(self: BareLoop, handler: Any) -> None:
        """How streamed turns are retried and timed out (``StreamHandler``)."""
        self._configurable("set_stream_handler")
        if not hasattr(handler, "stream_turn"):
            raise ConfigError(f"stream handler needs stream_turn(): {handler!r:.80}")
        self._stream_handler = handler

    def with_stream_handler(self: BareLoop, handler: Any) -> BareLoop:
        """Fluent ``set_stream_handler``."""
        self.set_stream_handler(handler)
        return self

    def set_hook_executor(self: BareLoop, hooks: HookExecutor) -> None:
        """Hooks that may veto tool calls and compactions."""
        self._configurable("set_hook_executor")
        if not isinstance(hooks, HookExecutor):
            raise ConfigError(f"hooks must be a HookExecutor, got {hooks!r:.80}")
        self._hooks = hooks
        self._emitter.hooks = hooks

    def with_hook_executor(self: BareLoop, hooks: HookExecutor) -> BareLoop:
        """Fluent ``set_hook_executor``."""
        self.set_hook_executor(hooks)
        return self

    def set_health_registry(self: BareLoop, health: Any) -> None:
        """Per-tool circuit breakers."""
        self._configurable("set_health_registry")
        self._health = health

    def with_health_registry(self: BareLoop, health: Any) -> BareLoop:
        """Fluent ``set_health_registry``."""
        self.set_health_registry(health)
        return self

    def set_reflector(self: BareLoop, reflector: Any) -> None:
        """Analyses failed tool calls for recovery."""
        self._configurable("set_reflector")
        self._reflector = reflector

    def with_reflector(self: BareLoop, reflector: Any) -> BareLoop:
        """Fluent ``set_reflector``."""
        self.set_reflector(reflector)
        return self

    def set_recovery_strategy(self: BareLoop, strategy: Any) -> None:
        """Decides retry / skip / ask / fail for a failed tool call."""
        self._configurable("set_recovery_strategy")
        self._recovery = strategy

    def with_recovery_strategy(self: BareLoop, strategy: Any) -> BareLoop:
        """Fluent ``set_recovery_strategy``."""
        self.set_recovery_strategy(strategy)
        return self

    def set_pipeline(self: BareLoop, builder: Any) -> None:
        """Tool middleware; pass a builder WITHOUT a core (the loop adds its registry)."""
        self._configurable("set_pipeline")
        if getattr(builder, "has_core", False):
            raise ConfigError(
                "set_pipeline() takes a builder without a core: the loop installs its registry"
            )
        if not hasattr(builder, "build"):
            raise ConfigError(f"set_pipeline() takes a ToolPipeline builder, got {builder!r:.80}")
        self._pipeline = builder.build_with_core(self._tools)

    def with_pipeline(self: BareLoop, builder: Any) -> BareLoop:
        """Fluent ``set_pipeline``."""
        self.set_pipeline(builder)
        return self

    def set_text_streamer(self: BareLoop, streamer: Callable[[str], None]) -> None:
        """Called with each streamed text delta (before observers)."""
        self._configurable("set_text_streamer")
        if not callable(streamer):
            raise ConfigError(f"text streamer must be callable, got {streamer!r:.80}")
        self._text_streamer = streamer

    def with_text_streamer(self: BareLoop, streamer: Callable[[str], None]) -> BareLoop:
        """Fluent ``set_text_streamer``."""
        self.set_text_streamer(streamer)
        return self

    def add_contributor(self: BareLoop, contributor: Any) -> None:
        """A ``ContextContributor`` consulted every turn (its message is never persisted)."""
        self._configurable("add_contributor")
        if not hasattr(contributor, "contribute"):
            raise ConfigError(f"a contributor needs contribute(ctx): {contributor!r:.80}")
        self._contributors.append(contributor)

    def with_contributor(self: BareLoop, contributor: Any) -> BareLoop:
        """Fluent ``add_contributor``."""
        self.add_contributor(contributor)
        return self

    def with_temp_dir(self: BareLoop, base: Union[str, Path]) -> BareLoop:
        """Put the managed temp dir under ``base``."""
        self._configurable("with_temp_dir")
        self._temp_base = Path(base)
        return self

    def with_managed_temp_disabled(self: BareLoop) -> BareLoop:
        """No managed temp dir: ``ToolContext.temp_dir`` is None."""
        self._configurable("with_managed_temp_disabled")
        self._temp_base = None
        return self

    def set_fallback(self: BareLoop, manager: Any) -> None:
        """A ``FallbackManager``: model breaker and fallback chain (routing per request)."""
        self._configurable("set_fallback")
        self._fallback = manager

    def with_fallback(self: BareLoop, manager: Any) -> BareLoop:
        """Fluent ``set_fallback``."""
        self.set_fallback(manager)
        return self

    def set_loop_detector(self: BareLoop, detector: Any) -> None:
        """Replace the tool-loop detector (None disables it)."""
        self._configurable("set_loop_detector")
        self._loop_detector = detector

    def with_loop_detector(self: BareLoop, detector: Any) -> BareLoop:
        """Fluent ``set_loop_detector``."""
        self.set_loop_detector(detector)
        return self

    def set_convergence_detector(self: BareLoop, detector: Any) -> None:
        """Replace the final-answer convergence detector (None disables it)."""
        self._configurable("set_convergence_detector")
        self._convergence = detector

    def with_convergence_detector(self: BareLoop, detector: Any) -> BareLoop:
        """Fluent ``set_convergence_detector``."""
        self.set_convergence_detector(detector)
        return self

    def register_observer(self: BareLoop, observer: Observer) -> None:
        """Add an observer (allowed between runs, never during one)."""
        if self._active is not None:
            raise ConfigError("register_observer() cannot be called while a run is in flight")
        self._emitter.add_observer(observer)

    def with_observer(self: BareLoop, observer: Observer) -> BareLoop:
        """Fluent ``register_observer``."""
        self.register_observer(observer)
        return self

    def switch_model(self: BareLoop, name: str) -> bool:
        """Switch the client's model between runs; True if the client accepted it.

        Raises:
            ConfigError: an empty name, or a run in flight.
        """
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"model name must be a non-empty str, got {name!r}")
        if self._active is not None:
            raise ConfigError("switch_model() cannot be called while a run is in flight")
        setter: Optional[Callable[[str], bool]] = getattr(self._client, "set_model", None)
        old = self._model_name()
        if setter is None or not setter(name):
            return False
        if old != name:
            self._emitter.model_switched(old, name)
        return True


__all__ = ["BuilderMixin"]
