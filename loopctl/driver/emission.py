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
LLM or tool phase (``phases.py``), then sends its opening events
(``on_turn_start``, the ``on_tool_call_received``), and its ``on_turn_end``
is always sent exactly once: ok on a clean exit, failed on an error,
failed by ``finalize`` when a cancel cut it short (even while an observer
held an opening event). Run-start goes to observers then
hooks; run-end to hooks then observers.

Call sites build the event object and ``emit`` it; ``wants(cls)`` is the
one question to ask first when building it costs something (a hash, a
tuple of every call). Which ``on_*`` methods an observer handles comes from
the event table (``loopctl.events.EVENTS``), looked up once per observer class.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Optional, TypeVar

from loopctl.driver.handle import Abandoned
from loopctl.driver.phases import NullScope, Phase, end_phase, open_scope
from loopctl.events import (
    EVENT_METHODS,
    AttemptReset,
    Event,
    Observer,
    RunEnd,
    RunResumed,
    RunStart,
    TextDelta,
    ThinkingDelta,
    ToolInputDelta,
    TurnEnd,
)
from loopctl.events.hooks import HookExecutor, RunHookContext
from loopctl.messages import StopReason
from loopctl.text import StreamMask

if TYPE_CHECKING:
    from loopctl.driver.handle import RunContext

log = logging.getLogger("loopctl")
_T = TypeVar("_T")

Listener = Callable[[Any], None]
_Item = tuple[Callable[[Any], None], Any, Optional[contextvars.Context]]


#: Observer class -> the ``on_*`` methods it overrides (the no-op defaults are
#: never called). Computed once per class: registering another instance of it
#: reads the answer back. Weak keys: a class made at run time is not kept alive.
_OVERRIDES: weakref.WeakKeyDictionary[type, tuple[tuple[type[Event], str], ...]] = weakref.WeakKeyDictionary()
_METHOD_NAMES = frozenset(EVENT_METHODS.values())
#: Shared sets of event classes: a run whose loop has no observer, or whose
#: host taps every event, holds one of these instead of a set of its own.
_NO_EVENTS: frozenset[type[Event]] = frozenset()
_EVERY_EVENT: frozenset[type[Event]] = frozenset(EVENT_METHODS)


def overridden(klass: type) -> tuple[tuple[type[Event], str], ...]:
    """The (event class, method name) pairs ``klass`` handles itself, from the event table."""
    found = _OVERRIDES.get(klass)
    if found is None:
        found = tuple(
            (cls, name)
            for cls, name in EVENT_METHODS.items()
            if getattr(klass, name, None) not in (None, getattr(Observer, name))
        )
        _OVERRIDES[klass] = found
    return found


def handled(observer: object) -> tuple[tuple[type[Event], str], ...]:
    """The events ``observer`` handles: its class's overrides, then its own attributes.

    An ``on_*`` callable set on the instance counts (``CallbackObserver``);
    one set to None or to the bound no-op default turns the event off.
    """
    pairs = overridden(type(observer))
    own = getattr(observer, "__dict__", None)
    if not own or own.keys().isdisjoint(_METHOD_NAMES):
        return pairs
    out = []
    for cls, name in EVENT_METHODS.items():
        if name not in own:
            if (cls, name) in pairs:
                out.append((cls, name))
            continue
        value = own[name]
        if value is not None and getattr(value, "__func__", None) is not getattr(Observer, name):
            out.append((cls, name))
    return tuple(out)


def _label(observer: Observer, fn: Listener) -> str:
    """The observer's class name, plus the callable's name when it is not a method of it."""
    name = type(observer).__name__
    if getattr(fn, "__self__", None) is observer:
        return name
    return f"{name}({getattr(fn, '__qualname__', None) or type(fn).__name__})"


