"""BareLoop: the blocking driver (the hands) over the sans-IO machine (the brain).

``run()`` follows the seed exactly: audit entry -> ``on_run_start`` ->
``accept_input`` -> open the steering slot -> loop over ``next_step`` ->
``finalize``. The run's body always executes on its own named thread;
``run()`` waits on it (with the caller's contextvars copied in) and
``start()`` returns a ``RunHandle``. On cancel, whoever waits takes the run
over at once (see ``handle.py``), so ``run()`` returns within the cancel
bound even while a tool or a model call is stuck. Every exit goes through
``finalize()``.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional, Union

from loopctl.config import RunConfig, SessionConfig
from loopctl.context.tokens import (
    ConversationMeter,
    HeuristicTokenCounter,
    TokenCounter,
    UsageCalibration,
    count_messages,
)
from loopctl.driver.builder import BuilderMixin
from loopctl.driver.checkpoint import Checkpoint, ResumePoint, restore
from loopctl.driver.compaction import run_compaction
from loopctl.driver.dispatch import Dispatcher
from loopctl.driver.emission import Emitter
from loopctl.driver.finalize import finalize_run
from loopctl.driver.handle import Abandoned, RunContext, RunHandle
from loopctl.driver.resources import LoopResources
from loopctl.driver.signals import CancelSignal, Steering
from loopctl.driver.turns import handle_call_llm, handle_call_tools
from loopctl.driver.views import ViewsMixin
from loopctl.errors import (
    Cancelled,
    ConfigError,
    LoopBusy,
    LoopError,
    MaxTurnsExceeded,
)
from loopctl.hooks import HookExecutor
from loopctl.machine import (
    CallLLM,
    CallTools,
    CancelledOutcome,
    Compact,
    Completed,
    Failed,
    LoopMachine,
    MachinePolicy,
    MaxTurnsReached,
    Outcome,
)
from loopctl.messages import Message, RequestOptions, StopReason
from loopctl.providers.stream_handler import StreamHandler, cancellable_complete
from loopctl.records import Run, Session
from loopctl.tools.base import Tool
from loopctl.tools.registry import ToolRegistry

log = logging.getLogger("loopctl")


class BareLoop(BuilderMixin, ViewsMixin):
    """Runs an agent: asks the machine what is next, does it, reports back.

    Args:
        client: a model client (``complete``/``stream``; see ``ModelClient``).
        tools: a ``ToolRegistry`` or an iterable of tools.
        config: the session configuration.
    """

    def __init__(
        self,
        client: Any,
        tools: Union[ToolRegistry, Iterable[Tool]] = (),
        config: SessionConfig = SessionConfig(),
        *,
        history: Iterable[Message] = (),
    ) -> None:
        if not isinstance(config, SessionConfig):
            raise ConfigError(f"config must be a SessionConfig, got {type(config).__name__}")
        self._client = client
        self._tools = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
        self._session_config = config
        self._machine = LoopMachine(history)
        self._session = Session(uuid.uuid4().hex)
        self._emitter = Emitter(self._session.id)
        self._cancel = CancelSignal()
        self._steering = Steering()
        self._dispatcher = Dispatcher(self)
        self.tool_extras: dict[str, Any] = {}

        self._turn_mode = "streaming"
        self._request_options = RequestOptions()
        self._counter: TokenCounter = HeuristicTokenCounter()
        self._meter = ConversationMeter(self._counter)
        self._calibration = UsageCalibration()
        self._memory: Any = None
        self._context_manager: Any = _default_context_manager(config, self._counter)
        self._custom_context_manager = False
        self._stream_handler: Any = StreamHandler()
        self._hooks: Optional[HookExecutor] = None
        self._health: Any = None
        self._reflector: Any = None
        self._recovery: Any = None
        self._pipeline: Any = None
        self._text_streamer: Optional[Callable[[str], None]] = None
        self._contributors: list[Any] = []
        self._fallback: Any = None  # loopctl.fallback.FallbackManager
        self._routed_model: Optional[str] = None
        self._loop_detector: Any = _default_loop_detector()
        self._convergence: Any = _default_convergence_detector()

        self._busy = threading.Lock()
        self._active: Optional[RunContext] = None
        self._started = False
        self._closed = False
        self._last_config: Optional[RunConfig] = None

        # Run-scoped working state (valid while a run is in flight).
        self._run_input = ""
        self._run_config_now = RunConfig()
        self._base_options: Optional[RequestOptions] = None
        self._deferred_transient_tokens = 0
        self._overhead = 0
        self._tool_names: frozenset[str] = frozenset()
        self._llm_phase: tuple[int, int, Optional[StopReason]] = (0, 0, None)
        # The phase whose on_turn_end is still owed: (turn, phase, t0, in, out, stop, context).
        self._open_phase: Optional[tuple[Any, ...]] = None
        self._overflow_retried: set[int] = set()

        self._resources = LoopResources(self, self._session.id)

    @classmethod
    def from_history(
        cls,
        client: Any,
        tools: Union[ToolRegistry, Iterable[Tool]] = (),
        config: SessionConfig = SessionConfig(),
        history: Iterable[Message] = (),
    ) -> BareLoop:
        """A loop that resumes a conversation from stored messages."""
        return cls(client, tools, config, history=history)

    # -- running ---------------------------------------------------------------

    def run(self, input: str, config: Optional[RunConfig] = None, run_id: Optional[str] = None) -> Run:
        """Run the agent on ``input`` and block until it ends.

        Returns:
            The finished ``Run`` record.

        Raises:
            LoopBusy: a run is already in flight on this loop.
            LoopError: the run failed or was cancelled (``.run`` holds the record).
        """
        rc = self._launch(input, config, run_id, waiter=True)
        try:
            rc.wake.wait()
            if not rc.done.is_set():
                self._takeover(rc)  # only a cancel wakes us before the body is done
            rc.done.wait()
        except KeyboardInterrupt:
            self._cancel_run(rc, "interrupted")
            self._takeover(rc)
            rc.done.wait()
            raise
        if rc.error is not None:
            raise rc.error
        return rc.run

    def start(
        self,
        input: str,
        config: Optional[RunConfig] = None,
        run_id: Optional[str] = None,
        *,
        tap: Optional[Callable[[Any], None]] = None,
        checkpoint: Optional[Callable[[Checkpoint], None]] = None,
        resume: Optional[ResumePoint] = None,
    ) -> RunHandle:
        """Start the run on a named worker thread and return its handle.

        Args:
            tap: receives every event of this run (used by ``RunRegistry``).
            checkpoint: receives the run's resumable state at each turn
                boundary, on the run's thread (used by durable registries).
            resume: continue a run from a checkpoint instead of starting it
                (``on_run_resumed`` in place of ``on_run_start``).

        Raises:
            LoopBusy: a run is already in flight on this loop.
        """
        rc = self._launch(input, config, run_id, waiter=False, tap=tap, checkpoint=checkpoint, resume=resume)
        return RunHandle(rc, lambda reason: self._cancel_run(rc, reason))

    def _launch(
        self,
        input: str,
        config: Optional[RunConfig],
        run_id: Optional[str],
        waiter: bool,
        tap: Optional[Callable[[Any], None]] = None,
        checkpoint: Optional[Callable[[Checkpoint], None]] = None,
        resume: Optional[ResumePoint] = None,
    ) -> RunContext:
        if not isinstance(input, str):
            raise TypeError(f"run input must be a str, got {type(input).__name__}")
        if config is None:
            config = RunConfig()
        elif not isinstance(config, RunConfig):
            raise ConfigError(f"config must be a RunConfig, got {type(config).__name__}")
        rid = run_id if run_id is not None else uuid.uuid4().hex
        run = Run(id=rid, input=input, config=config)
        with self._busy:
            if self._closed:
                raise LoopError("this loop is closed")
            if self._active is not None:
                raise LoopBusy(f"a run ({self._active.run.id}) is already in flight on this loop")
            rc = RunContext(run, self._cancel.view(), waiter, tap)
            rc.checkpoint = checkpoint
            rc.resume = resume
            self._active = rc
            self._started = True
            self._last_config = config
        rc.lock.acquire()  # the body's fence: released only while it blocks

        def on_cancel() -> None:
            rc.wake.set()
            if not rc.waiter and not rc.finished:
                # Finalize in a copy of the run's context, so observers of the
                # cancelled run see the caller's contextvars.
                ctx = rc.context.copy() if rc.context is not None else contextvars.copy_context()
                threading.Thread(
                    target=ctx.run,
                    args=(self._takeover, rc),
                    name=f"loopctl-run-{rid[:12]}-cancel",
                    daemon=True,
                ).start()

        rc.listener = on_cancel
        ctx = contextvars.copy_context()
        rc.context = ctx
        thread = threading.Thread(
            target=ctx.run, args=(self._body, rc), name=f"loopctl-run-{rid[:12]}", daemon=True
        )
        rc.thread = thread
        # Listen before the body can run: a run that ends at once must find its
        # listener there to remove. A cancel that already fired calls it now;
        # the takeover then waits on the fence until the body has handled it.
        self._cancel.add_listener(on_cancel)
        try:
            thread.start()
        except RuntimeError:  # "can't start new thread": nothing is running
            self._cancel.remove_listener(on_cancel)
            rc.lock.release()
            with self._busy:
                self._active = None
            raise
        except BaseException:  # e.g. Ctrl-C inside start()'s wait: the body IS running
            self._cancel_run(rc, "interrupted")
            raise
        return rc

    def _body(self, rc: RunContext) -> None:
        held = True
        try:
            error: Optional[LoopError] = None
            try:
                self._steps(rc)
            except Abandoned:
                held = False
                return
            except LoopError as exc:
                error = exc
            except BaseException as exc:  # a bug, or a user callback's escape
                error = LoopError(f"internal error: {type(exc).__name__}: {exc}")
                error.__cause__ = exc
                log.exception("run %s failed inside the driver", rc.run.id)
            try:
                if error is not None:
                    self._set_error_state(error)
            finally:
                self._finalize(rc, error)
        finally:
            if held and not rc.finished:
                # Something escaped finalize itself: still close the slot and
                # free the loop, so a stray handle cannot push into a dead run.
                self._steering._close_and_seal()
                with self._busy:
                    self._active = None
                    rc.finished = True
            if held:
                rc.lock.release()
            rc.done.set()
            rc.wake.set()

    def _takeover(self, rc: RunContext) -> None:
        """On cancel: wait for the body to block (or end), then finish the run here."""
        rc.lock.acquire()
        try:
            if rc.finished:
                return
            rc.abandoned = True
            err = Cancelled(self._cancel.reason)
            self._set_error_state(err)
            self._finalize(rc, err)
        finally:
            rc.lock.release()
        rc.done.set()
        rc.wake.set()

    def _steps(self, rc: RunContext) -> None:
        run = rc.run
        m = self._machine
        self._session.runs.append(run)
        em = self._emitter
        em.run_id = run.id
        em.tap = rc.tap
        self._begin_run(run)
        rc.base_epoch = m.history_epoch
        point = rc.resume
        if point is None:
            em.run_start(run.input)
            m.accept_input(run.input)
        else:
            turn = point.checkpoint.turns_taken if point.checkpoint is not None else 0
            em.run_resumed(run.input, point.attempt, point.cause, turn)
            restore(self, rc, point)
        self._steering._open_slot()
        policy = self._policy()
        cancel = rc.cancel
        while True:
            if cancel.is_cancelled():
                m.cancel()
            step = m.next_step(policy)
            t = type(step)
            if t is CallLLM:
                handle_call_llm(self, rc, step.turn, policy)  # type: ignore[union-attr]
            elif t is CallTools:
                handle_call_tools(self, rc, step)  # type: ignore[arg-type]
            elif t is Compact:
                run_compaction(self, rc, step.reason)  # type: ignore[union-attr]
            else:
                outcome = step.outcome  # type: ignore[union-attr]
                with self._busy:
                    rc.ending = True  # from here a cancel no longer reaches this run
                if type(outcome) is Completed:
                    run.output = outcome.final_text
                    return
                raise self._error_for(outcome)

    def _begin_run(self, run: Run) -> None:
        reset_loops = getattr(self._loop_detector, "reset", None)
        if reset_loops is not None:
            reset_loops()  # tool-loop detection is per run; convergence persists
        if run.config.reset_managers:
            for part in (self._health, self._loop_detector, self._convergence, self._fallback):
                reset = getattr(part, "reset", None)
                if reset is not None:
                    reset()
        self._run_input = run.input
        self._run_config_now = run.config
        self._deferred_transient_tokens = 0
        self._overflow_retried = set()
        self._open_phase = None
        opts = self._request_options
        self._base_options = None if opts.is_empty() else opts
        self._tool_names = self._tools.name_set()
        sysp = self._session_config.system_prompt
        self._overhead = (self._counter.count_message(Message.system(sysp)) if sysp else 0) + sum(
            self._counter.count_text(repr(s.to_dict())) for s in self._tools.schemas()
        )
        self._machine.set_context_tokens(self._measure_figure())

    def _policy(self) -> MachinePolicy:
        sc = self._session_config
        return MachinePolicy(
            self._run_config_now.max_turns, sc.context_window, sc.compact_threshold, sc.auto_compact
        )

    def _error_for(self, outcome: Outcome) -> LoopError:
        if type(outcome) is MaxTurnsReached:
            return MaxTurnsExceeded(self._run_config_now.max_turns)
        if type(outcome) is CancelledOutcome:
            return Cancelled(self._cancel.reason)
        if type(outcome) is Failed:
            return outcome.error
        return LoopError(f"unmapped terminal outcome: {outcome!r}")

    def _set_error_state(self, error: LoopError) -> None:
        m = self._machine
        if isinstance(error, Cancelled):
            m.cancel()
            m.next_step(self._policy())
        else:
            m.fail(error)

    # -- finalize: the single exit door -----------------------------------------

    def finalize(self, error: Optional[LoopError] = None) -> Run:
        """The ``Loop`` protocol's exit door; ``run()`` calls it for every run.

        Called by hand it only reports: it returns the last finished ``Run``.

        Raises:
            LoopBusy: a run is in flight (its own thread finalizes it).
            LoopError: no run has happened yet.
        """
        if self._active is not None:
            raise LoopBusy("finalize() is called by the run itself")
        last = self._session.current_run
        if last is None:
            raise LoopError("no run to finalize")
        return last

    def _finalize(self, rc: RunContext, error: Optional[LoopError]) -> None:
        finalize_run(self, rc, error)

    # -- measuring ----------------------------------------------------------------

    def _measure_raw(self) -> int:
        m = self._machine
        return (
            self._meter.measure(m.history, m.pending, m.history_epoch, m.pending_epoch)
            + self._overhead
        )

    def _measure_figure(self) -> int:
        return self._calibration.scale(self._measure_raw())

    def _figure_for(self, messages: Iterable[Message]) -> int:
        return self._calibration.scale(count_messages(self._counter, messages) + self._overhead)

    def _overhead_tokens(self) -> int:
        return self._overhead

    def _window(self) -> Optional[int]:
        w = self._session_config.context_window
        return w if w > 0 else None

    def _model_name(self) -> str:
        return str(getattr(self._client, "model", "") or "")

    def _effective_options(self) -> Optional[RequestOptions]:
        routed = self._routed_model
        if routed is not None and routed != self._model_name():
            # Routing beats a host override; the shared client is never mutated.
            return self._request_options.with_model(routed)
        return self._base_options

    def _summarize(self, request: Any) -> Any:
        rc = self._active
        cancel = rc.cancel if rc is not None else self._cancel.view()
        return cancellable_complete(self._client, request, cancel)

    def _cancel_run(self, rc: RunContext, reason: Optional[str]) -> bool:
        """Cancel ``rc``'s run only; False once that run has reached its end."""
        with self._busy:
            if self._active is rc and not rc.ending:
                self._cancel.cancel(reason)
                return True
            return False

    def stop_reason(self) -> Optional[LoopError]:
        """Why the last run ended: ``Cancelled`` while the signal is fired, else its error."""
        if self._cancel.is_cancelled():
            return Cancelled(self._cancel.reason)
        last = self._session.current_run
        if last is not None and last.end is not None:
            return last.stop_reason
        outcome = self._machine.outcome
        if outcome is None or type(outcome) is Completed:
            return None
        return self._error_for(outcome)

    # -- lifecycle -------------------------------------------------------------------

    def _ensure_temp_dir(self) -> Optional[Path]:
        return self._resources.ensure_temp_dir()

    @property
    def temp_dir(self) -> Optional[Path]:
        """The managed temp dir's path (None when disabled); made on first tool use."""
        return self._resources.temp_path

    def _executor(self) -> ThreadPoolExecutor:
        return self._resources.executor(self._run_config_now.parallel.max_concurrency)

    def close(self) -> None:
        """Cancel a run in flight, shut the tool executor, remove the temp dir.

        Idempotent; returns promptly even if a tool is stuck.
        """
        with self._busy:
            self._closed = True
            active = self._active
        if active is not None:
            self._cancel_run(active, "loop closed")
            if threading.current_thread() is not active.thread:
                active.done.wait(5.0)
        self._resources.close()

    def __enter__(self) -> BareLoop:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<BareLoop session={self._session.id[:8]} model={self._model_name()!r}>"


def _default_loop_detector() -> Any:
    try:
        from loopctl.detection import LoopDetector
    except ImportError:  # pragma: no cover - the detection module lands separately
        return None
    return LoopDetector()


def _default_convergence_detector() -> Any:
    try:
        from loopctl.detection import ConvergenceDetector
    except ImportError:  # pragma: no cover - the detection module lands separately
        return None
    return ConvergenceDetector()


def _default_context_manager(config: SessionConfig, counter: TokenCounter) -> Any:
    try:
        from loopctl.context.manager import ContextManager, TruncatingCompactor
    except ImportError:  # pragma: no cover - the context package lands separately
        return None
    return ContextManager(
        TruncatingCompactor(),
        context_window=config.context_window,
        compact_threshold=config.compact_threshold,
        counter=counter,
    )


__all__ = ["BareLoop"]
