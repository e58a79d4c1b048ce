"""Per-run tracing state and the writer that turns it into finished spans and metrics.

``RunState`` is one run's open span and what its children will say;
``ChatCall`` is a model call in flight. ``SpanWriter`` makes the ``chat``
and ``execute_tool`` spans when their call ends — as children of the run's
span, with the start time stamped when the call began — and records the
GenAI metrics alongside. Content (replies, tool arguments and results) is
written only when the writer was made with ``record_content``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Optional, Union

import attrs
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from loopctl.events import TurnEnd
from loopctl.text import json_safe

from . import conventions as cv
from .instruments import Instruments


class ChatCall:
    """One model call in flight: what its span will say when it ends."""

    __slots__ = ("turn", "start_ns", "request_model", "response_model", "provider", "usage_known", "events", "text")

    def __init__(
        self, turn: int, start_ns: int, provider: Optional[str] = None, request_model: Optional[str] = None
    ) -> None:
        self.turn = turn
        self.start_ns = start_ns
        self.provider = provider  # from the model events: whoever attached the observer
        self.request_model = request_model  # the model asked for (the span's name)
        self.response_model: Optional[str] = None  # the model the server says served it
        self.usage_known = False
        self.events: list[tuple[str, dict[str, Any], int]] = []  # (name, attributes, ns)
        self.text: Optional[str] = None


#: An attempt in flight: (start ns, turn, tool name).
OpenTool = tuple[int, int, str]


def run_key(event: Any) -> str:
    """Which run's state an event belongs to: its run id, plus the sub-agent path if any.

    A sub-agent's events carry the calling run's id and their path, and a
    sub-agent's calls run one at a time: the pair names one run in flight.
    """
    sub = getattr(event, "subagent", "")  # duck-typed events (approvals) may lack it
    return f"{event.run_id}/{sub}" if sub else str(event.run_id)


class RunState:
    """One run's span and tallies (touched only by the thread delivering its events)."""

    __slots__ = (
        "span",
        "parent",
        "session_id",
        "provider",
        "model",
        "chat",
        "tools",
        "arguments",
        "input_tokens",
        "output_tokens",
        "text",
        "last_pre_ns",
        "failed_chat",
        "live",
    )

    def __init__(self, span: Span, session_id: str, provider: Optional[str]) -> None:
        self.span = span
        self.parent = trace.set_span_in_context(span)  # every child's explicit parent
        self.session_id = session_id
        self.provider = provider
        self.model: Optional[str] = None  # the last model a call of this run asked for
        self.chat: Optional[ChatCall] = None
        self.tools: dict[tuple[str, int], OpenTool] = {}  # (call id, attempt) -> its start
        self.arguments: dict[str, str] = {}  # call id -> JSON arguments (content only)
        self.input_tokens = 0
        self.output_tokens = 0
        self.text: Optional[str] = None  # the last reply's text (content only)
        self.last_pre_ns = 0  # the newest on_tool_pre: a wave's calls start to run after its last one
        # A model call that failed, held until the run goes on or ends: if the run
        # ends with that failure, the run's record names the error's class.
        self.failed_chat: Optional[tuple[ChatCall, int, TurnEnd]] = None
        # Attempts whose span was made before they ended: a sub-agent run's
        # span needed it as its parent. (call id, attempt) -> the open span.
        self.live: dict[tuple[str, int], Span] = {}


def is_cancel(error: Optional[str]) -> bool:
    """True for a ``Cancelled`` error's message."""
    return cv.is_cancel_text(error)


@attrs.frozen
class ToolEnd:
    """How a tool call attempt ended: when, whether as an error, and what it said.

    ``cancelled``, ``error`` and ``kind`` are set for an attempt a run's
    end cut short (the run's error and its class); ``output`` is the
    result's text, given only when content is recorded.
    """

    end_ns: int
    is_error: bool
    output: Optional[str] = None
    duration_ms: Optional[float] = None
    cancelled: bool = False
    error: Optional[str] = None
    kind: Optional[str] = None