class Emitter:
    """The loop's observers and run hooks, and the one-at-a-time delivery to them."""

    __slots__ = (
        "_delivering",
        "_labels",
        "_listened",
        "_qlock",
        "_queue",
        "_table",
        "hooks",
        "observers",
        "session_id",
    )

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.observers: list[Observer] = []
        self.hooks: Optional[HookExecutor] = None
        self._table: dict[type[Event], tuple[Listener, ...]] = {cls: () for cls in EVENT_METHODS}
        self._labels: dict[int, str] = {}  # id(listener) -> the name logged when it raises
        self._queue: deque[_Item] = deque()
        self._qlock = threading.Lock()
        self._delivering = False
        self._listened: frozenset[type[Event]] = _NO_EVENTS  # kept by add_observer

    def add_observer(self, observer: Observer) -> None:
        """Register ``observer`` (duplicates are called twice)."""
        self.observers.append(observer)
        for cls, name in handled(observer):
            fn = getattr(observer, name)
            self._table[cls] = self._table[cls] + (fn,)
            self._labels[id(fn)] = _label(observer, fn)
        self._listened = frozenset(cls for cls, fns in self._table.items() if fns) or _NO_EVENTS

    def observes(self, cls: type[Event]) -> bool:
        """True when an observer listens to events of ``cls``."""
        return bool(self._table[cls])

    def listened(self) -> frozenset[type[Event]]:
        """The event classes some observer listens to (fixed while a run is in flight)."""
        return self._listened

    @property
    def is_delivering(self) -> bool:
        """True while some thread is delivering (an observer may be blocked)."""
        return self._delivering

    def fan_out(self, event: Event) -> None:
        """Deliver ``event`` to observers in order; contain their failures (``SystemExit`` too)."""
        for fn in self._table[type(event)]:
            try:
                fn(event)
            except Abandoned:  # the run's own unwinding, not the observer's failure
                raise
            except BaseException:
                log.exception(
                    "observer %s raised in %s; skipped",
                    self._labels.get(id(fn), repr(fn)),
                    EVENT_METHODS[type(event)],
                )

    def deliver(
        self, fn: Callable[[_T], None], arg: _T, fence: Optional[RunContext], handoff: bool = False
    ) -> None:
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

    def _deliver_then_drain(self, fn: Callable[[_T], None], arg: _T) -> None:
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

    __slots__ = (
        "_masks",
        "_null_scope",
        "_observed",
        "_wanted",
        "emitter",
        "fence",
        "handoff",
        "open_phase",
        "run_id",
        "sealed",
        "session_id",
        "tap",
        "text_sink",
        "window",
    )

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
        self.sealed = False  # set in delivery order just before on_run_end (``run_end``)
        self.window = window
        self.open_phase: Optional[Phase] = None
        self._masks: dict[tuple[type[Event], int, str, str], StreamMask] = {}  # one per delta stream
        self.text_sink: Optional[Callable[[str], None]] = None  # the text streamer, during a stream
        # Observers are fixed while a run is in flight, and so is the tap:
        # the event types anyone listens to, decided once per run.
        self._observed = emitter.listened()
        self._wanted = _EVERY_EVENT if tap is not None else self._observed
        self._null_scope: Optional[NullScope] = None if self.wants(TurnEnd) else NullScope()

    def wants(self, cls: type[Event]) -> bool:
        """True when an event of ``cls`` would reach anyone."""
        return cls in self._wanted

    def emit(self, event: Event) -> None:
        """Redact, then tap first (inline), then observers (queued, one at a time).

        The one door every event of the run passes; one nobody listens to is
        dropped before any work. Build an event that costs something only
        after ``wants`` says yes.
        """
        if type(event) not in self._wanted:
            return
        event = event.redacted()
        tap = self.tap
        if tap is not None:
            try:
                tap(event)
            except Exception:
                log.exception("event tap raised on %s", type(event).__name__)
        if type(event) in self._observed:
            self.emitter.deliver(self.emitter.fan_out, event, self.fence, self.handoff)

    def take_over(self) -> None:
        """From now on this run's events are handed off (the takeover finalizes it)."""
        self.fence = None
        self.handoff = True
        self.text_sink = None  # the streamer unfences the run's body: never from the takeover

    # -- phases ------------------------------------------------------------------

    def phase(
        self,
        turn: int,
        name: str,
        context_tokens: int,
        opening: Sequence[Event] = (),
        reply: Optional[tuple[int, int, Optional[StopReason]]] = None,
    ) -> Any:
        """Open a phase, then send its ``opening`` events; the scope sends its ``on_turn_end`` on every exit.

        See ``phases.open_scope`` (``reply``: the token counts and stop
        reason the phase reports from the start).
        """
        null = self._null_scope
        if null is None:
            return open_scope(self, Phase(turn, name, context_tokens), opening, reply)
        for event in opening:
            self.emit(event)
        return null

    def close_phase(self, phase: Phase, error: Optional[str], error_type: Optional[str] = None) -> None:
        """Send the phase's ``on_turn_end`` (failed when ``error`` is given), once.

        ``error_type`` is the failure's exception class name, when there is one.
        """
        end_phase(self, phase, error, error_type)

    # -- the run's bracket (hooks too) and the delta streams (masked per stream) --

    def run_start(self, input: str) -> None:
        """The run's first event: ``RunStart`` to observers, then the run-start hooks."""
        self.emit(RunStart(self.session_id, self.run_id, input))
        hooks = self.emitter.hooks
        if hooks is not None and hooks.hooks:
            ctx = RunHookContext(self.session_id, self.run_id, input)
            self.emitter.deliver(hooks.run_start, ctx, self.fence, self.handoff)

    def run_resumed(self, input: str, attempt: int, cause: str, turn: int) -> None:
        """In place of ``run_start`` for a resumed run: ``RunResumed``, then the run-start hooks."""
        self.emit(RunResumed(self.session_id, self.run_id, attempt, cause, turn))
        hooks = self.emitter.hooks
        if hooks is not None and hooks.hooks:  # this process never ran the run's start hooks
            ctx = RunHookContext(self.session_id, self.run_id, input)
            self.emitter.deliver(hooks.run_start, ctx, self.fence, self.handoff)

    def run_end(
        self, input: str, success: bool, error: Optional[str], total_turns: int, duration_ms: float,
        error_type: Optional[str] = None,
    ) -> None:
        """The run's last event: the run-end hooks, then ``RunEnd`` to observers.

        The run is sealed just before, in delivery order: a sub-agent's event forwarded later is dropped.
        """
        hooks = self.emitter.hooks
        if hooks is not None and hooks.hooks:
            ctx = RunHookContext(self.session_id, self.run_id, input)
            self.emitter.deliver(lambda c: hooks.run_end(c, success, error), ctx, self.fence, self.handoff)
        if self._observed:
            self.emitter.deliver(self._seal, None, self.fence, self.handoff)
        self.emit(RunEnd(self.session_id, self.run_id, success, error, total_turns, duration_ms, error_type))

    def _seal(self, _: object) -> None:
        self.sealed = True

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
        """A piece of streamed reasoning."""
        if ThinkingDelta in self._wanted:
            self._delta(ThinkingDelta, turn, delta)

    def tool_input_delta(self, turn: int, call_id: str, tool: str, delta: str) -> None:
        """A piece of a tool call's streamed arguments."""
        if ToolInputDelta in self._wanted:
            self._delta(ToolInputDelta, turn, delta, call_id, tool)

    def attempt_reset(self, turn: int, attempt: int) -> None:
        """A stream attempt failed: what the masks hold goes first, then ``AttemptReset``."""
        self.flush_deltas()
        self.emit(AttemptReset(self.session_id, self.run_id, turn, attempt))


__all__ = ["Emitter", "Phase", "RunEvents"]
