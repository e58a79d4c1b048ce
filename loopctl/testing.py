"""Offline test doubles users can import: ``ScriptedClient`` and script helpers.

A script is a list of items, one per model call: a ``ModelResponse``,
``reply(...)``, ``call(...)``, ``calls(...)``, an exception instance (that
call fails with it), or a callable ``f(request) -> ModelResponse`` (it may
block on an Event to gate a test). Library code never imports this module.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Callable, Optional, Union

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
    Usage,
)
from loopctl.providers.base import IteratorStream, StreamEvent, response_events

ScriptItem = Union[ModelResponse, BaseException, Callable[[ModelRequest], ModelResponse]]

_ids = itertools.count(1)


def reply(text: str, thinking: Optional[str] = None, usage: Optional[Usage] = None) -> ModelResponse:
    """A final answer (no tool calls), optionally with reasoning and usage."""
    parts: list[Any] = []
    if thinking is not None:
        parts.append(ThinkingPart(thinking))
    if text:
        parts.append(TextPart(text))
    return ModelResponse(Message(Role.ASSISTANT, tuple(parts)), StopReason.END_TURN, usage)


def call(name: str, /, **input: object) -> ModelResponse:
    """A reply asking for one tool call ``name(**input)``."""
    return calls((name, input))


def calls(*items: tuple[str, dict[str, Any]], text: str = "") -> ModelResponse:
    """A reply asking for several tool calls, in order: ``calls(("a", {...}), ...)``."""
    parts = [ToolCallPart(f"call_{next(_ids)}", name, dict(inp)) for name, inp in items]
    return ModelResponse(Message.assistant(text, parts), StopReason.TOOL_CALL)


class ScriptedClient:
    """An offline model client that plays a script, one item per call.

    Args:
        script: the items, in call order.
        model: the name reported as the serving model.
        chunk: characters per streamed text delta.

    Attributes:
        requests: every ``ModelRequest`` received, in order.
        output_modes: typed-answer modes, preferred first (``"native"``: a
            scripted ``reply()`` with JSON text is the answer; in ``"tool"``
            mode script ``call("final_answer", ...)``).
    """

    output_modes: tuple[str, ...] = ("native", "tool", "prompt")

    def __init__(self, script: Sequence[ScriptItem] = (), model: str = "scripted", chunk: int = 4) -> None:
        self._script = list(script)
        self._model = model
        self._chunk = chunk
        self._lock = threading.Lock()
        self._next = 0
        self.requests: list[ModelRequest] = []

    @property
    def model(self) -> str:
        """The model name."""
        return self._model

    def set_model(self, name: str) -> bool:
        """Switch the reported model name."""
        self._model = name
        return True

    def extend(self, items: Sequence[ScriptItem]) -> None:
        """Append items to the script."""
        with self._lock:
            self._script.extend(items)

    @property
    def remaining(self) -> int:
        """Items not played yet."""
        return len(self._script) - self._next

    def _take(self, request: ModelRequest) -> ModelResponse:
        with self._lock:
            self.requests.append(request)
            n = len(self.requests)
            if self._next >= len(self._script):
                raise ModelError(
                    f"ScriptedClient ran past its script: request {n} but only "
                    f"{len(self._script)} items were scripted"
                )
            item = self._script[self._next]
            self._next += 1
            index = self._next
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, ModelResponse):
            resp = item
        elif callable(item):
            resp = item(request)
            if not isinstance(resp, ModelResponse):
                raise ModelError(
                    f"script item {index} (a callable) returned {type(resp).__name__}, "
                    f"not a ModelResponse: {resp!r:.80}"
                )
        else:
            raise ModelError(f"script item {index} is not a reply, exception or callable: {item!r:.80}")
        if resp.model is None:
            # A routed request (fallback) is served by the model it asked for.
            opts = request.options
            served = opts.model if opts is not None and opts.model else self._model
            resp = ModelResponse(resp.message, resp.stop_reason, resp.usage, served)
        return resp

    def complete(self, request: ModelRequest) -> ModelResponse:
        """Play the next script item."""
        return self._take(request)

    def stream(self, request: ModelRequest) -> IteratorStream:
        """Play the next item as a stream of small deltas."""
        return IteratorStream(self._events(request))

    def _events(self, request: ModelRequest) -> Iterator[StreamEvent]:
        # A generator method, not a closure: thousands of runs may wait in it at once.
        yield from response_events(self._take(request), self._chunk)


__all__ = ["ScriptedClient", "call", "calls", "reply"]
