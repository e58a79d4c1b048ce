"""The ONLY caller of observers and run hooks.

``Emitter`` (one per loop) holds the observers and delivers to them one
event at a time, in order, across runs: whichever thread finds delivery
idle delivers, first its own event, then whatever other threads queued
meanwhile (each queued event runs in a copy of the context it was emitted
in, so an observer reads the caller's contextvars). A run's body delivers
UNFENCED, so an observer that blocks never delays a cancel: the takeover
queues its events (the failed ``on_turn_end``, ``on_run_end``) behind the
blocked one, or hands them to a short-lived ``loopctl-events-...`` thread.
A blocked observer delays delivery, never the cancel; ``on_run_end`` stays
the last event of its run and comes before any event of a later run.

``RunEvents`` (one per run) binds the emitter to the run: its id, its tap
(called inline, before the queue: the registry's tap never blocks) and its
fence. ``emit`` is the one door every event passes: what the tap and the
observers get is ``event.redacted()`` (credentials and key shapes masked,
quotes of untrusted text cut to an excerpt), deltas and approvals included.
Deltas pass a ``StreamMask`` per stream first, so a key split across pieces
is masked whole; ``flush_deltas`` (at a stream's end, an attempt's reset and
a phase's close) lets go of what a mask still holds. ``phase()`` opens an
LLM or tool phase (``phases.py``) whose ``on_turn_end`` is always sent
exactly once: ok on a clean exit, failed on an error, failed by
``finalize`` when a cancel cut it short. An event object is built only when
someone listens. Run-start goes to observers then hooks; run-end to hooks
then observers.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional

from loopctl.driver.phases import NullScope, Phase, PhaseScope
from loopctl.hooks import HookExecutor, RunHookContext
from loopctl.messages import Message, StopReason, Usage
from loopctl.observers import (
    EVENT_METHODS,
    AttemptReset,
    Compaction,
    ConvergenceDetected,
    Event,
    Fallback,
    LoopDetectedEvent,
    ModelSwitched,
    Observer,
    OutputValidationFailed,
    Response,
    RetryScheduled,
    RunEnd,
    RunResumed,
    RunStart,
    SteeringDelivered,
    StreamFailure,
    StreamSuccess,
    TextDelta,
    ThinkingDelta,
    ToolCallReceived,
    ToolInputDelta,
    ToolPost,
    ToolPre,
    TurnEnd,
    TurnStart,
)
from loopctl.text import StreamMask

if TYPE_CHECKING:
    from loopctl.driver.handle import RunContext

log = logging.getLogger("loopctl")

Listener = Callable[[Any], None]
_Item = tuple[Callable[[Any], None], Any, Optional[contextvars.Context]]


def _label(observer: Observer, fn: Listener) -> str:
    """The observer's class name, plus the callable's name when it is not a method of it."""
    name = type(observer).__name__
    if getattr(fn, "__self__", None) is observer:
        return name
    return f"{name}({getattr(fn, '__qualname__', None) or type(fn).__name__})"


class Emitter:
    """The loop's observers and run hooks, and the one-at-a-time delivery to them."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.observers: list[Observer] = []
        self.hooks: Optional[HookExecutor] = None
        self._table: dict[type[Event], tuple[Listener, ...]] = {cls: () for cls in EVENT_METHODS}
        self._labels: dict[int, str] = {}  # id(listener) -> the name logged when it raises
        self._queue: deque[_Item] = deque()
        self._qlock = threading.Lock()
        self._delivering = False

    def add_observer(self, observer: Observer) -> None:
        """Register ``observer`` (duplicates are called twice)."""
        self.observers.append(observer)
        for cls, name in EVENT_METHODS.items():
            fn = getattr(observer, name, None)
            if fn is None:
                continue
            base = getattr(Observer, name)
            if getattr(fn, "__func__", None) is base:
                continue  # the no-op default: skip it entirely
            self._table[cls] = self._table[cls] + (fn,)
            self._labels[id(fn)] = _label(observer, fn)

    def observes(self, cls: type[Event]) -> bool:
        """True when an observer listens to events of ``cls``."""
        return bool(self._table[cls])

    @property
    def is_delivering(self) -> bool:
        """True while some thread is delivering (an observer may be blocked)."""
        return self._delivering

    def fan_out(self, event: Event) -> None:
        """Deliver ``event`` to observers in order; contain their failures."""
        for fn in self._table[type(event)]:
            try:
                fn(event)
            except Exception:
                log.exception(
                    "observer %s raised in %s; skipped",
                    self._labels.get(id(fn), repr(fn)),
                    EVENT_METHODS[type(event)],
                )

    def deliver(self, fn: Callable[[Any], None], arg: Any, fence: Any, handoff: bool = False) -> None:
        """Call ``fn(arg)`` after everything queued before it, one call at a time.

        Args:
            fence: the caller's ``RunContext`` (released while delivering, so a
                blocked observer never holds the run), or None.
            handoff: never deliver on this thread; a ``loopctl-events-...``
                thread does it if delivery is idle (the takeover's events).
        """
        with self._qlock:
            if self._delivering or handoff:
                self._queue.append((fn, arg, contextvars.copy_context()))
                if self._delivering:
                    return
            self._delivering = True
        if handoff:
            threading.Thread(
                target=self._drain, name=f"loopctl-events-{self.session_id[:8]}", daemon=True
            ).start()
        elif fence is not None:
            with fence.unfenced():
                self._deliver_then_drain(fn, arg)
        else:
            self._deliver_then_drain(fn, arg)

    def _deliver_then_drain(self, fn: Callable[[Any], None], arg: Any) -> None:
        try:
            fn(arg)
        finally:
            self._drain()

    def _drain(self) -> None:
        try:
            while True:
                with self._qlock:
                    if not self._queue:
                        self._delivering = False
                        return
                    fn, arg, ctx = self._queue.popleft()
                if ctx is not None:
                    ctx.run(fn, arg)
                else:
                    fn(arg)
        except BaseException:
            with self._qlock:
                self._delivering = False
            raise


