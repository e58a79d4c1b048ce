"""``OTelObserver``: loopctl's observer events as OpenTelemetry GenAI spans and metrics.

The span tree is built from the events themselves (run id, turn, call id),
never from ambient context: a run's ``invoke_agent`` span is opened on
``on_run_start`` with the caller's current span as its parent (events are
delivered inside a copy of the caller's contextvars, for ``run()`` and
``start()`` alike), and every ``chat {model}`` and ``execute_tool {name}``
span is made a child of that run span explicitly, whichever thread the
work ran on. Chat and tool spans are created when they end, with the start
time stamped by the event that opened them (a tool attempt runs from its
``on_tool_pre`` to its ``on_tool_post``, so a parallel wave's spans overlap
as the calls did), and a span's attributes are all known when the sampler
sees it.

Rules it keeps: per-run state lives on a per-run object keyed by run id
(one observer may watch many loops at once); message content (inputs,
replies, tool arguments and results, steering text) is recorded only with
``record_content=True``; error text is redacted and cut short; a run that
ends by any path (cancel takeover included) closes every span it opened.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any, ClassVar, Optional

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.trace import SpanKind

from loopctl.cancel import HANDED_BACK
from loopctl.events import (
    Event,
    Observer,
    OutputValidationFailed,
    RunEnd,
    RunResumed,
    RunStart,
    TextDelta,
    ThinkingDelta,
    ToolCallReceived,
    ToolInputDelta,
    ToolPost,
    ToolPre,
)

from . import conventions as cv
from .chat_events import ChatSpanEvents
from .instruments import Instruments
from .propagation import forget_run_span, note_run_span
from .spans import (
    RunState,
    SpanWriter,
    ToolEnd,
    is_cancel,
    json_text,
    messages_json,
    record_error,
    run_key,
)

_SCOPE = "loopctl"
_MAX_PENDING_CANCELS = 4096
#: Observer methods that only serve recorded content: skipped entirely unless opted in.
_CONTENT_METHODS = ("on_response", "on_tool_call_received")


def _scope_version() -> str:
    try:
        from loopctl import __version__
    except ImportError:  # pragma: no cover - a broken install
        return "unknown"
    return str(__version__)


class OTelObserver(ChatSpanEvents):
    """Turns a loop's events into OpenTelemetry GenAI spans and metrics.

    Register it like any observer (``loop.with_observer(OTelObserver())``),
    or with ``instrument(loop)``, which also watches the loop's cancel signal
    (the cancel's own time on the span, and the cancel latency metric) and
    names the loop's provider. Spans: ``invoke_agent`` per run (a child of
    the caller's current span), ``chat {model}`` per model call and
    ``execute_tool {name}`` per tool call attempt (children of the run's
    span). Compaction, retries, steering, fallbacks, detections, approvals
    and cancel are span events; a failed run or call has an error status,
    an ``error.type`` and a redacted ``exception`` event. A cancelled run is
    not an error: its spans say ``loopctl.cancelled`` / ``loopctl.run.outcome``.

    Args:
        tracer_provider: the provider to use (default: the global one, as
            set by ``opentelemetry.trace.set_tracer_provider``).
        meter_provider: the provider for metrics (default: the global one).
        agent_name: ``gen_ai.agent.name`` on every run span.
        provider_name: ``gen_ai.provider.name`` (e.g. ``"openai"``); by
            default the provider the model events name (the client's
            ``provider``), however the observer was attached; else left out.
        record_content: also record message content (run input and reply,
            each turn's reply, tool arguments and results, steering text).
            Off by default: content may hold personal data.
    """

    #: The events this observer leaves out of its telemetry, on purpose; every
    #: other event has a handler. Streamed pieces: the chat span records the
    #: assembled reply and its usage, not each fragment. A rejected typed
    #: answer: the model call that follows is its own span.
    IGNORED_EVENTS: ClassVar[tuple[type[Event], ...]] = (
        TextDelta,
        ThinkingDelta,
        ToolInputDelta,
        OutputValidationFailed,
    )

    def __init__(
        self,
        *,
        tracer_provider: Optional[trace.TracerProvider] = None,
        meter_provider: Optional[metrics.MeterProvider] = None,
        agent_name: str = "loopctl",
        provider_name: Optional[str] = None,
        record_content: bool = False,
    ) -> None:
        version = _scope_version()
        if tracer_provider is None:
            self._tracer = trace.get_tracer(_SCOPE, version)
        else:
            self._tracer = tracer_provider.get_tracer(_SCOPE, version)
        if meter_provider is None:
            meter = metrics.get_meter(_SCOPE, version)
        else:
            meter = meter_provider.get_meter(_SCOPE, version)
        self._metrics = Instruments(meter)
        self._spans = SpanWriter(self._tracer, self._metrics, bool(record_content))
        self.agent_name = agent_name
        self.provider_name = provider_name
        self.record_content = bool(record_content)
        self._runs: dict[str, RunState] = {}
        # session id -> the loop ``instrument`` wired (weakly: a closed loop leaves nothing here)
        self._loops: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
        self._cancels: dict[str, int] = {}  # session id -> ns of the pending cancel request
        self._cancels_lock = threading.Lock()
        if not self.record_content:
            for name in _CONTENT_METHODS:
                # The base no-op, bound: the loop then skips the event entirely.
                setattr(self, name, getattr(Observer, name).__get__(self))

    # -- wiring -------------------------------------------------------------------------------

    def instrument(self, loop: Any) -> object:
        """Register on ``loop`` and watch its cancel signal; returns the loop.

        Watching the signal puts each cancel's request time on the run's
        ``loopctl.cancel`` event and records the cancel latency metric;
        the loop's client names ``gen_ai.provider.name`` (its ``provider``).
        """
        session_id = loop.session.id
        with self._cancels_lock:
            if self._loops.get(session_id) is loop:
                return loop  # once per loop: a second registration would double every span
            self._loops[session_id] = loop
        loop.cancel_signal().add_listener(lambda: self._cancel_requested(session_id))
        loop.with_observer(self)
        return loop

    def _provider_of(self, session_id: str) -> Optional[str]:
        loop = self._loops.get(session_id)
        provider = getattr(getattr(loop, "client", None), "provider", None)
        return provider if isinstance(provider, str) and provider else None

    def _cancel_requested(self, session_id: str) -> None:
        # On the cancelling thread: only a timestamp, never a span call.
        with self._cancels_lock:
            if len(self._cancels) >= _MAX_PENDING_CANCELS:
                self._cancels.pop(next(iter(self._cancels)))
            self._cancels[session_id] = time.time_ns()

    def _take_cancel(self, session_id: str) -> Optional[int]:
        with self._cancels_lock:
            return self._cancels.pop(session_id, None)

    # -- the run ------------------------------------------------------------------------------

    def on_run_start(self, event: RunStart) -> None:
        """Open the run's ``invoke_agent`` span under the caller's current span."""
        attrs: dict[str, Any] = {}
        if self.record_content:
            attrs[cv.INPUT_MESSAGES] = messages_json("user", event.input)
        self._open_run(event.session_id, event.run_id, attrs, event.subagent)

    def on_run_resumed(self, event: RunResumed) -> None:
        """A run resumed here from its checkpoint: open its span (the trace came with the checkpoint).

        The span is a child of the current span: where a host made the
        checkpoint's trace context current, the span it continues.
        """
        if event.run_id in self._runs:
            return  # resumed in the process that opened it: the span goes on
        self._open_run(
            event.session_id, event.run_id, {cv.RUN_RESUMES: event.attempt, cv.RESUME_CAUSE: cv.redact(event.cause)}
        )

    def _open_run(self, session_id: str, run_id: str, extra: dict[str, Any], subagent: str = "") -> None:
        provider = self.provider_name or self._provider_of(session_id)
        attrs: dict[str, Any] = {
            cv.OPERATION_NAME: cv.OP_AGENT,
            cv.AGENT_NAME: self.agent_name,
            cv.CONVERSATION_ID: session_id,
            cv.RUN_ID: run_id,
            **extra,
        }
        if provider:
            attrs[cv.PROVIDER_NAME] = provider
        parent = self._subagent_parent(run_id, subagent) if subagent else None
        if subagent:
            attrs[cv.SUBAGENT] = subagent
        span = self._tracer.start_span(
            cv.OP_AGENT,
            context=parent if parent is not None else otel_context.get_current(),
            kind=SpanKind.INTERNAL,
            attributes=attrs,
            start_time=time.time_ns(),
        )
        if subagent:
            self._runs[f"{run_id}/{subagent}"] = RunState(span, session_id, provider)
        else:
            self._runs[run_id] = RunState(span, session_id, provider)
            note_run_span(run_id, span)  # a durable run's checkpoints carry it
        self._metrics.runs_started.add(1, {cv.AGENT_NAME: self.agent_name})

    def _subagent_parent(self, run_id: str, path: str) -> Optional[otel_context.Context]:
        """The context of the ``execute_tool`` span whose call runs the sub-agent at ``path``.

        The calling run's open attempt of the tool named like the sub-agent
        (its calls run one at a time); its span, made now (it is normally
        made when the call ends), becomes the sub-agent run span's parent.
        """
        above, _, name = path.rpartition("/")
        st = self._runs.get(f"{run_id}/{above}" if above else run_id)
        if st is None:
            return None
        for key, opened in reversed(list(st.tools.items())):
            if opened[2] == name:
                span = st.live.get(key)
                if span is None:
                    span = st.live[key] = self._spans.open_tool(st, key[0], key[1], opened)
                return trace.set_span_in_context(span)
        return None

    def on_run_end(self, event: RunEnd) -> None:
        """Close whatever the run left open, then its span; count the outcome."""
        st = self._runs.pop(run_key(event), None)
        cancel_ns = self._take_cancel(event.session_id)
        if st is None:
            return
        if not event.subagent:
            forget_run_span(event.run_id)
        now = time.time_ns()
        error = event.error
        error_class = None if event.success else self._error_class(event)
        if event.success:
            outcome = "completed"
        elif error_class == "Cancelled" or (error_class is None and is_cancel(error)):
            # A hand-back stops the run here so that it goes on elsewhere: not a cancel.
            outcome = cv.OUTCOME_HANDED_BACK if cv.cancel_reason(error) == HANDED_BACK else "cancelled"
        else:
            outcome = "failed"
        self._flush_failed_chat(st, error_class, error)
        if st.chat is not None:
            self._spans.chat(st, st.chat, now, event.success, error, None, error_class)
        self._spans.open_tools(st, now, error, error_class)
        span = st.span
        attrs: dict[str, Any] = {cv.RUN_OUTCOME: outcome, cv.RUN_TURNS: event.total_turns}
        if st.input_tokens or st.output_tokens:
            attrs[cv.INPUT_TOKENS] = st.input_tokens
            attrs[cv.OUTPUT_TOKENS] = st.output_tokens
        if self.record_content and event.success and st.text is not None:
            attrs[cv.OUTPUT_MESSAGES] = messages_json("assistant", st.text)
        metric_attrs: dict[str, Any] = {cv.AGENT_NAME: self.agent_name, cv.RUN_OUTCOME: outcome}
        if outcome == cv.OUTCOME_HANDED_BACK:
            span.add_event(cv.EV_HANDED_BACK, {}, timestamp=now)
        elif outcome == "cancelled":
            attrs[cv.CANCELLED] = True
            reason = cv.cancel_reason(error)
            span.add_event(
                cv.EV_CANCEL, {"loopctl.cancel.reason": reason} if reason else {},
                timestamp=cancel_ns if cancel_ns is not None else now,
            )
            if cancel_ns is not None:
                self._metrics.cancel_latency.record(max(0, now - cancel_ns) / 1e9, {cv.AGENT_NAME: self.agent_name})
        elif outcome == "failed":
            kind = error_class or cv.error_type(error)
            attrs[cv.ERROR_TYPE] = kind
            metric_attrs[cv.ERROR_TYPE] = kind
            record_error(span, kind, error, now, self.record_content)
        span.set_attributes(attrs)
        span.end(end_time=now)
        self._metrics.runs_ended.add(1, metric_attrs)

    def _error_class(self, event: RunEnd) -> Optional[str]:
        """The class name of the error that ended the run, when the observer can see it.

        The event's ``error_type`` names it. An event without one (from an
        older producer) falls back to the run's record on a loop wired by
        ``instrument``, whose ``stop_reason`` is set before ``on_run_end``
        (recording it is the first step of finalizing a run); else the text
        only suggests a class.
        """
        if event.error_type:
            return event.error_type
        loop = self._loops.get(event.session_id)
        if loop is None:
            return None
        try:
            runs = loop.session.runs
            for run in reversed(runs):
                if run.id == event.run_id:
                    err = run.stop_reason
                    return type(err).__name__ if isinstance(err, BaseException) else None
        except Exception:  # a loop of another shape: fall back to the text
            return None
        return None

    # -- tool calls ----------------------------------------------------------------------------

    def on_tool_call_received(self, event: ToolCallReceived) -> None:
        """The call's arguments (subscribed only with ``record_content``)."""
        st = self._runs.get(run_key(event))
        if st is not None:
            st.arguments[event.call_id] = json_text(event.input)

    def on_tool_pre(self, event: ToolPre) -> None:
        """An attempt starts: remember when (its span is made when it ends)."""
        st = self._runs.get(run_key(event))
        if st is not None:
            now = time.time_ns()
            st.tools[(event.call_id, event.attempt)] = (now, event.turn, event.tool)
            st.last_pre_ns = now

    def on_tool_post(self, event: ToolPost) -> None:
        """An attempt ended: its span lasts as long as the call itself ran.

        A parallel wave fires every pre before any call runs and every post
        after all have returned, so a post's own time says only when the
        wave ended. The calls start together after the wave's last pre: the
        span starts there and lasts the call's measured run time
        (``loopctl.tool.duration_ms``), so a wave's spans overlap as the
        calls did and a quick call's span is as short as the call.
        """
        st = self._runs.get(run_key(event))
        if st is None:
            return
        opened = st.tools.pop((event.call_id, event.attempt), None)
        if opened is None:
            return
        now = time.time_ns()
        start_ns, turn, tool = opened
        start_ns = min(max(start_ns, st.last_pre_ns), now)
        end_ns = now
        if event.duration_ms is not None and event.duration_ms >= 0:
            end_ns = min(now, start_ns + int(event.duration_ms * 1e6))
        output = event.output if self.record_content else None
        end = ToolEnd(end_ns, event.is_error, output, event.duration_ms)
        self._spans.tool(
            st, event.call_id, event.attempt, (start_ns, turn, tool), end,
            span=st.live.pop((event.call_id, event.attempt), None),
        )


__all__ = ["OTelObserver"]
