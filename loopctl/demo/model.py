"""OfflineModel: the embedded demo model (no key, no network, deterministic).

It is a real ``ModelClient``: ``complete(request)`` and ``stream(request)``
read only the request they are given — the conversation, the tool schemas
— and never keep state between calls, so the same request always gets the
same reply. It solves small arithmetic ("What is 12 + 30?", "multiply 6 by
7", "(2+3)*4") and country facts ("the population of France plus the
population of Spain") by calling the ``add``, ``multiply`` and ``lookup``
tools it finds advertised, independent calls of one step together (so they
run in parallel). Each reply streams a sentence of reasoning before its
tool calls; user messages that arrived after its previous reply (steering)
are acknowledged in the next one ("Noted: ..."); a guidance line that is
itself a task replaces the task. Streaming yields small text deltas; a
``delay`` waits between them on an ``Event`` that ``close()`` sets, so a
cancel stops it at once. Library code, so it never imports
``loopctl.testing``. The reasoning (parsing a task, reading the
conversation, planning a reply) lives in ``offline_reasoning.py``; its
``Parser``, ``fmt``, ``plan_reply`` and ``read_conversation`` are
re-exported here.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from loopctl.checks import integer
from loopctl.demo.arithmetic import Parser, Plan, fmt, plan_reply, read_conversation
from loopctl.errors import ConfigError
from loopctl.messages import (
    Message,
    ModelRequest,
    ModelResponse,
    RequestOptions,
    Role,
    StopReason,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    Usage,
)
from loopctl.output import FINAL_TOOL
from loopctl.providers.base import (
    TEXT,
    IteratorStream,
    PartDelta,
    StreamEvent,
    response_events,
)
from loopctl.timeouts import required_seconds

_TOOL_CHOICES = (None, "auto", "none")


# -- the client ----------------------------------------------------------------


def _count(text: str) -> int:
    return (len(text) + 3) // 4


def _request_chars(request: ModelRequest) -> int:
    n = len(request.system or "")
    for m in request.messages:
        for p in m.parts:
            if isinstance(p, ToolResultPart):
                n += len(p.output) + 16
            elif isinstance(p, ToolCallPart):
                n += len(p.name) + len(json.dumps(dict(p.input))) + 16
            else:
                n += len(getattr(p, "text", ""))
        n += 4
    for t in request.tools:
        n += len(json.dumps(t.to_dict()))
    return n


class OfflineModel:
    """The embedded offline demo model: a deterministic ``ModelClient``.

    Args:
        model: the name it reports.
        delay: seconds to wait between streamed text deltas (0: no waiting);
            the wait ends at once when the stream is closed (cancel).
        chunk: characters per streamed text delta.

    Attributes:
        output_modes: typed-answer modes, preferred first: it fills a
            ``json_schema`` ``response_format`` (or the ``final_answer``
            tool's input) from its computed answer, its number into numeric
            fields and its sentence into text fields.
    """

    output_modes: tuple[str, ...] = ("native", "tool")

    def __init__(self, model: str = "loopctl-offline", *, delay: float = 0.0, chunk: int = 4) -> None:
        self._model = model
        self.delay = required_seconds(delay, "OfflineModel.delay", zero=True)
        self.chunk = integer(chunk, "OfflineModel.chunk", 1)

    @property
    def model(self) -> str:
        """The model name it reports."""
        return self._model

    def complete(self, request: ModelRequest) -> ModelResponse:
        """The whole reply at once (no waiting).

        Raises:
            ConfigError: an option it cannot honour (``response_format``,
                ``extra_body``, a ``tool_choice`` other than auto/none).
        """
        opts = request.options
        if opts is not None:
            _check_options(opts, request)
        plan = plan_reply(request)
        if opts is not None and opts.tool_choice == "none" and plan.calls:
            plan = Plan(plan.text.rstrip(".") + ", but I was asked not to use tools.")
        if opts is not None and not plan.calls:
            plan = _typed_answer(plan, opts, request)
        base = _conversation_hash(request) if plan.calls else None
        calls = [
            ToolCallPart(_call_id(base, k, name, inp), name, inp)
            for k, (name, inp) in enumerate(plan.calls)
        ]
        text = plan.text
        out = _count(text) + sum(_count(c.name + json.dumps(dict(c.input))) for c in calls)
        stop = StopReason.TOOL_CALL if calls else StopReason.END_TURN
        if opts is not None and opts.max_tokens is not None and out > opts.max_tokens:
            text, calls, out, stop = text[: opts.max_tokens * 4], [], opts.max_tokens, StopReason.MAX_TOKENS
        parts: list[Any] = [TextPart(text)] if text else []
        parts.extend(calls)
        usage = Usage(_count("x" * _request_chars(request)), max(out, 1))
        model = (opts.model if opts is not None and opts.model else None) or self._model
        return ModelResponse(Message(Role.ASSISTANT, tuple(parts)), stop, usage, model)

    def stream(self, request: ModelRequest) -> IteratorStream:
        """The reply as stream events, text in small deltas (``delay`` apart)."""
        response = self.complete(request)
        stop = threading.Event()
        delay = self.delay

        def events() -> Iterator[StreamEvent]:
            for ev in response_events(response, self.chunk):
                if stop.is_set():
                    return
                yield ev
                # The pause follows each text delta, so the first one is immediate.
                if delay > 0 and type(ev) is PartDelta and ev.kind == TEXT and stop.wait(delay):
                    return

        return IteratorStream(events(), on_close=stop.set)

    def __repr__(self) -> str:
        return f"OfflineModel(model={self._model!r}, delay={self.delay})"


def _check_options(opts: RequestOptions, request: ModelRequest) -> None:
    fmt = opts.response_format
    if fmt is not None and not isinstance(_json_schema(fmt), Mapping):
        raise ConfigError("OfflineModel honours only a json_schema response_format")
    if opts.extra_body is not None:
        raise ConfigError("OfflineModel cannot honour extra_body")
    final = opts.tool_choice == "required" and any(t.name == FINAL_TOOL for t in request.tools)
    if opts.tool_choice not in _TOOL_CHOICES and not final:
        raise ConfigError(f"OfflineModel cannot honour tool_choice={opts.tool_choice!r}")


# -- typed answers: the computed answer poured into the asked-for shape ---------------

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _json_schema(fmt: Mapping[str, Any]) -> object:
    # The OpenAI shape or a bare JSON Schema; "json_object"/"text" name no shape to fill.
    inner = fmt.get("json_schema")
    if fmt.get("type") == "json_schema" and isinstance(inner, Mapping):
        return inner.get("schema")
    return None if fmt.get("type") in ("json_object", "text") else fmt


def _typed_answer(plan: Plan, opts: RequestOptions, request: ModelRequest) -> Plan:
    """A final reply as JSON text (``response_format``) or a ``final_answer`` call (tool mode)."""
    if opts.response_format is not None:
        return Plan(json.dumps(_fill(_json_schema(opts.response_format), plan.text)))
    if opts.tool_choice == "required":
        schema = next(t.input_schema for t in request.tools if t.name == FINAL_TOOL)
        return Plan("", ((FINAL_TOOL, _fill(schema, plan.text)),))
    return plan


def _fill(schema: object, text: str) -> Any:
    """A value of ``schema`` from the answer's sentence: numbers get its last number, strings the sentence."""
    if not isinstance(schema, Mapping):
        return text
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    if schema.get("anyOf"):
        return _fill(schema["anyOf"][0], text)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "object":
        return {k: _fill(sub, text) for k, sub in (schema.get("properties") or {}).items()}
    if kind == "array":
        return [_fill(schema.get("items"), text)]
    if kind in ("integer", "number"):
        found = _NUMBER.findall(text)
        number = float(found[-1].replace(",", "")) if found else 0.0
        return int(number) if kind == "integer" or number.is_integer() else number
    if kind == "boolean":
        return True
    return text


def _conversation_hash(request: ModelRequest) -> object:
    h = hashlib.sha1()
    for m in request.messages:
        h.update(json.dumps(m.to_dict(), sort_keys=True).encode())
    return h


def _call_id(base: Any, k: int, name: str, input: Mapping[str, Any]) -> str:
    # Deterministic for a conversation, distinct across its turns and calls.
    h = base.copy()
    h.update(f"{k}:{name}:{json.dumps(dict(input), sort_keys=True)}".encode())
    return f"call_{h.hexdigest()[:12]}"


__all__ = ["OfflineModel", "Parser", "fmt", "plan_reply", "read_conversation"]
