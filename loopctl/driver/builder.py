"""LoopSetup: what a loop is made of, its builder surface and its read-only views.

``LoopSetup`` owns the loop-level state: the configured parts
(``LoopParts``), the machine and its history, the audit trail, the
emitter, the token meter, the dispatcher, the signals (cancel, steering)
and the busy slot. ``BareLoop`` extends it with running. A loop is
configured one way, with chained ``with_*`` calls; each raises
``ConfigError`` once the first run has started (the components are wired
into the run's hot path), except ``with_observer`` and ``with_approval``,
allowed between runs, never while one is in flight. ``cancel()``,
``is_cancelled()``, ``cancel_signal()`` and ``steering()`` are safe from any
thread at any time; the other accessors belong to the thread that owns the
loop.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar, Union

import attrs

from loopctl.approvals import ApprovalContext
from loopctl.cancel import CancelSignal
from loopctl.config import RunConfig, SessionConfig
from loopctl.context.contributors import ContextContributor
from loopctl.context.manager import ContextManager, TruncatingCompactor
from loopctl.context.memory import Memory
from loopctl.context.tokens import HeuristicTokenCounter, TokenCounter
from loopctl.detection import ConvergenceDetector, LoopDetector
from loopctl.driver.dispatch import Dispatcher
from loopctl.driver.emission import Emitter, RunEvents
from loopctl.driver.handle import RunContext
from loopctl.driver.meter import TokenMeter
from loopctl.driver.old_names import old_setter
from loopctl.driver.parts import LoopParts
from loopctl.driver.resources import LoopResources
from loopctl.driver.signals import Steering
from loopctl.errors import ConfigError
from loopctl.events import ModelSwitched, Observer
from loopctl.events.hooks import HookExecutor
from loopctl.machine import LoopMachine, MachineState
from loopctl.messages import Message, RequestOptions
from loopctl.providers.base import ModelClient
from loopctl.providers.stream_handler import StreamHandler
from loopctl.records import Session
from loopctl.tools.base import Tool
from loopctl.tools.recovery import RecoveryStrategy, Reflector
from loopctl.tools.registry import ToolRegistry

if TYPE_CHECKING:
    from loopctl.fallback import FallbackManager
    from loopctl.tools.health import ToolHealthRegistry
    from loopctl.tools.pipeline import ToolPipelineBuilder

_TURN_MODES = ("streaming", "non_streaming")
#: The default model-call settings: frozen, so every loop shares one (nothing to build, to collect).
_DEFAULT_STREAM_HANDLER = StreamHandler()

_L = TypeVar("_L", bound="LoopSetup")


class LoopSetup:
    """A loop's configuration and loop-level state (``BareLoop`` adds running).

    Args:
        client: a model client (``complete``/``stream``; see ``ModelClient``).
        tools: a ``ToolRegistry`` or an iterable of tools.
        config: the session configuration.
        history: committed messages to resume from.
    """

    def __init__(
        self,
        client: ModelClient,
        tools: Union[ToolRegistry, Iterable[Tool]] = (),
        config: SessionConfig = SessionConfig(),
        *,
        history: Iterable[Message] = (),
    ) -> None:
        if not isinstance(config, SessionConfig):
            raise ConfigError(f"config must be a SessionConfig, got {type(config).__name__}")
        registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
        counter: TokenCounter = HeuristicTokenCounter()
        self._parts = LoopParts(
            client=client,
            tools=registry,
            session_config=config,
            counter=counter,
            context_manager=ContextManager(
                TruncatingCompactor(),
                context_window=config.context_window,
                compact_threshold=config.compact_threshold,
                counter=counter,
            ),
            stream_handler=_DEFAULT_STREAM_HANDLER,
            loop_detector=LoopDetector(),
            convergence=ConvergenceDetector(),
        )
        self._session_config = config
        self._machine = LoopMachine(history)
        self._session = Session(uuid.uuid4().hex)
        self._emitter = Emitter(self._session.id)
        self._meter = TokenMeter(counter)
        self._cancel = CancelSignal()
        self._steering = Steering()
        self._resources = LoopResources(self, self._session.id)
        self._dispatcher = Dispatcher(self._parts, self._resources)
        self._busy = threading.Lock()
        self._active: Optional[RunContext] = None
        self._started = False
        self._closed = False
        self._last_config: Optional[RunConfig] = None

    def _between_runs(self) -> RunEvents:
        """Events that belong to no run (``switch_model`` between runs)."""
        return RunEvents(self._emitter, "", None, None, self._parts.window())

    @property
    def tool_extras(self) -> dict[str, Any]:
        """The dict every ``ToolContext.extras`` is (the host fills it)."""
        return self._parts.tool_extras

    @tool_extras.setter
    def tool_extras(self, extras: dict[str, Any]) -> None:
        self._evolve(tool_extras=extras)

    def _evolve(self, **changes: Any) -> None:
        """Replace the loop's description (frozen) with these parts changed; the dispatcher follows."""
        self._parts = attrs.evolve(self._parts, **changes)
        self._dispatcher.parts = self._parts

    # -- cancellation and steering (any thread) --------------------------------

    def cancel(self, reason: Optional[str] = None) -> bool:
        """Cancel the run in flight (any thread).

        Returns:
            True if it reached a run; False (no effect) when no run is in
            flight or the run has reached its end. It never cancels a later run.
        """
        active = self._active
        if active is None:
            return False
        return self._cancel_run(active, reason)

    def _cancel_run(self, rc: RunContext, reason: Optional[str]) -> bool:
        """Cancel ``rc``'s run only; False once that run has reached its end."""
        with self._busy:
            if self._active is not rc or rc.ending:
                return False
            # Set under the lock the body takes to reach its end (so a run this
            # reached ends cancelled), through its own view (never the next run's).
            notify = rc.cancel.fire(reason)
        notify()  # the listeners outside the lock: they may wait for the run
        return True

    def is_cancelled(self) -> bool:
        """True while the cancel signal is fired (any thread)."""
        return self._cancel.is_cancelled()

    def cancel_signal(self) -> CancelSignal:
        """The loop's shared ``CancelSignal`` (any thread)."""
        return self._cancel

    def steering(self) -> Steering:
        """The loop's one shared ``Steering`` (any thread)."""
        return self._steering

    # -- read-only views -------------------------------------------------------

    @property
    def session(self) -> Session:
        """The audit trail: one ``Run`` per run, success or failure."""
        return self._session

    @property
    def machine(self) -> LoopMachine:
        """The brain (read-only use)."""
        return self._machine

    @property
    def client(self) -> object:
        """The model client."""
        return self._parts.client

    @property
    def tools(self) -> ToolRegistry:
        """The tool registry."""
        return self._parts.tools

    @property
    def session_config(self) -> SessionConfig:
        """The session configuration."""
        return self._session_config

    @property
    def is_running(self) -> bool:
        """True while a run is in flight."""
        return self._active is not None

    @property
    def abandoned_tool_threads(self) -> int:
        """Tool calls of cancelled runs still running (tools that ignore ``ctx.cancel``).

        Bounded: past ``MAX_ABANDONED_TOOL_THREADS`` (64), parallel waves run
        one call at a time on the run's thread instead of starting threads.
        """
        return self._resources.abandoned_tool_threads

    def conversation(self) -> list[Message]:
        """History plus pending (a new list)."""
        return self._machine.full_history()

    def run_config(self) -> Optional[RunConfig]:
        """The in-flight run's config, or the last run's; None before the first."""
        return self._last_config

    def state(self) -> MachineState:
        """The machine's state."""
        return self._machine.state

    def should_continue(self) -> bool:
        """True while the machine is not terminal."""
        return not self._machine.is_terminal

    # -- the builder surface ---------------------------------------------------
    # One way to configure a loop: chainable ``with_*`` calls, each returning
    # the loop. The in-place names the docs taught first stay as thin aliases.

    def _configurable(self: _L, name: str) -> None:
        if self._started:
            raise ConfigError(f"{name}() must be called before the first run starts")

    def with_turn_mode(self: _L, mode: str) -> _L:
        """``"streaming"`` (default) or ``"non_streaming"``."""
        self._configurable("with_turn_mode")
        if mode not in _TURN_MODES:
            raise ConfigError(f"turn mode must be 'streaming' or 'non_streaming', got {mode!r}")
        self._evolve(turn_mode=mode)
        return self

    def with_request_options(self: _L, options: RequestOptions) -> _L:
        """Options sent with every request (model override, max_tokens, ...)."""
        self._configurable("with_request_options")
        if not isinstance(options, RequestOptions):
            raise ConfigError(f"request options must be RequestOptions, got {options!r:.80}")
        self._evolve(request_options=options)
        return self

    def with_token_counter(self: _L, counter: TokenCounter) -> _L:
        """The one token counter used everywhere (also by the context manager)."""
        self._configurable("with_token_counter")
        if not (hasattr(counter, "count_text") and hasattr(counter, "count_message")):
            raise ConfigError(f"token counter needs count_text and count_message: {counter!r:.80}")
        self._evolve(counter=counter)
        self._meter.set_counter(counter)
        if self._parts.context_manager is not None and hasattr(self._parts.context_manager, "counter"):
            self._parts.context_manager.counter = counter
        return self

    def with_memory(self: _L, memory: Memory) -> _L:
        """A memory store (``store``/``retrieve``/``consolidate``)."""
        self._configurable("with_memory")
        self._evolve(memory=memory)
        return self

    def with_context_manager(self: _L, manager: object) -> _L:
        """Replace the default ``ContextManager`` (None disables compaction)."""
        self._configurable("with_context_manager")
        if manager is not None and hasattr(manager, "counter"):
            manager.counter = self._parts.counter
        self._evolve(context_manager=manager)
        return self

    def with_stream_handler(self: _L, handler: StreamHandler) -> _L:
        """How streamed turns are retried and timed out (``StreamHandler``)."""
        self._configurable("with_stream_handler")
        if not hasattr(handler, "stream_turn"):
            raise ConfigError(f"stream handler needs stream_turn(): {handler!r:.80}")
        self._evolve(stream_handler=handler)
        return self

    def with_hook_executor(self: _L, hooks: HookExecutor) -> _L:
        """Hooks that may veto tool calls and compactions."""
        self._configurable("with_hook_executor")
        if not isinstance(hooks, HookExecutor):
            raise ConfigError(f"hooks must be a HookExecutor, got {hooks!r:.80}")
        self._evolve(hooks=hooks)
        self._emitter.hooks = hooks
        return self

    def with_health_registry(self: _L, health: ToolHealthRegistry) -> _L:
        """Per-tool circuit breakers."""
        self._configurable("with_health_registry")
        self._evolve(health=health)
        return self

    def with_reflector(self: _L, reflector: Reflector) -> _L:
        """Analyses failed tool calls for recovery."""
        self._configurable("with_reflector")
        self._evolve(reflector=reflector)
        return self

    def with_recovery_strategy(self: _L, strategy: RecoveryStrategy) -> _L:
        """Decides retry / skip / ask / fail for a failed tool call."""
        self._configurable("with_recovery_strategy")
        self._evolve(recovery=strategy)
        return self

    def with_pipeline(self: _L, builder: ToolPipelineBuilder) -> _L:
        """Tool middleware; pass a builder WITHOUT a core (the loop adds its registry)."""
        self._configurable("with_pipeline")
        if getattr(builder, "has_core", False):
            raise ConfigError(
                "with_pipeline() takes a builder without a core: the loop installs its registry"
            )
        if not hasattr(builder, "build"):
            raise ConfigError(f"with_pipeline() takes a ToolPipeline builder, got {builder!r:.80}")
        self._evolve(pipeline=builder.build_with_core(self._parts.tools))
        return self

    def with_text_streamer(self: _L, streamer: Callable[[str], None]) -> _L:
        """Called with each streamed text delta (before observers)."""
        self._configurable("with_text_streamer")
        if not callable(streamer):
            raise ConfigError(f"text streamer must be callable, got {streamer!r:.80}")
        self._evolve(text_streamer=streamer)
        return self

    def with_contributor(self: _L, contributor: ContextContributor) -> _L:
        """A ``ContextContributor`` consulted every turn (its message is never persisted)."""
        self._configurable("with_contributor")
        if not hasattr(contributor, "contribute"):
            raise ConfigError(f"a contributor needs contribute(ctx): {contributor!r:.80}")
        self._evolve(contributors=(*self._parts.contributors, contributor))
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

    def with_fallback(self: _L, manager: FallbackManager) -> _L:
        """A ``FallbackManager``: model breaker and fallback chain (routing per request)."""
        self._configurable("with_fallback")
        self._evolve(fallback=manager)
        return self

    def with_loop_detector(self: _L, detector: Optional[LoopDetector]) -> _L:
        """Replace the tool-loop detector (None disables it)."""
        self._configurable("with_loop_detector")
        self._evolve(loop_detector=detector)
        return self

    def with_convergence_detector(self: _L, detector: Optional[ConvergenceDetector]) -> _L:
        """Replace the final-answer convergence detector (None disables it)."""
        self._configurable("with_convergence_detector")
        self._evolve(convergence=detector)
        return self

    def with_approval(self: _L, policy: Optional[Callable[[ApprovalContext], bool]]) -> _L:
        """Ask a person before the calls ``policy(ctx)`` picks (allowed between runs).

        ``policy`` receives an ``ApprovalContext`` (``ctx.tool``,
        ``ctx.arguments`` already validated against the tool's schema, ...)
        and returns True when the call must wait for ``handle.approve`` /
        ``handle.deny``; a policy that raises counts as True. Tools marked
        ``@tool(requires_approval=True)`` always wait. None removes the policy.
        """
        if self._active is not None:
            raise ConfigError("with_approval() cannot be called while a run is in flight")
        if policy is not None and not callable(policy):
            raise ConfigError(f"an approval policy must be callable(ctx) -> bool, got {policy!r:.80}")
        self._evolve(approval_policy=policy)
        return self

    def with_observer(self: _L, observer: Observer) -> _L:
        """Add an observer (allowed between runs, never during one)."""
        if self._active is not None:
            raise ConfigError("with_observer() cannot be called while a run is in flight")
        self._emitter.add_observer(observer)
        return self

    # -- the first names the docs taught: thin aliases of the ``with_*`` calls ----

    def register_observer(self, observer: Observer) -> None:
        """Alias of ``with_observer`` (returns None)."""
        self.with_observer(observer)

    def set_turn_mode(self, mode: str) -> None:
        """Alias of ``with_turn_mode`` (returns None)."""
        self.with_turn_mode(mode)

    def set_memory(self, memory: Memory) -> None:
        """Alias of ``with_memory`` (returns None)."""
        self.with_memory(memory)

    def add_contributor(self, contributor: ContextContributor) -> None:
        """Alias of ``with_contributor`` (returns None)."""
        self.with_contributor(contributor)

    def set_stream_handler(self, handler: StreamHandler) -> None:
        """Alias of ``with_stream_handler`` (returns None)."""
        self.with_stream_handler(handler)

    def set_text_streamer(self, streamer: Callable[[str], None]) -> None:
        """Alias of ``with_text_streamer`` (returns None)."""
        self.with_text_streamer(streamer)

    if not TYPE_CHECKING:  # hidden from type checkers: new code uses the ``with_*`` names

        def __getattr__(self, name: str) -> object:
            """The other ``set_*`` names of earlier releases: they warn, then call ``with_*``."""
            return old_setter(self, name)

    def switch_model(self: _L, name: str) -> bool:
        """Switch the client's model between runs; True if the client accepted it.

        Raises:
            ConfigError: an empty name, or a run in flight.
        """
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"model name must be a non-empty str, got {name!r}")
        if self._active is not None:
            raise ConfigError("switch_model() cannot be called while a run is in flight")
        setter: Optional[Callable[[str], bool]] = getattr(self._parts.client, "set_model", None)
        old = self._parts.route.model or self._parts.model_name()
        if setter is None or not setter(name):
            return False
        if old != name:
            between = self._between_runs()
            between.emit(ModelSwitched(between.session_id, between.run_id, old, name))
        if self._parts.fallback is not None and hasattr(self._parts.fallback, "set_primary"):
            self._parts.fallback.set_primary(name)
        self._parts.route.model = None
        return True


__all__ = ["LoopSetup"]
