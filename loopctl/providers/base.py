"""The model-client contract, the stream events, and the stream accumulator.

Knows messages, never the loop. A client's ``stream()`` yields the events
below in this order: ``MessageStart``, then per part ``PartStart`` ->
``PartDelta``* -> ``PartStop``, then ``MessageDelta`` and ``MessageStop``;
``Ping`` may come anywhere. A stream that ends without ``MessageStop`` was
truncated and is never taken as a complete reply. The stream handler adds
``StreamAttemptReset`` (a new attempt starts) and ``StreamRescue`` (a
complete reply from the non-streaming rescue, or the reply of a
non-streaming call) and ``RetryWait`` (a backoff is about to start).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from typing import Any, Optional, Protocol, Union, runtime_checkable

import attrs

from loopctl.errors import ModelError
from loopctl.messages import (
    Message,
    ModelRequest,
    ModelResponse,
    Part,
    Role,
    StopReason,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    Usage,
)
from loopctl.providers.boundary import (
    MAX_JSON_DEPTH,
    NOT_FINITE,
    TOO_DEEP,
    json_depth_exceeds,
    parsed_value_problem,
)
from loopctl.text import NotJSONNumber, loads_strict, masked_head

# Part kinds of ``PartStart``; delta kinds add "tool_input" and "signature".
TEXT = "text"
THINKING = "thinking"
TOOL_CALL = "tool_call"
TOOL_INPUT = "tool_input"
SIGNATURE = "signature"


@attrs.frozen
class MessageStart:
    """A reply begins; ``model`` is the model that serves it when known."""

    model: Optional[str] = None
    usage: Optional[Usage] = None


@attrs.frozen
class PartStart:
    """A part opens at ``index``; ``kind`` is "text", "thinking" or "tool_call"."""

    index: int
    kind: str
    call_id: Optional[str] = None
    name: Optional[str] = None
    invalid: Optional[str] = None  # a tool call already known to be unusable, and why


@attrs.frozen
class PartDelta:
    """A fragment for the part at ``index``.

    ``kind`` is "text", "thinking", "tool_input" (raw JSON text of the
    arguments) or "signature" (a thinking block's replay signature).
    """

    index: int
    kind: str
    text: str


@attrs.frozen
class PartStop:
    """The part at ``index`` closed (None: the oldest open part)."""

    index: Optional[int] = None


@attrs.frozen
class MessageDelta:
    """Stop reason and/or usage for the reply."""

    stop_reason: Optional[StopReason] = None
    usage: Optional[Usage] = None


@attrs.frozen
class MessageStop:
    """The reply is complete."""


@attrs.frozen
class Ping:
    """Keep-alive; carries nothing."""


@attrs.frozen
class StreamAttemptReset:
    """The stream handler starts attempt ``attempt`` (>= 1): drop partial output."""

    attempt: int


@attrs.frozen
class RetryWait:
    """The stream handler waits ``wait_s`` seconds before retrying a failed call.

    ``cause`` says what failed in a few words ("rate limited (429)",
    "connection refused at http://127.0.0.1:1/v1"); ``attempt`` is the try
    about to start (2 for the first retry) of at most ``max_attempts``.
    """

    cause: str
    wait_s: float
    attempt: int
    max_attempts: int


@attrs.frozen
class StreamRescue:
    """A complete reply obtained by the non-streaming rescue."""

    response: ModelResponse


StreamEvent = Union[MessageStart, PartStart, PartDelta, PartStop, MessageDelta, MessageStop, Ping]
HandlerEvent = Union[StreamEvent, StreamAttemptReset, StreamRescue, RetryWait]


@runtime_checkable
class ModelStream(Protocol):
    """An iterable of stream events that can be closed from any thread."""

    def __iter__(self) -> Iterator[StreamEvent]: ...

    def close(self) -> None:
        """Stop the stream (idempotent, any thread): a blocked read returns."""
        ...


@runtime_checkable
class ModelClient(Protocol):
    """What the loop needs from a model client.

    ``set_model(name) -> bool`` is optional; clients without it cannot be
    switched. ``output_modes`` (a tuple of ``"native"``, ``"tool"``,
    ``"prompt"``) is optional too: the ways of asking for a typed answer the
    client's server follows, the first being the one a run uses unless
    ``RunConfig.output_mode`` says otherwise; a client without it gets
    ``"tool"``.
    """

    @property
    def model(self) -> str:
        """The model requests go to (a request's ``options.model`` may override it)."""
        ...

    def complete(self, request: ModelRequest) -> ModelResponse:
        """One whole reply (a non-streaming call); failures are ``LoopError``s."""
        ...

    def stream(self, request: ModelRequest) -> ModelStream:
        """The reply as stream events, read as they arrive; failures are ``LoopError``s."""
        ...


class IteratorStream:
    """A ``ModelStream`` over any iterator of events (close stops it)."""

    def __init__(self, events: Iterator[StreamEvent], on_close: Optional[Callable[[], None]] = None) -> None:
        self._events = events
        self._closed = False
        self._on_close = on_close

    def __iter__(self) -> Iterator[StreamEvent]:
        for ev in self._events:
            if self._closed:
                return
            yield ev

    def close(self) -> None:
        """Stop yielding events (idempotent) and call ``on_close``."""
        self._closed = True
        if self._on_close is not None:
            self._on_close()


def response_events(response: ModelResponse, chunk: int = 8) -> Iterator[StreamEvent]:
    """The stream events that carry ``response`` (text split into small deltas)."""
    yield MessageStart(model=response.model)
    for i, part in enumerate(response.message.parts):
        if isinstance(part, TextPart):
            yield PartStart(i, TEXT)
            t = part.text
            for k in range(0, len(t), chunk):
                yield PartDelta(i, TEXT, t[k : k + chunk])
        elif isinstance(part, ThinkingPart):
            yield PartStart(i, THINKING)
            t = part.text
            for k in range(0, len(t), chunk):
                yield PartDelta(i, THINKING, t[k : k + chunk])
            if part.signature:
                yield PartDelta(i, SIGNATURE, part.signature)
        elif isinstance(part, ToolCallPart):
            yield PartStart(i, TOOL_CALL, call_id=part.id, name=part.name, invalid=part.invalid)
            yield PartDelta(i, TOOL_INPUT, json.dumps(dict(part.input)))
        else:
            continue
        yield PartStop(i)
    yield MessageDelta(stop_reason=response.stop_reason, usage=response.usage)
    yield MessageStop()


_SHOWN = 120  # characters of offending arguments quoted back to the model


#: A token count above this is no real count (and past it an int no longer converts to a float exactly).
MAX_TOKEN_COUNT = 2**53


def token_count(value: object) -> int:
    """A provider's token count as an int >= 0; anything else (text, negative, NaN, absurdly large) counts 0.

    Usage is informational: a server's odd value must not end a run.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    if isinstance(value, float) and not math.isfinite(value):
        return 0
    count = int(value)
    return count if 0 <= count <= MAX_TOKEN_COUNT else 0


def _quote(text: str) -> str:
    shown = masked_head(text, _SHOWN)  # masked, then cut: a key at the cut is never half shown
    more = f" ... ({len(text)} characters)" if len(text) > _SHOWN else ""
    return f"{shown!r}{more}"


def tool_call_part(call_id: str, name: str, arguments: object) -> ToolCallPart:
    """A well-formed ``ToolCallPart`` from a provider's tool call.

    ``arguments`` is the JSON text the model sent (or an already parsed
    value). Arguments that are not one JSON object (malformed, a list, nested
    deeper than ``MAX_JSON_DEPTH``) or a missing name give a part with
    ``input == {}`` and ``invalid`` saying what is wrong (the offending text
    masked, then cut short): a soft error for the model to fix,
    never an exception.
    """
    name = name if isinstance(name, str) else ""
    problem: Optional[str] = None
    data: Any = {}
    if isinstance(arguments, str):
        if arguments.strip():
            if json_depth_exceeds(arguments):
                problem = f"arguments for tool {name!r} nest deeper than {MAX_JSON_DEPTH} levels"
            else:
                try:
                    data = loads_strict(arguments)
                except NotJSONNumber as exc:
                    problem = f"invalid JSON arguments for tool {name!r} ({exc}): {_quote(arguments)}"
                except (ValueError, RecursionError):
                    problem = f"invalid JSON arguments for tool {name!r}: {_quote(arguments)}"
            if problem is None and not isinstance(data, dict):
                problem = f"arguments for tool {name!r} are not a JSON object: {_quote(arguments)}"
    elif arguments is not None:
        data = arguments
        if not isinstance(data, dict):
            problem = f"arguments for tool {name!r} are not a JSON object: {_quote(repr(arguments))}"
        else:
            unfit = parsed_value_problem(data)
            if unfit == TOO_DEEP:
                problem = f"arguments for tool {name!r} nest deeper than {MAX_JSON_DEPTH} levels"
            elif unfit == NOT_FINITE:
                problem = f"invalid JSON arguments for tool {name!r} (NaN and infinities are not JSON numbers)"
    if not name.strip():
        problem = "the tool call has no tool name" + (f" ({problem})" if problem else "")
    if problem is not None:
        return ToolCallPart(call_id, name, {}, f"{problem}; send a call with a tool name and a JSON object")
    return ToolCallPart(call_id, name, data)


@attrs.define
class _Slot:
    kind: str
    call_id: Optional[str] = None
    name: Optional[str] = None
    chunks: list[str] = attrs.field(factory=list)
    signature: Optional[str] = None
    invalid: Optional[str] = None
    part: Optional[Part] = None
    closed: bool = False


class StreamAccumulator:
    """Assembles stream events into a ``ModelResponse``.

    Slots are fixed at ``PartStart`` and routed by (kind, index); tool JSON is
    parsed once when its part closes (empty -> ``{}``; invalid JSON, a
    non-object or no name -> a part marked ``invalid``, see
    ``tool_call_part``). Thinking stays out of the assembled text.
    """

    __slots__ = ("_by_index", "_slots", "finished", "model", "stop_reason", "usage")

    def __init__(self) -> None:
        # A tuple grown per part (a reply has a few): the empty one is shared,
        # so a call still waiting for its first event holds no list.
        self._slots: tuple[_Slot, ...] = ()
        self._by_index: dict[int, _Slot] = {}
        self.stop_reason: Optional[StopReason] = None
        self.usage: Optional[Usage] = None
        self.model: Optional[str] = None
        self.finished = False

    def feed(self, event: StreamEvent) -> None:
        """Take one event (mutates)."""
        if isinstance(event, PartDelta):
            slot = self._by_index.get(event.index)
            if slot is None or slot.closed:
                # A delta without a start opens an implicit part of its kind.
                kind = TOOL_CALL if event.kind == TOOL_INPUT else event.kind
                if kind == SIGNATURE:
                    return
                slot = self._open(event.index, kind)
            if event.kind == SIGNATURE:
                slot.signature = (slot.signature or "") + event.text
            else:
                slot.chunks.append(event.text)
        elif isinstance(event, PartStart):
            slot = self._open(event.index, event.kind)
            slot.call_id = event.call_id
            slot.name = event.name
            slot.invalid = event.invalid
        elif isinstance(event, PartStop):
            idx = event.index
            found = (
                self._by_index.get(idx)
                if idx is not None
                else next((s for s in self._slots if not s.closed), None)
            )
            if found is not None and not found.closed:
                self._close(found)
        elif isinstance(event, MessageDelta):
            if event.stop_reason is not None:
                self.stop_reason = event.stop_reason
            if event.usage is not None:
                self.usage = _merge_usage(self.usage, event.usage)
        elif isinstance(event, MessageStart):
            if event.model:
                self.model = event.model
            if event.usage is not None:
                self.usage = _merge_usage(self.usage, event.usage)
        elif isinstance(event, MessageStop):
            self.finished = True

    def _open(self, index: int, kind: str) -> _Slot:
        slot = _Slot(kind)
        self._slots += (slot,)
        self._by_index[index] = slot
        return slot

    def _close(self, slot: _Slot) -> None:
        slot.closed = True
        text = "".join(slot.chunks)
        if slot.kind == TOOL_CALL:
            # A bad call is kept, marked invalid: the model gets a soft error for it.
            call_id = slot.call_id or f"call_{id(slot):x}"
            if slot.invalid is not None:
                slot.part = ToolCallPart(call_id, slot.name or "", {}, slot.invalid)
            else:
                slot.part = tool_call_part(call_id, slot.name or "", text)
        elif slot.kind == THINKING:
            slot.part = ThinkingPart(text, slot.signature)
        elif text:
            slot.part = TextPart(text)

    def build(self) -> ModelResponse:
        """The assembled reply.

        Raises:
            ModelError: (retryable) when the stream ended without ``MessageStop``.
        """
        if not self.finished:
            raise ModelError("stream truncated: it ended without its terminal event", retryable=True)
        for slot in self._slots:
            if not slot.closed:
                self._close(slot)
        parts = tuple(s.part for s in self._slots if s.part is not None)
        msg = Message(Role.ASSISTANT, parts)
        stop = self.stop_reason or StopReason.END_TURN
        if stop is StopReason.END_TURN and msg.tool_calls:
            stop = StopReason.TOOL_CALL
        return ModelResponse(msg, stop, self.usage, self.model)


def _merge_usage(old: Optional[Usage], new: Usage) -> Optional[Usage]:
    if old is None:
        merged = new
    else:
        merged = Usage(
            new.input_tokens or old.input_tokens, new.output_tokens or old.output_tokens
        )
    return None if merged.input_tokens == 0 and merged.output_tokens == 0 else merged


__all__ = [
    "token_count",
    "IteratorStream",
    "MessageDelta",
    "MessageStart",
    "MessageStop",
    "ModelClient",
    "ModelStream",
    "PartDelta",
    "PartStart",
    "PartStop",
    "Ping",
    "RetryWait",
    "StreamAccumulator",
    "StreamAttemptReset",
    "StreamEvent",
    "StreamRescue",
    "response_events",
    "tool_call_part",
]
