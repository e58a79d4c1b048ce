"""One model call: transient extras, request assembly, the call itself.

The request is ``[contributors..., memory?, history..., pending...]`` plus the
system prompt and tool schemas, built with one copy. The user's input
reaches the model only through pending. Blocking work (the provider call,
each stream read) and user code (contributors, memory look-ups, the text
streamer) run unfenced, so a cancel can take the run over; the stream is
closed from the cancelling thread so a blocked read returns. Everything
arrives as an argument: the loop's parts, the machine, the run's fence and
events.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Optional

from loopctl.context.memory import MEMORY_PREFIX, format_memory, memory_query
from loopctl.errors import Cancelled, LoopError, ModelError
from loopctl.messages import Message, ModelRequest, ModelResponse, ToolResultPart
from loopctl.observers import RetryScheduled
from loopctl.providers.base import (
    PartDelta,
    PartStart,
    RetryWait,
    StreamAccumulator,
    StreamAttemptReset,
    StreamRescue,
)

if TYPE_CHECKING:
    from loopctl.driver.emission import RunEvents
    from loopctl.driver.handle import RunContext
    from loopctl.driver.parts import LoopParts
    from loopctl.machine import LoopMachine

log = logging.getLogger("loopctl")


def turn_query(run_input: str, turn: int, conversation: Sequence[Message]) -> str:
    """The display text a turn answers: the input on turn 0, else the last message's."""
    if turn == 0 or not conversation:
        return run_input
    last = conversation[-1]
    text = last.text
    if text:
        return text
    outs = [p.output for p in last.parts if type(p) is ToolResultPart]
    return "\n".join(outs)


def gather_transients(
    parts: LoopParts, machine: LoopMachine, rc: RunContext, turn: int, query: str, run_input: str, top_k: int
) -> list[Message]:
    """Contributor messages in registration order, then one memory message.

    Contributors and the memory store are user code that may block (a
    database, a network index): they run unfenced, on copies of what they
    read, so a cancel can take the run over meanwhile.
    """
    contributors = tuple(parts.contributors)
    memory = parts.memory
    ctx = None
    if contributors:
        from loopctl.context.contributors import ContributorContext

        ctx = ContributorContext(turn, machine.full_history(), run_input)
    out: list[Message] = []
    with rc.unfenced():
        for contributor in contributors:
            try:
                msg = contributor.contribute(ctx)
            except Exception:
                log.exception("contributor %s raised; skipped", type(contributor).__name__)
                continue
            if msg is not None:
                out.append(msg)
        if memory is not None and top_k > 0:
            try:
                entries = memory.retrieve(memory_query(query), top_k)
            except Exception:
                log.exception("memory retrieve failed; turn goes on without memory")
                entries = []
            fenced = format_memory(entries)  # one entry per line, inside a fence no entry can close
            if fenced is not None:
                out.append(Message.user(fenced))
    return out


def build_request(
    parts: LoopParts, machine: LoopMachine, transients: Sequence[Message], options: Any
) -> ModelRequest:
    """The request for this turn (one copy of the conversation)."""
    messages = machine.snapshot_conversation(transients)
    schemas = parts.tools.schemas()
    return ModelRequest(messages, parts.session_config.system_prompt, schemas, options)


def call_model(
    parts: LoopParts,
    rc: RunContext,
    events: RunEvents,
    turn: int,
    request: ModelRequest,
    answer_tool: Optional[str] = None,
) -> ModelResponse:
    """Make the model call (streaming or not), cancel-aware.

    ``answer_tool`` names the final-answer tool of a typed run in tool mode:
    its input's deltas are the answer's text, so observers get them as
    ``on_text_delta`` too.

    Raises:
        Cancelled: the signal fired before or during the call.
        LoopError: the call failed (foreign exceptions become ``ModelError``).
    """
    cancel = rc.cancel
    if cancel.is_cancelled():
        raise Cancelled(cancel.reason)
    if parts.turn_mode == "non_streaming":
        response = _complete_turn(parts, rc, events, turn, request)
    else:
        response = _stream_turn(parts, rc, events, turn, request, answer_tool)
    if cancel.is_cancelled():
        raise Cancelled(cancel.reason)
    return response


def _next_event(rc: RunContext, it: Iterator[Any]) -> Any:
    """The call's next event (None at its end), read unfenced; foreign errors become ``ModelError``."""
    try:
        with rc.unfenced():
            return next(it, None)
    except LoopError:
        raise
    except Exception as exc:
        if rc.cancel.is_cancelled():
            raise Cancelled(rc.cancel.reason) from exc
        raise ModelError(f"stream failed: {type(exc).__name__}: {exc}") from exc