class SpanWriter:
    """Makes the finished child spans of a run and records the GenAI metrics."""

    def __init__(self, tracer: Tracer, instruments: Instruments, record_content: bool) -> None:
        self.tracer = tracer
        self.metrics = instruments
        self.record_content = record_content

    def chat(
        self,
        st: RunState,
        chat: ChatCall,
        now: int,
        success: bool,
        error: Optional[str],
        end: Optional[TurnEnd],
        error_class: Optional[str] = None,
    ) -> None:
        """End the model call ``chat`` of ``st``: its span, its duration and token metrics.

        ``error_class`` is the failure's exception class when known; else it
        is read from the text of ``error``.
        """
        if st.chat is chat:
            st.chat = None
        # An older producer's TurnStart names no model: the last one asked for
        # in the run, else the one that served the call, is the best known.
        model = chat.request_model or st.model or chat.response_model
        if chat.request_model:
            st.model = chat.request_model
        attrs: dict[str, Any] = {cv.OPERATION_NAME: cv.OP_CHAT, cv.TURN: chat.turn}
        provider = chat.provider or st.provider
        if provider:
            attrs[cv.PROVIDER_NAME] = provider
        if model:
            attrs[cv.REQUEST_MODEL] = model
        if error_class is not None:
            cancelled = not success and error_class == "Cancelled"
        else:
            cancelled = not success and is_cancel(error)
        kind: Optional[str] = None
        if success and end is not None:
            self._reply_attrs(st, chat, end, attrs)
        elif cancelled:
            attrs[cv.CANCELLED] = True
        else:
            kind = error_class or cv.error_type(error, "ModelError")
            attrs[cv.ERROR_TYPE] = kind
        span = self.tracer.start_span(
            f"{cv.OP_CHAT} {model}" if model else cv.OP_CHAT,
            context=st.parent,
            kind=SpanKind.CLIENT,
            attributes=attrs,
            start_time=chat.start_ns,
        )
        for name, event_attrs, ts in chat.events:
            span.add_event(name, event_attrs, timestamp=ts)
        if kind is not None:
            record_error(span, kind, error, now, self.record_content)
        span.end(end_time=now)
        self._chat_metrics(chat, now, success, end, provider, model, kind)

    def _reply_attrs(self, st: RunState, chat: ChatCall, end: TurnEnd, attrs: dict[str, Any]) -> None:
        """A successful call's span attributes: the serving model, tokens (added to the run's), finish."""
        if chat.response_model:
            attrs[cv.RESPONSE_MODEL] = chat.response_model
        if chat.usage_known:
            attrs[cv.INPUT_TOKENS] = end.input_tokens
            attrs[cv.OUTPUT_TOKENS] = end.output_tokens
            st.input_tokens += end.input_tokens
            st.output_tokens += end.output_tokens
        if end.stop_reason is not None:
            attrs[cv.FINISH_REASONS] = (cv.FINISH_REASON_OF.get(end.stop_reason, str(end.stop_reason)),)
        if self.record_content and chat.text is not None:
            attrs[cv.OUTPUT_MESSAGES] = messages_json("assistant", chat.text)

    def _chat_metrics(
        self,
        chat: ChatCall,
        now: int,
        success: bool,
        end: Optional[TurnEnd],
        provider: Optional[str],
        model: Optional[str],
        kind: Optional[str],
    ) -> None:
        """The call's duration and token metrics; they carry the conventions' attributes only (low cardinality)."""
        m_attrs: dict[str, Any] = {cv.OPERATION_NAME: cv.OP_CHAT}
        if provider:
            m_attrs[cv.PROVIDER_NAME] = provider
        if model:
            m_attrs[cv.REQUEST_MODEL] = model
        if success and chat.response_model:
            m_attrs[cv.RESPONSE_MODEL] = chat.response_model
        if kind is not None:
            m_attrs[cv.ERROR_TYPE] = kind
        seconds = end.duration_ms / 1000.0 if end is not None else max(0, now - chat.start_ns) / 1e9
        self.metrics.duration.record(seconds, m_attrs)
        if success and end is not None and chat.usage_known:
            usage = self.metrics.token_usage
            usage.record(end.input_tokens, {**m_attrs, cv.TOKEN_TYPE: "input"})
            usage.record(end.output_tokens, {**m_attrs, cv.TOKEN_TYPE: "output"})

    def tool(
        self, st: RunState, call_id: str, attempt: int, opened: OpenTool, end: ToolEnd, span: Any = None
    ) -> None:
        """One tool call attempt's span, from ``opened`` to ``end.end_ns``.

        ``end.error`` is the run's error when the attempt was cut short by it;
        a soft error result (``is_error`` alone) says only that, never the
        tool's own text, unless content is recorded. ``span`` is the
        attempt's span when ``open_tool`` made it already.
        """
        end_ns, is_error, output, duration_ms = end.end_ns, end.is_error, end.output, end.duration_ms
        cancelled, error, kind = end.cancelled, end.error, end.kind
        start_ns, turn, tool = opened
        attrs: dict[str, Any] = {
            cv.OPERATION_NAME: cv.OP_TOOL,
            cv.TOOL_NAME: tool,
            cv.TOOL_CALL_ID: call_id,
            cv.TOOL_TYPE: "function",
            cv.TURN: turn,
            cv.ATTEMPT: attempt,
        }
        if duration_ms is not None:
            attrs[cv.TOOL_DURATION] = float(duration_ms)
        if self.record_content:
            args = st.arguments.get(call_id)
            if args is not None:
                attrs[cv.TOOL_ARGUMENTS] = args
            if output is not None:
                attrs[cv.TOOL_RESULT] = cv.clean(output)
        if cancelled:
            attrs[cv.CANCELLED] = True
        elif is_error:
            attrs[cv.ERROR_TYPE] = kind or ("tool_error" if error is None else cv.error_type(error))
        if span is None:
            span = self.tracer.start_span(
                f"{cv.OP_TOOL} {tool}", context=st.parent, kind=SpanKind.INTERNAL, attributes=attrs,
                start_time=start_ns,
            )
        else:
            span.set_attributes(attrs)
        if is_error and not cancelled:
            if error is None or error == NO_RESULT:
                text = error or "the tool returned an error result"
            else:  # the run's error that cut the call short
                text = cv.error_message(str(attrs[cv.ERROR_TYPE]), error, self.record_content)
            span.set_status(Status(StatusCode.ERROR, text))
        span.end(end_time=max(start_ns, end_ns))

    def open_tool(self, st: RunState, call_id: str, attempt: int, opened: OpenTool) -> Span:
        """Start an attempt's span now, before it ends (``tool`` finishes it)."""
        start_ns, turn, tool = opened
        attrs: dict[str, Union[str, int]] = {
            cv.OPERATION_NAME: cv.OP_TOOL, cv.TOOL_NAME: tool, cv.TOOL_CALL_ID: call_id, cv.TURN: turn
        }
        return self.tracer.start_span(
            f"{cv.OP_TOOL} {tool}", context=st.parent, kind=SpanKind.INTERNAL, attributes=attrs, start_time=start_ns
        )

    def open_tools(
        self, st: RunState, now: int, error: Optional[str], error_class: Optional[str] = None
    ) -> None:
        """End the attempts that never posted at ``now``.

        ``error`` is what cut them short (a cancel, a hard stop) and
        ``error_class`` its exception class when known; None when the tool
        phase ended well, which leaves only attempts a pre-tool hook blocked
        (a soft refusal without ``on_tool_post``).
        """
        if not st.tools:
            return
        open_tools, st.tools = st.tools, {}
        if error_class is not None:
            cancelled = error_class == "Cancelled"
        else:
            cancelled = is_cancel(error)
        for (call_id, attempt), opened in open_tools.items():
            end = ToolEnd(
                now, not cancelled, cancelled=cancelled, error=error or NO_RESULT,
                kind=(error_class if error else "no_result"),
            )
            self.tool(st, call_id, attempt, opened, end, span=st.live.pop((call_id, attempt), None))