class RunEvents:
    """One run's binding of the emitter: run id, tap, fence, the open phase."""

    def __init__(
        self,
        emitter: Emitter,
        run_id: str,
        tap: Optional[Callable[[Event], None]],
        fence: Optional[RunContext],
        window: Optional[int],
    ) -> None:
        self.emitter = emitter
        self.session_id = emitter.session_id
        self.run_id = run_id
        self.tap = tap
        self.fence = fence
        self.handoff = False
        self.window = window
        self.open_phase: Optional[Phase] = None
        self._masks: dict[tuple[type[Event], int, str, str], StreamMask] = {}  # one per delta stream
        self.text_sink: Optional[Callable[[str], None]] = None  # the text streamer, during a stream
        self._table = emitter._table
        # Observers are fixed while a run is in flight, and so is the tap:
        # the event types anyone listens to, decided once per run.
        table = self._table
        self._wanted = frozenset(cls for cls in table if table[cls] or tap is not None)
        self._null_scope: Optional[NullScope] = None if self.wants(TurnEnd) else NullScope()

    def wants(self, cls: type[Event]) -> bool:
        """True when an event of ``cls`` would reach anyone."""
        return cls in self._wanted

    def emit(self, event: Event) -> None:
        """Redact, then tap first (inline), then observers (queued, one at a time)."""
        event = event.redacted()
        tap = self.tap
        if tap is not None:
            try:
                tap(event)
            except Exception:
                log.exception("event tap raised on %s", type(event).__name__)
        if self._table[type(event)]:
            self.emitter.deliver(self.emitter.fan_out, event, self.fence, self.handoff)

    def take_over(self) -> None:
        """From now on this run's events are handed off (the takeover finalizes it)."""
        self.fence = None
        self.handoff = True
        self.text_sink = None  # the streamer unfences the run's body: never from the takeover

    # -- phases ------------------------------------------------------------------

    def phase(self, turn: int, name: str, context_tokens: int) -> Any:
        """Open a phase; the scope sends its ``on_turn_end`` on every exit."""
        null = self._null_scope
        if null is not None:
            return null
        return PhaseScope(self, Phase(turn, name, context_tokens))

    def close_phase(self, phase: Phase, error: Optional[str], error_type: Optional[str] = None) -> None:
        """Send the phase's ``on_turn_end`` (failed when ``error`` is given), once.

        ``error_type`` is the failure's exception class name, when there is one.
        """
        if phase.closed:
            return
        phase.closed = True
        self.flush_deltas()
        if self.open_phase is phase:
            self.open_phase = None
        self.turn_end(
            phase.turn,
            phase.name,
            error is None,
            error,
            (time.perf_counter() - phase.t0) * 1000.0,
            phase.input_tokens,
            phase.output_tokens,
            phase.stop_reason,
            phase.context_tokens,
            self.window,
            error_type,
        )

    # -- one method per event (build only when someone listens) ---------------

    def run_start(self, input: str) -> None:
        if RunStart in self._wanted:
            self.emit(RunStart(self.session_id, self.run_id, input))
        hooks = self.emitter.hooks
        if hooks is not None and hooks.hooks:
            ctx = RunHookContext(self.session_id, self.run_id, input)
            self.emitter.deliver(hooks.run_start, ctx, self.fence, self.handoff)

    def run_resumed(self, input: str, attempt: int, cause: str, turn: int) -> None:
        if RunResumed in self._wanted:
            self.emit(RunResumed(self.session_id, self.run_id, attempt, cause, turn))
        hooks = self.emitter.hooks
        if hooks is not None and hooks.hooks:  # this process never ran the run's start hooks
            ctx = RunHookContext(self.session_id, self.run_id, input)
            self.emitter.deliver(hooks.run_start, ctx, self.fence, self.handoff)

    def run_end(
        self,
        input: str,
        success: bool,
        error: Optional[str],
        total_turns: int,
        duration_ms: float,
        error_type: Optional[str] = None,
    ) -> None:
        hooks = self.emitter.hooks
        if hooks is not None and hooks.hooks:
            ctx = RunHookContext(self.session_id, self.run_id, input)
            self.emitter.deliver(lambda c: hooks.run_end(c, success, error), ctx, self.fence, self.handoff)
        if RunEnd in self._wanted:
            self.emit(RunEnd(self.session_id, self.run_id, success, error, total_turns, duration_ms, error_type))

    def turn_start(self, turn: int, query: str, provider: Optional[str] = None) -> None:
        if TurnStart in self._wanted:
            self.emit(TurnStart(self.session_id, self.run_id, turn, query, provider))

    def _delta(self, cls: type[Event], turn: int, delta: str, call_id: str = "", tool: str = "") -> None:
        key = (cls, turn, call_id, tool)
        mask = self._masks.get(key)
        if mask is None:
            # Another kind of stream begins (text, then a tool's arguments): the
            # other kinds let go first, so observers see the pieces in their
            # order; two calls' arguments may interleave, each keeps its mask.
            self.flush_deltas(keep=cls)
            mask = self._masks[key] = StreamMask()
        shown = mask.feed(delta)
        if shown:
            self._emit_delta(key, shown)

    def _emit_delta(self, key: tuple[type[Event], int, str, str], text: str) -> None:
        cls, turn, call_id, tool = key
        if cls is TextDelta and not call_id and self.text_sink is not None:
            self.text_sink(text)  # before the observers: the console leads
            if TextDelta not in self._wanted:
                return
        if cls is ToolInputDelta:
            self.emit(ToolInputDelta(self.session_id, self.run_id, turn, call_id, tool, text))
        else:
            make: Any = cls  # TextDelta or ThinkingDelta: (session, run, turn, delta)
            self.emit(make(self.session_id, self.run_id, turn, text))

    def flush_deltas(self, keep: Optional[type[Event]] = None) -> None:
        """Send what the delta streams' masks still hold (a stream ended or was reset).

        ``keep``: the streams of this event class keep what they hold.
        """
        masks = self._masks
        self._masks = {k: m for k, m in masks.items() if k[0] is keep}
        for key, mask in masks.items():
            if key[0] is keep:
                continue
            rest = mask.flush()
            if rest:
                self._emit_delta(key, rest)

    def text_delta(self, turn: int, delta: str, answer: bool = False) -> None:
        """A piece of reply text (``answer``: of the typed answer's tool input; never to the streamer)."""
        if TextDelta in self._wanted or (self.text_sink is not None and not answer):
            self._delta(TextDelta, turn, delta, "answer" if answer else "")

    def thinking_delta(self, turn: int, delta: str) -> None:
        if ThinkingDelta in self._wanted:
            self._delta(ThinkingDelta, turn, delta)

    def tool_input_delta(self, turn: int, call_id: str, tool: str, delta: str) -> None:
        if ToolInputDelta in self._wanted:
            self._delta(ToolInputDelta, turn, delta, call_id, tool)

    def attempt_reset(self, turn: int, attempt: int) -> None:
        self.flush_deltas()
        if AttemptReset in self._wanted:
            self.emit(AttemptReset(self.session_id, self.run_id, turn, attempt))

    def retry_scheduled(
        self, turn: int, model: str, cause: str, wait_s: float, attempt: int, max_attempts: int,
        provider: Optional[str] = None,
    ) -> None:
        if RetryScheduled in self._wanted:
            self.emit(
                RetryScheduled(
                    self.session_id, self.run_id, turn, model, cause, wait_s, attempt, max_attempts, provider
                )
            )

    def response(self, turn: int, text: str, usage: Optional[Usage]) -> None:
        if Response in self._wanted:
            self.emit(Response(self.session_id, self.run_id, turn, text, usage))

    def stream_success(self, turn: int, model: str, usage: Optional[Usage], provider: Optional[str] = None) -> None:
        if StreamSuccess in self._wanted:
            self.emit(StreamSuccess(self.session_id, self.run_id, turn, model, usage, provider))

    def stream_failure(self, turn: int, model: str, error: str, provider: Optional[str] = None) -> None:
        if StreamFailure in self._wanted:
            self.emit(StreamFailure(self.session_id, self.run_id, turn, model, error, provider))

    def turn_end(
        self,
        turn: int,
        phase: str,
        success: bool,
        error: Optional[str],
        duration_ms: float,
        input_tokens: int,
        output_tokens: int,
        stop_reason: Optional[StopReason],
        context_tokens: int,
        context_window: Optional[int],
        error_type: Optional[str] = None,
    ) -> None:
        if TurnEnd in self._wanted:
            self.emit(
                TurnEnd(
                    self.session_id,
                    self.run_id,
                    turn,
                    phase,
                    success,
                    error,
                    duration_ms,
                    input_tokens,
                    output_tokens,
                    stop_reason,
                    context_tokens,
                    context_window,
                    error_type,
                )
            )

    def tool_call_received(
        self, turn: int, call_id: str, tool: str, input: Mapping[str, Any]
    ) -> None:
        if ToolCallReceived in self._wanted:
            self.emit(ToolCallReceived(self.session_id, self.run_id, turn, call_id, tool, input))

    def tool_pre(self, turn: int, call_id: str, tool: str, attempt: int) -> None:
        if ToolPre in self._wanted:
            self.emit(ToolPre(self.session_id, self.run_id, turn, call_id, tool, attempt))

    def tool_post(
        self,
        turn: int,
        call_id: str,
        tool: str,
        attempt: int,
        is_error: bool,
        duration_ms: float,
        output: str,
        result_hash: str,
    ) -> None:
        if ToolPost in self._wanted:
            self.emit(
                ToolPost(
                    self.session_id,
                    self.run_id,
                    turn,
                    call_id,
                    tool,
                    attempt,
                    is_error,
                    duration_ms,
                    output,
                    result_hash,
                )
            )

    def compaction(self, reason: str, tokens_before: int, tokens_after: int) -> None:
        if Compaction in self._wanted:
            self.emit(Compaction(self.session_id, self.run_id, reason, tokens_before, tokens_after))

    def fallback(self, from_model: str, to_model: str) -> None:
        if Fallback in self._wanted:
            self.emit(Fallback(self.session_id, self.run_id, from_model, to_model))

    def model_switched(self, from_model: str, to_model: str) -> None:
        if ModelSwitched in self._wanted:
            self.emit(ModelSwitched(self.session_id, self.run_id, from_model, to_model))

    def loop_detected(self, pattern: str, repetitions: int) -> None:
        if LoopDetectedEvent in self._wanted:
            self.emit(LoopDetectedEvent(self.session_id, self.run_id, pattern, repetitions))

    def convergence_detected(self, action: str, similarity: float, count: int) -> None:
        if ConvergenceDetected in self._wanted:
            self.emit(ConvergenceDetected(self.session_id, self.run_id, action, similarity, count))

    def output_validation_failed(
        self, turn: int, errors: Sequence[str], attempt: int, max_attempts: int
    ) -> None:
        if OutputValidationFailed in self._wanted:
            self.emit(OutputValidationFailed(self.session_id, self.run_id, turn, tuple(errors), attempt, max_attempts))

    def steering(self, turn: int, messages: Sequence[Message]) -> None:
        if SteeringDelivered in self._wanted:
            self.emit(SteeringDelivered(self.session_id, self.run_id, turn, tuple(messages)))


__all__ = ["Emitter", "Phase", "RunEvents"]
