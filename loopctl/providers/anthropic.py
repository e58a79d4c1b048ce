"""Anthropic messages API: the native wire format and its event stream.

Owns the messages format: the system prompt in the native ``system`` field,
followed (in order) by any system-role messages of the request;
``tool_use``/``tool_result`` blocks (``is_error`` on failed results);
thinking blocks replayed with their signature; consecutive messages of one
role merged. And the stream: ``message_start``,
``content_block_start/delta/stop`` (``text_delta``, ``input_json_delta``,
``thinking_delta``, ``signature_delta``), ``message_delta`` (stop reason and
usage), ``message_stop`` (the terminal event), ``ping`` and mid-stream
``error`` events. A body that ends before ``message_stop`` was truncated.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import requests

from loopctl.checks import integer
from loopctl.errors import ModelError
from loopctl.messages import (
    Message,
    ModelRequest,
    ModelResponse,
    Role,
    StopReason,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolResultPart,
    Usage,
)
from loopctl.providers.base import (
    SIGNATURE,
    TEXT,
    THINKING,
    TOOL_CALL,
    TOOL_INPUT,
    MessageDelta,
    MessageStart,
    MessageStop,
    PartDelta,
    PartStart,
    PartStop,
    Ping,
    StreamEvent,
    token_count,
    tool_call_part,
)
from loopctl.providers.boundary import (
    PROTOCOL,
    RATE_LIMIT,
    STATUS,
    TRANSPORT,
    is_context_overflow,
    model_error,
    overflow_error,
    parse_json,
)
from loopctl.providers.client import HTTPClientBase
from loopctl.providers.http import DEFAULT_TIMEOUT, WIRE_INT_MAX, Timeout
from loopctl.providers.sse import SSEEvent
from loopctl.text import masked_head

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
INVALID_TOOL_NAME = "invalid_tool_call"  # the wire name of a replayed call that had none

STOP_REASONS = {
    "end_turn": StopReason.END_TURN,
    "tool_use": StopReason.TOOL_CALL,
    "max_tokens": StopReason.MAX_TOKENS,
    "stop_sequence": StopReason.STOP_SEQUENCE,
    "pause_turn": StopReason.END_TURN,
    "refusal": StopReason.END_TURN,
}

# Mid-stream error types -> (status it stands for, retryable, kind).
_ERROR_TYPES = {
    "overloaded_error": (529, True, RATE_LIMIT),
    "rate_limit_error": (429, True, RATE_LIMIT),
    "api_error": (500, True, STATUS),
    "timeout_error": (504, True, STATUS),
    "invalid_request_error": (400, False, STATUS),
    "authentication_error": (401, False, STATUS),
    "permission_error": (403, False, STATUS),
    "not_found_error": (404, False, STATUS),
    "request_too_large": (413, False, STATUS),
}


# Delta types -> (the key holding the delta's text, the delta's kind).
_DELTAS = {
    "text_delta": ("text", TEXT),
    "input_json_delta": ("partial_json", TOOL_INPUT),
    "thinking_delta": ("thinking", THINKING),
    "signature_delta": ("signature", SIGNATURE),
}


def _usage(data: object) -> Optional[Usage]:
    if not isinstance(data, Mapping):
        return None
    # Cached prompt tokens are part of what the request put in the window.
    inp = sum(
        token_count(data.get(k))
        for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    out = token_count(data.get("output_tokens"))
    return None if inp == 0 and out == 0 else Usage(inp, out)


def _error_event(payload: object, label: str) -> ModelError:
    err = payload.get("error") if isinstance(payload, Mapping) else None
    if not isinstance(err, Mapping):
        err = {}
    etype = str(err.get("type") or "error")
    msg = masked_head(str(err.get("message") or etype), 1000)
    status, retryable, kind = _ERROR_TYPES.get(etype, (None, False, STATUS))
    if etype in ("invalid_request_error", "request_too_large") and is_context_overflow(None, msg):
        return overflow_error(f"{label}: context too long: {msg}", status)
    summary = f"{etype} ({status})" if status else etype
    return model_error(f"{label}: {etype} from the server: {msg}", status, retryable, kind=kind, summary=summary)


class AnthropicStreamParser:
    """Maps Anthropic stream events to loopctl stream events (mutates)."""

    def __init__(self, label: str = "anthropic") -> None:
        self.done = False
        self._label = label
        self._skip: set[int] = set()

    def feed(self, event: SSEEvent) -> list[StreamEvent]:
        """Stream events for one SSE event (see ``feed_checked`` for shape errors)."""
        data = parse_json(event.data, self._label, "stream event")
        if type(data) is not dict:
            raise model_error(f"{self._label}: stream event is not a JSON object: {masked_head(event.data, 200)!r}", kind=PROTOCOL)
        etype = data.get("type") or event.event
        if etype == "content_block_delta":
            idx = data.get("index", 0)
            if idx in self._skip:
                return []
            delta = data.get("delta") or {}
            dtype = delta.get("type")
            known = _DELTAS.get(dtype) if type(dtype) is str else None
            if known is None:
                return []  # unknown deltas are ignored
            field, kind = known
            value = delta.get(field, "")
            if not isinstance(value, str):
                if kind != TOOL_INPUT or value is None:
                    return []  # a fragment that is not text: nothing to add
                value = json.dumps(value)  # some servers send the input object itself
            return [PartDelta(idx, kind, value)]
        if etype == "content_block_start":
            return self._block_start(data.get("index", 0), data.get("content_block") or {})
        if etype == "content_block_stop":
            idx = data.get("index")
            if idx in self._skip:
                return []
            return [PartStop(idx)]
        if etype == "message_delta":
            delta = data.get("delta") or {}
            reason = delta.get("stop_reason")
            return [MessageDelta(STOP_REASONS.get(reason) if reason else None, _usage(data.get("usage")))]
        if etype == "message_start":
            msg = data.get("message") or {}
            return [MessageStart(msg.get("model"), _usage(msg.get("usage")))]
        if etype == "message_stop":
            self.done = True
            return [MessageStop()]
        if etype == "ping":
            return [Ping()]
        if etype == "error":
            raise _error_event(data, self._label)
        return []

    def _block_start(self, idx: int, block: Mapping[str, Any]) -> list[StreamEvent]:
        btype = block.get("type")
        if btype == "text":
            out: list[StreamEvent] = [PartStart(idx, TEXT)]
            text = _text(block, "text")
            if text:
                out.append(PartDelta(idx, TEXT, text))
            return out
        if btype == "tool_use" or btype == "server_tool_use":
            out = [PartStart(idx, TOOL_CALL, block.get("id"), block.get("name") or "")]
            if block.get("input"):
                out.append(PartDelta(idx, TOOL_INPUT, json.dumps(block["input"])))
            return out
        if btype == "thinking":
            out = [PartStart(idx, THINKING)]
            thinking, signature = _text(block, "thinking"), _text(block, "signature")
            if thinking:
                out.append(PartDelta(idx, THINKING, thinking))
            if signature:
                out.append(PartDelta(idx, SIGNATURE, signature))
            return out
        self._skip.add(idx)  # redacted thinking and block types we do not model
        return []

    def finish(self) -> list[StreamEvent]:
        """The body ended before ``message_stop``: always a truncation.

        Raises:
            ModelError: (retryable, kind "transport").
        """
        raise model_error(
            f"{self._label}: stream truncated: the body ended before message_stop",
            retryable=True,
            kind=TRANSPORT,
        )


# -- request building -----------------------------------------------------------


def _blocks(msg: Message) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in msg.parts:
        t = type(p)
        if t is TextPart:
            if p.text:  # type: ignore[union-attr]
                out.append({"type": "text", "text": p.text})  # type: ignore[union-attr]
        elif t is ToolResultPart:
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": p.tool_call_id,  # type: ignore[union-attr]
                "content": p.output,  # type: ignore[union-attr]
            }
            if p.is_error:  # type: ignore[union-attr]
                block["is_error"] = True
            out.append(block)
        elif t is ToolCallPart:
            # A nameless call (answered with a soft error) still needs a name on the wire.
            name = p.name or INVALID_TOOL_NAME  # type: ignore[union-attr]
            out.append({"type": "tool_use", "id": p.id, "name": name, "input": dict(p.input)})  # type: ignore[union-attr]
        elif t is ThinkingPart:
            # Only a signed block can be replayed; an unsigned one is dropped.
            if p.signature:  # type: ignore[union-attr]
                out.append({"type": "thinking", "thinking": p.text, "signature": p.signature})  # type: ignore[union-attr]
    return out


def messages_to_anthropic(
    messages: Sequence[Message], system: Optional[str]
) -> tuple[Optional[str], list[dict[str, Any]]]:
    """The native ``system`` text and ``messages`` list for a conversation.

    System-role messages are folded into ``system`` after the system prompt,
    in order; consecutive messages of one role are merged (tool results
    first within a user message, as the API requires).
    """
    system_parts = [system] if system else []
    out: list[dict[str, Any]] = []
    for msg in messages:
        if msg.role is Role.SYSTEM:
            if msg.text:
                system_parts.append(msg.text)
            continue
        blocks = _blocks(msg)
        if not blocks:
            continue
        role = msg.role.value
        if out and out[-1]["role"] == role:
            prev = out[-1]["content"]
            if role == "user" and any(b["type"] == "tool_result" for b in blocks):
                # Tool results must lead the user turn that answers tool_use.
                results = [b for b in blocks if b["type"] == "tool_result"]
                others = [b for b in blocks if b["type"] != "tool_result"]
                lead = [b for b in prev if b["type"] == "tool_result"]
                rest = [b for b in prev if b["type"] != "tool_result"]
                out[-1]["content"] = lead + results + rest + others
            else:
                prev.extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return ("\n\n".join(system_parts) if system_parts else None), out


class AnthropicClient(HTTPClientBase):
    """A client for the Anthropic messages API.

    Args:
        model: the model name (e.g. ``"claude-sonnet-4-5"``).
        api_key: the key; defaults to ``ANTHROPIC_API_KEY``.
        base_url: the host root; defaults to ``ANTHROPIC_BASE_URL`` or
            ``https://api.anthropic.com``. Requests go to ``{base_url}/v1/messages``.
        session: a ``requests.Session`` to use (one is made per client otherwise).
        timeout: seconds, or ``(connect, read)``; read is the idle bound.
        extra_headers: added to every request (e.g. ``anthropic-beta``).
        max_tokens: the reply cap sent when the request sets none (the API
            requires one).
        version: the ``anthropic-version`` header.
    """

    provider = "anthropic"
    key_env = "ANTHROPIC_API_KEY"
    #: Typed-answer modes, preferred first: a final-answer tool the model must call.
    output_modes: tuple[str, ...] = ("tool", "native", "prompt")
    default_base_url = DEFAULT_BASE_URL
    stream_hint = " (is base_url right? for Anthropic it is the host root, requests go to {base_url}/v1/messages)"

    def __init__(
        self,
        model: str,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        session: Optional[requests.Session] = None,
        timeout: Timeout = DEFAULT_TIMEOUT,
        extra_headers: Optional[Mapping[str, str]] = None,
        max_tokens: int = 4096,
        version: str = API_VERSION,
    ) -> None:
        if api_key is None:
            api_key = os.environ.get("ANTHROPIC_API_KEY")
        if base_url is None:
            base_url = os.environ.get("ANTHROPIC_BASE_URL") or DEFAULT_BASE_URL
        integer(max_tokens, "AnthropicClient.max_tokens", 1, WIRE_INT_MAX)
        super().__init__(model, api_key, base_url, session, timeout, extra_headers)
        self._max_tokens = max_tokens
        self._version = version

    def _url(self) -> str:
        return self._base_url + "/v1/messages"

    def _headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json", "anthropic-version": self._version}
        key = self._secret.reveal()
        if key:
            headers["x-api-key"] = key
        return headers

    def _parser(self) -> AnthropicStreamParser:
        return AnthropicStreamParser(self.provider)

    def _body(self, request: ModelRequest, stream: bool) -> dict[str, Any]:
        opts = request.options
        model = (opts.model if opts is not None and opts.model else None) or self._model
        system, messages = messages_to_anthropic(tuple(request.messages), request.system)
        body: dict[str, Any] = {"model": model, "max_tokens": self._max_tokens}
        if system:
            body["system"] = system
        body["messages"] = messages
        tools = list(request.tools)
        if tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": dict(t.input_schema)}
                for t in tools
            ]
        if stream:
            body["stream"] = True
        if opts is not None:
            self._apply_options(body, opts, {t.name for t in tools})
        return body

    def _native_tool_choice(self, choice: str) -> object:
        if choice in ("auto", "none"):
            return {"type": choice}
        if choice == "required":
            return {"type": "any"}
        return {"type": "tool", "name": choice}

    def _native_response_format(self, fmt: Mapping[str, Any]) -> tuple[str, object]:
        inner = fmt.get("json_schema")
        if fmt.get("type") == "json_schema" and isinstance(inner, Mapping) and "properties" not in fmt:
            fmt = inner.get("schema") or {}  # the OpenAI shape (a typed run's "native" mode)
        return "output_config", {"format": {"type": "json_schema", "schema": dict(fmt)}}

    def _response_from_json(self, data: object) -> ModelResponse:
        label = f"{self.provider} ({self._model})"
        if not isinstance(data, Mapping):
            raise model_error(f"{label}: response is not a JSON object", kind=PROTOCOL)
        if data.get("type") == "error":
            raise _error_event(data, label)
        content = data.get("content")
        if not isinstance(content, list):
            raise model_error(f"{label}: response has no content list: keys {sorted(map(str, data))[:10]}", kind=PROTOCOL)
        parts: list[Any] = []
        for block in content:
            btype = block.get("type") if isinstance(block, Mapping) else None
            if btype == "text":
                text = _text(block, "text")
                if text:
                    parts.append(TextPart(text))
            elif btype == "tool_use":
                parts.append(tool_call_part(block.get("id") or "", block.get("name") or "", block.get("input")))
            elif btype == "thinking":
                parts.append(ThinkingPart(_text(block, "thinking"), _text(block, "signature") or None))
        message = Message(Role.ASSISTANT, tuple(parts))
        stop = STOP_REASONS.get(data.get("stop_reason") or "", StopReason.END_TURN)
        if stop is StopReason.END_TURN and message.tool_calls:
            stop = StopReason.TOOL_CALL
        return ModelResponse(message, stop, _usage(data.get("usage")), data.get("model"))


def _text(block: Mapping[str, Any], field: str) -> str:
    """``block[field]`` when it is a string, else ``""`` (a server's odd value is not text)."""
    value = block.get(field)
    return value if isinstance(value, str) else ""


__all__ = ["AnthropicClient", "AnthropicStreamParser", "messages_to_anthropic"]
