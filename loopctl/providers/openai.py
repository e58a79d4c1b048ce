"""OpenAI chat completions (and compatible servers: Ollama, vLLM, llama.cpp, LM Studio).

Owns the chat-completions wire format: the system prompt as the first
message, tools as ``{"type": "function", ...}``, tool results as ``role:
"tool"`` messages, ``stream_options.include_usage``; and the stream: text
deltas, ``reasoning_content`` (vLLM/DeepSeek) or ``reasoning`` deltas as
thinking, tool-call fragments routed by their ``index`` (ids and names only
in the first fragment; arguments whole or in pieces), finish reasons,
usage in the last chunk, ``[DONE]``. A body that ends with neither
``[DONE]`` nor a finish reason was truncated and is never a complete reply.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Mapping
from typing import Any, Optional
from urllib.parse import urlsplit

import requests

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
    StreamEvent,
    token_count,
    tool_call_part,
)
from loopctl.providers.boundary import (
    PROTOCOL,
    RATE_LIMIT,
    STATUS,
    is_context_overflow,
    model_error,
    overflow_error,
    parse_json,
)
from loopctl.providers.client import HTTPClientBase
from loopctl.providers.http import DEFAULT_TIMEOUT, Timeout
from loopctl.providers.sse import DONE, SSEEvent
from loopctl.text import masked_head

DEFAULT_BASE_URL = "https://api.openai.com/v1"

FINISH_REASONS = {
    "stop": StopReason.END_TURN,
    "end_turn": StopReason.END_TURN,
    "tool_calls": StopReason.TOOL_CALL,
    "function_call": StopReason.TOOL_CALL,
    "tool_use": StopReason.TOOL_CALL,
    "length": StopReason.MAX_TOKENS,
    "max_tokens": StopReason.MAX_TOKENS,
    "stop_sequence": StopReason.STOP_SEQUENCE,
    "content_filter": StopReason.END_TURN,
}

_TOOL_CHOICES = ("auto", "none", "required")
INVALID_TOOL_NAME = "invalid_tool_call"  # the wire name of a replayed call that had none

def _usage(data: object) -> Optional[Usage]:
    if not isinstance(data, Mapping):
        return None
    inp = token_count(data.get("prompt_tokens") or data.get("input_tokens"))
    out = token_count(data.get("completion_tokens") or data.get("output_tokens"))
    return None if inp == 0 and out == 0 else Usage(inp, out)


def _new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _stream_error(payload: object, label: str) -> ModelError:
    err = payload.get("error") if isinstance(payload, Mapping) else None
    if isinstance(err, Mapping):
        msg = masked_head(str(err.get("message") or err.get("type") or err), 1000)
        etype = str(err.get("type") or err.get("code") or "")
    else:
        msg, etype = masked_head(str(err), 1000), ""
    if "rate_limit" in etype or "overloaded" in etype:
        return model_error(
            f"{label}: rate limited mid-stream: {msg}", 429, True, kind=RATE_LIMIT, summary="rate limited (429)"
        )
    if is_context_overflow(None, f"{etype} {msg}"):
        return overflow_error(f"{label}: context too long: {msg}", None)
    retryable = etype in ("server_error", "api_error", "internal_error", "timeout")
    return model_error(f"{label}: error from the server: {msg}", None, retryable, kind=STATUS,
                       summary="server error" if retryable else None)


class OpenAIStreamParser:
    """Maps chat-completion chunks to stream events (mutates; one per stream)."""

    def __init__(self, label: str = "openai") -> None:
        self.done = False
        self._label = label
        self._started = False
        self._next = 0
        self._text: Optional[int] = None
        self._thinking: Optional[int] = None
        self._tools: dict[int, int] = {}
        self._tool_ids: dict[str, int] = {}
        self._open: list[int] = []
        self._stop: Optional[StopReason] = None
        self._usage: Optional[Usage] = None
        self._finished = False

    def _open_part(self, out: list[StreamEvent], kind: str, call_id: Optional[str] = None,
                   name: Optional[str] = None) -> int:
        idx = self._next
        self._next += 1
        self._open.append(idx)
        out.append(PartStart(idx, kind, call_id, name))
        return idx

    def _close_all(self, out: list[StreamEvent]) -> None:
        for idx in self._open:
            out.append(PartStop(idx))
        self._open = []

    def feed(self, event: SSEEvent) -> list[StreamEvent]:
        """Stream events for one SSE event (see ``feed_checked`` for shape errors)."""
        data = event.data
        if data == DONE:
            self.done = True
            return self._end()
        chunk = parse_json(data, self._label, "stream chunk")
        if type(chunk) is not dict:
            raise model_error(f"{self._label}: stream chunk is not a JSON object: {masked_head(data, 200)!r}", kind=PROTOCOL)
        if chunk.get("error") and not chunk.get("choices"):  # "error": null is no error
            raise _stream_error(chunk, self._label)
        out: list[StreamEvent] = []
        if not self._started:
            self._started = True
            out.append(MessageStart(model=chunk.get("model")))
        choices = chunk.get("choices")
        if choices:
            choice = choices[0]
            delta = choice.get("delta")
            if delta:
                reasoning_content = delta.get("reasoning_content")
                reasoning = reasoning_content or delta.get("reasoning")
                if reasoning and isinstance(reasoning, str):
                    idx = self._thinking
                    if idx is None:
                        idx = self._thinking = self._open_part(out, THINKING)
                    out.append(PartDelta(idx, THINKING, reasoning))
                content = delta.get("content")
                if content and isinstance(content, str):
                    idx = self._text
                    if idx is None:
                        idx = self._text = self._open_part(out, TEXT)
                    out.append(PartDelta(idx, TEXT, content))
                tool_calls = delta.get("tool_calls")
                if tool_calls:
                    for tc in tool_calls:
                        self._tool_fragment(tc, out)
            reason = choice.get("finish_reason")
            if reason:
                self._stop = FINISH_REASONS.get(reason, self._stop)
                self._finished = True
                self._close_all(out)
        usage = chunk.get("usage")
        if usage:
            self._usage = _usage(usage) or self._usage
        return out

    def _tool_fragment(self, tc: object, out: list[StreamEvent]) -> None:
        if not isinstance(tc, Mapping):
            return
        fn = tc.get("function") or {}
        call_id = tc.get("id")
        i = tc.get("index")
        if not isinstance(i, int):
            # Servers that omit the index: a new id starts a new call.
            if call_id and call_id not in self._tool_ids:
                i = len(self._tools)
            elif call_id:
                i = self._tool_ids[call_id]
            else:
                i = max(self._tools, default=0)
        idx = self._tools.get(i)
        if idx is None:
            cid = call_id or _new_call_id()
            idx = self._open_part(out, TOOL_CALL, cid, fn.get("name") or "")
            self._tools[i] = idx
            self._tool_ids[cid] = i
        args = fn.get("arguments")
        if not args:
            return
        if not isinstance(args, str):  # some servers send the object itself
            args = json.dumps(args)
        out.append(PartDelta(idx, TOOL_INPUT, args))

    def _end(self) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        if not self._started:
            self._started = True
            out.append(MessageStart())
        self._close_all(out)
        out.append(MessageDelta(self._stop, self._usage))
        out.append(MessageStop())
        return out

    def finish(self) -> list[StreamEvent]:
        """The body ended without ``[DONE]``: complete only after a finish reason.

        Raises:
            ModelError: (retryable, kind "transport") the stream was truncated.
        """
        if self._finished:
            self.done = True
            return self._end()
        raise model_error(
            f"{self._label}: stream truncated: the body ended without a finish reason or [DONE]",
            retryable=True,
            kind="transport",
        )


# -- request building -----------------------------------------------------------


def message_to_openai(msg: Message) -> list[dict[str, Any]]:
    """The chat-completions messages for one ``Message`` (tool results split out)."""
    role = msg.role
    if role is Role.ASSISTANT:
        text = "".join(p.text for p in msg.parts if type(p) is TextPart)
        calls = [
            {
                "id": p.id,
                "type": "function",
                # A nameless call (answered with a soft error) still needs a name on the wire.
                "function": {"name": p.name or INVALID_TOOL_NAME,
                             "arguments": json.dumps(dict(p.input), ensure_ascii=False)},
            }
            for p in msg.parts
            if type(p) is ToolCallPart
        ]
        out: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
        if calls:
            out["tool_calls"] = calls
        return [out]
    results = [
        {"role": "tool", "tool_call_id": p.tool_call_id, "content": p.output}
        for p in msg.parts
        if type(p) is ToolResultPart
    ]
    text = "".join(p.text for p in msg.parts if type(p) is TextPart)
    if text or not results:
        results.append({"role": role.value, "content": text})
    return results


def _schema_name(schema: Mapping[str, Any]) -> str:
    name = re.sub(r"[^A-Za-z0-9_-]", "_", str(schema.get("title") or "response"))[:64]
    return name or "response"


class OpenAIClient(HTTPClientBase):
    """A client for OpenAI chat completions and OpenAI-compatible servers.

    Args:
        model: the model name (e.g. ``"gpt-4o"``, ``"llama3.1"``).
        api_key: the key; defaults to ``OPENAI_API_KEY`` (None: no auth header,
            as local servers want).
        base_url: including the ``/v1`` part; defaults to ``OPENAI_BASE_URL``
            or ``https://api.openai.com/v1``. Requests go to
            ``{base_url}/chat/completions``.
        session: a ``requests.Session`` to use (one is made per client
            otherwise; only a client-made session lets ``close()`` interrupt
            a call still waiting for response headers).
        timeout: seconds, or ``(connect, read)``; read is the idle bound.
        extra_headers: added to every request.
    """

    provider = "openai"
    key_env = "OPENAI_API_KEY"
    default_base_url = DEFAULT_BASE_URL
    stream_hint = " (is base_url right? for OpenAI-compatible servers it should end in /v1)"

    def __init__(
        self,
        model: str,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        session: Optional[requests.Session] = None,
        timeout: Timeout = DEFAULT_TIMEOUT,
        extra_headers: Optional[Mapping[str, str]] = None,
    ) -> None:
        if api_key is None:
            api_key = os.environ.get("OPENAI_API_KEY")
        if base_url is None:
            base_url = os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        super().__init__(model, api_key, base_url, session, timeout, extra_headers)

    @property
    def output_modes(self) -> tuple[str, ...]:
        """Typed-answer modes, preferred first: native structured output on
        api.openai.com; a final-answer tool on any other server (OpenAI-compatible
        servers rarely honour ``json_schema``, tools they mostly do)."""
        if urlsplit(self._base_url).hostname == "api.openai.com":
            return ("native", "tool", "prompt")
        return ("tool", "native", "prompt")

    def _url(self) -> str:
        return self._base_url + "/chat/completions"

    def _headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        key = self._secret.reveal()
        if key:
            headers["authorization"] = f"Bearer {key}"
        return headers

    def _parser(self) -> OpenAIStreamParser:
        return OpenAIStreamParser(self.provider)

    def _body(self, request: ModelRequest, stream: bool) -> dict[str, Any]:
        opts = request.options
        model = (opts.model if opts is not None and opts.model else None) or self._model
        messages: list[dict[str, Any]] = []
        if request.system:
            messages.append({"role": "system", "content": request.system})
        for msg in request.messages:
            messages.extend(message_to_openai(msg))
        body: dict[str, Any] = {"model": model, "messages": messages}
        tools = list(request.tools)
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": dict(t.input_schema),
                    },
                }
                for t in tools
            ]
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if opts is not None:
            self._apply_options(body, opts, {t.name for t in tools})
        return body

    def _native_tool_choice(self, choice: str) -> object:
        if choice in _TOOL_CHOICES:
            return choice
        return {"type": "function", "function": {"name": choice}}

    def _native_response_format(self, fmt: Mapping[str, Any]) -> tuple[str, object]:
        if fmt.get("type") in ("json_schema", "json_object", "text") and "properties" not in fmt:
            return "response_format", dict(fmt)  # already the native shape
        return "response_format", {
            "type": "json_schema",
            "json_schema": {"name": _schema_name(fmt), "schema": dict(fmt), "strict": True},
        }

    def _response_from_json(self, data: object) -> ModelResponse:
        label = f"{self.provider} ({self._model})"
        if not isinstance(data, Mapping):
            raise model_error(f"{label}: response is not a JSON object", kind=PROTOCOL)
        if data.get("error") and not data.get("choices"):
            raise _stream_error(data, label)
        choices = data.get("choices")
        if not choices or not isinstance(choices[0], Mapping):
            raise model_error(f"{label}: response has no choices: keys {sorted(map(str, data))[:10]}", kind=PROTOCOL)
        choice = choices[0]
        msg = choice.get("message") or {}
        parts: list[Any] = []
        reasoning = msg.get("reasoning_content") or msg.get("reasoning")
        if reasoning and isinstance(reasoning, str):
            parts.append(ThinkingPart(reasoning))
        content = msg.get("content")
        if content and isinstance(content, str):
            parts.append(TextPart(content))
        for tc in msg.get("tool_calls") or ():
            fn = tc.get("function") or {}
            parts.append(tool_call_part(tc.get("id") or _new_call_id(), fn.get("name") or "", fn.get("arguments")))
        stop = FINISH_REASONS.get(choice.get("finish_reason") or "", StopReason.END_TURN)
        message = Message(Role.ASSISTANT, tuple(parts))
        if stop is StopReason.END_TURN and message.tool_calls:
            stop = StopReason.TOOL_CALL
        return ModelResponse(message, stop, _usage(data.get("usage")), data.get("model"))


__all__ = ["OpenAIClient", "OpenAIStreamParser", "message_to_openai"]