#: The status of an attempt that ended without ``on_tool_post`` while its phase went on.
NO_RESULT = "the call ended without a result (blocked before it ran)"


def record_error(span: Span, kind: str, error: Optional[str], now: int, record_content: bool = False) -> None:
    """Error status plus the conventions' ``exception`` event (text only as ``cv.error_message`` allows)."""
    text = cv.error_message(kind, error, record_content)
    span.set_status(Status(StatusCode.ERROR, text))
    span.add_event(cv.EV_EXCEPTION, {"exception.type": kind, "exception.message": text}, timestamp=now)


def json_text(value: Mapping[str, Any]) -> str:
    """Tool arguments as JSON text, cleaned for export."""
    try:
        text = json.dumps(json_safe(dict(value)), ensure_ascii=False, default=str, allow_nan=False)
    except (TypeError, ValueError):
        text = repr(value)
    return cv.clean(text)


def messages_json(role: str, text: str) -> str:
    """One message in the conventions' ``gen_ai.*.messages`` shape."""
    return json.dumps([{"role": role, "parts": [{"type": "text", "content": cv.clean(text)}]}], ensure_ascii=False)


__all__ = [
    "ChatCall", "OpenTool", "RunState", "SpanWriter", "is_cancel", "json_text", "messages_json", "record_error", "run_key",
]