def _complete_turn(parts: LoopParts, rc: RunContext, em: RunEvents, turn: int, request: ModelRequest) -> ModelResponse:
    """A non-streaming turn: the same retries, one whole reply.

    The first attempt is made directly (most calls need no retry); a
    failure goes on through the handler's retry events.
    """
    call = parts.stream_handler.complete_turn(parts.client, request, rc.cancel)
    cancel = rc.cancel
    rc.model_call = call  # before the call starts: a cancel from now on closes it
    try:
        try:
            with rc.unfenced():
                response: ModelResponse = call.first_reply()
            if cancel.is_cancelled():
                raise Cancelled(cancel.reason)
            return response
        except LoopError as exc:
            if isinstance(exc, Cancelled):
                raise
            failure = exc
        it = iter(call.recover(failure))
        while True:
            ev = _next_event(rc, it)
            if ev is None:
                break
            if type(ev) is StreamRescue:
                if cancel.is_cancelled():
                    raise Cancelled(cancel.reason)
                reply: ModelResponse = ev.response  # the reply is the call's last event
                return reply
            if type(ev) is RetryWait:
                em.emit(_retry_event(em, parts, turn, ev))
            elif type(ev) is StreamAttemptReset:
                em.attempt_reset(turn, ev.attempt)
    finally:
        rc.model_call = None
    raise Cancelled(cancel.reason)  # ended without a reply: only a close (cancel) does that


def _retry_event(em: RunEvents, parts: LoopParts, turn: int, ev: RetryWait) -> RetryScheduled:
    """The ``RetryScheduled`` event for a wait before the model call's next try."""
    return RetryScheduled(
        em.session_id, em.run_id, turn, parts.model_name(), ev.cause, ev.wait_s, ev.attempt, ev.max_attempts,
        parts.provider_name(),
    )


def _sink(rc: RunContext, streamer: Callable[[str], None]) -> Callable[[str], None]:
    """The text streamer as the events' text sink: called unfenced, its failure contained."""

    def sink(piece: str) -> None:
        with rc.unfenced():  # user code: never holds a cancel
            try:
                streamer(piece)
            except Exception:
                log.exception("text streamer raised; ignored")

    return sink


def _stream_turn(
    parts: LoopParts,
    rc: RunContext,
    em: RunEvents,
    turn: int,
    request: ModelRequest,
    answer_tool: Optional[str] = None,
) -> ModelResponse:
    """A streaming turn: deltas to observers (and the text streamer) as they come."""
    streamer = parts.text_streamer
    events = parts.stream_handler.stream_turn(parts.client, request, rc.cancel)
    acc = StreamAccumulator()
    rescued: Optional[ModelResponse] = None
    tool_slots: dict[int, tuple[str, str]] = {}
    # The streamer is an outlet too: it gets the reply's pieces as the events
    # do, through the same mask (a key split across pieces is masked whole).
    em.text_sink = None if streamer is None else _sink(rc, streamer)
    it = iter(events)
    rc.model_call = events  # before the call starts: a cancel from now on closes it
    try:
        while True:
            ev = _next_event(rc, it)
            if ev is None:
                break
            if isinstance(ev, PartDelta):
                kind = ev.kind
                if kind == "text":
                    em.text_delta(turn, ev.text)
                elif kind == "thinking":
                    em.thinking_delta(turn, ev.text)
                elif kind == "tool_input":
                    cid, name = tool_slots.get(ev.index, ("", ""))
                    em.tool_input_delta(turn, cid, name, ev.text)
                    if answer_tool is not None and name == answer_tool:
                        em.text_delta(turn, ev.text, answer=True)  # the typed answer, as it comes
                acc.feed(ev)
            elif isinstance(ev, PartStart):
                if ev.kind == "tool_call":
                    tool_slots[ev.index] = (ev.call_id or "", ev.name or "")
                acc.feed(ev)
            elif isinstance(ev, StreamAttemptReset):
                acc = StreamAccumulator()
                tool_slots.clear()
                em.attempt_reset(turn, ev.attempt)
            elif isinstance(ev, StreamRescue):
                rescued = ev.response
            elif isinstance(ev, RetryWait):
                em.emit(_retry_event(em, parts, turn, ev))
            else:
                acc.feed(ev)
        if not rc.cancel.is_cancelled():
            em.flush_deltas()  # on an error the phase's close lets go of them instead
    finally:
        rc.model_call = None
        em.text_sink = None
    if rc.cancel.is_cancelled():
        raise Cancelled(rc.cancel.reason)
    if rescued is not None:
        return rescued
    return acc.build()


__all__ = [
    "MEMORY_PREFIX",
    "build_request",
    "call_model",
    "gather_transients",
    "turn_query",
]

