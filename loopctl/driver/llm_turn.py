"""One model turn: transient extras, request assembly, the call, the reply recorded.

The request is ``[contributors..., memory?, history..., pending...]`` plus the
system prompt and tool schemas, built with one copy. The user's input
reaches the model only through pending. Blocking work (the provider call,
each stream read) and user code (contributors, memory look-ups, the text
streamer) run unfenced, so a cancel can take the run over; the stream is
closed from the cancelling thread so a blocked read returns. ``ModelTurn``
holds these as methods of the run itself (``RunDriver`` extends it): the
loop's parts, the machine, the run's fence and events are the run's own.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Optional

from loopctl.context.contributors import ContributorContext
from loopctl.context.memory import MEMORY_PREFIX, format_memory, memory_query
from loopctl.driver.admission import admit_message
from loopctl.driver.handle import RunContext
from loopctl.driver.phases import Phase
from loopctl.driver.run_state import RunState
from loopctl.errors import (
    Cancelled,
    ContextOverflow,
    LoopDetected,
    LoopError,
    ModelError,
    RateLimitEscalation,
    UserInputRequired,
)
from loopctl.events import (
    ConvergenceDetected,
    Fallback,
    ModelSwitched,
    Response,
    RetryScheduled,
    StreamFailure,
    StreamSuccess,
    TurnStart,
)
from loopctl.messages import Message, ModelRequest, ModelResponse, RequestOptions, ToolResultPart
from loopctl.providers.base import (
    PartDelta,
    PartStart,
    RetryWait,
    StreamAccumulator,
    StreamAttemptReset,
    StreamRescue,
    response_events,
)
from loopctl.records import Turn

log = logging.getLogger("loopctl")

#: A rescued reply's text goes out as one delta per part (the chunk size for ``response_events``).
WHOLE_PART = 1 << 62


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


class ModelTurn(RunState):
    """The run's model turn: extras, request, the call (failures reported), the reply recorded."""

    __slots__ = ()

    def gather_transients(self, turn: int, query: str) -> list[Message]:
        """Contributor messages in registration order, then one memory message.

        Contributors and the memory store are user code that may block (a
        database, a network index): they run unfenced, on copies of what they
        read, so a cancel can take the run over meanwhile.
        """
        parts = self.parts
        contributors = parts.contributors
        memory = parts.memory
        top_k = self.config.memory_top_k
        ctx = ContributorContext(turn, self.machine.full_history(), self.run_input) if contributors else None
        out: list[Message] = []
        with self.rc.unfenced():
            if ctx is not None:  # there are contributors
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

    def build_request(self, transients: Sequence[Message], options: Optional[RequestOptions]) -> ModelRequest:
        """The request for this turn (one copy of the conversation)."""
        parts = self.parts
        messages = self.machine.snapshot_conversation(transients)
        return ModelRequest(messages, parts.session_config.system_prompt, parts.tools.schemas(), options)

    def ask_model(self, turn: int, request: ModelRequest) -> ModelResponse:
        """The model call; a failure is reported (fallback, ``on_stream_failure``) and raised."""
        parts = self.parts
        rc = self.rc
        em = self.events
        try:
            return self.call_model(turn, request)
        except Cancelled:
            raise
        except LoopError as exc:
            if rc.cancel.is_cancelled():  # failed because it was cancelled: not the model's fault
                raise Cancelled(rc.cancel.reason) from exc
            if parts.fallback is not None and not isinstance(exc, ContextOverflow):
                # A "context too long" rejection says nothing about the model's health.
                tripped = parts.fallback.record_failure(isinstance(exc, RateLimitEscalation))
                if tripped is not None:
                    em.emit(Fallback(em.session_id, em.run_id, *tripped))
            em.emit(StreamFailure(em.session_id, em.run_id, turn, self.turn_model, str(exc), parts.provider_name()))
            raise

    def _retry_event(self, turn: int, ev: RetryWait) -> RetryScheduled:
        """The ``RetryScheduled`` event for a wait before the model call's next try."""
        em, parts = self.events, self.parts
        return RetryScheduled(
            em.session_id, em.run_id, turn, self.turn_model, ev.cause, ev.wait_s, ev.attempt, ev.max_attempts,
            parts.provider_name(),
        )

    def used_call_ids(self) -> set[str]:
        """The ids the run's calls have had (seeded, on first use, from its record and messages so far)."""
        ids = self.call_ids
        if ids is None:
            # A resumed run's earlier turns are in its record (a compaction may
            # have moved their messages out of pending) and its pending messages.
            ids = {c.id for t in self.rc.run.turns for c in t.tool_calls}
            ids.update(c.id for msg in self.machine.pending for c in msg.tool_calls)
            self.call_ids = ids
        return ids

    def record_reply(self, turn: int, query: str, figure: int, response: ModelResponse, phase: Phase) -> None:
        """Calibrate, detect convergence, ``on_response``, feed the machine, the ``Turn`` record."""
        parts = self.parts
        em = self.events
        m = self.machine
        usage = response.usage
        if usage is not None and usage.input_tokens:
            self.meter.calibration.observe(usage.input_tokens)
        if parts.fallback is not None:
            parts.fallback.record_success()
        if em.wants(StreamSuccess):
            model = response.model or self.turn_model  # a reply that names no model: the one asked for
            em.emit(StreamSuccess(em.session_id, em.run_id, turn, model, usage, parts.provider_name()))
        # The gate first: the conversation and the record hold the admitted calls
        # (ids unique in the run, arguments frozen), as the dispatcher and approvals do.
        message, self.admitted = admit_message(response.message, parts.tools, self.rc.unfenced, self.used_call_ids())
        if message is not response.message:  # not attrs.evolve: every reply with calls comes here
            response = ModelResponse(message, response.stop_reason, response.usage, response.model)
        calls = message.tool_calls  # both are computed properties: read once
        text = message.text
        if not calls and parts.convergence is not None:
            self.check_convergence(text)
        if em.wants(Response):
            em.emit(Response(em.session_id, em.run_id, turn, text, usage))
        verdict = None
        check = self.answer_check
        if check is not None and m.reads_answer(message):
            with self.rc.unfenced():  # the answer type's own validators: user code
                verdict = check.read(message, response.stop_reason)
        m.model_response(response, figure, self.tool_names, verdict)
        figure_after = self.meter.figure(m)
        m.set_context_tokens(figure_after)
        in_tok = usage.input_tokens if usage else 0
        out_tok = usage.output_tokens if usage else 0
        self.rc.run.turns.append(
            Turn(turn, query, text, tuple(calls), in_tok, out_tok, response.stop_reason)
        )
        self.llm_phase = (in_tok, out_tok, response.stop_reason)
        phase.input_tokens, phase.output_tokens = in_tok, out_tok
        phase.stop_reason, phase.context_tokens = response.stop_reason, figure_after

    def turn_opening(self, turn: int, query: str) -> tuple[Optional[RequestOptions], tuple[TurnStart, ...]]:
        """Fix the model this turn's call asks for: the request's options and the phase's ``TurnStart``.

        The model is the one the request goes to: its options' override (a
        fallback route, a host's), else the client's own. The event is sent
        by the phase that opens with it, so a cancel taking over while an
        observer holds it still closes the phase.
        """
        parts, em = self.parts, self.events
        options = self.options()
        self.turn_model = (options.model if options is not None else None) or parts.model_name()
        if not em.wants(TurnStart):
            return options, ()
        return options, (TurnStart(em.session_id, em.run_id, turn, query, parts.provider_name(), self.turn_model or None),)

    def options(self) -> Optional[RequestOptions]:
        """The request options: the routed model beats a host override; the client is never mutated."""
        parts = self.parts
        routed = parts.route.model
        if routed is not None and routed != parts.model_name():
            return (self.base_options or parts.request_options).with_model(routed)
        return self.base_options

    def route_model(self) -> None:
        """Ask the fallback chain which model serves this turn; announce a change."""
        parts = self.parts
        fb = parts.fallback
        if fb is None:
            return
        model = fb.before_request()  # raises FallbackExhausted when every model is down
        previous = parts.route.model or parts.model_name()
        parts.route.model = model
        if model != previous:
            em = self.events
            em.emit(ModelSwitched(em.session_id, em.run_id, previous, model))

    def check_convergence(self, text: str) -> None:
        """Record a final answer; a detected convergence warns, stops or asks the user."""
        detector = self.parts.convergence
        if detector is None:
            return
        found = detector.record(text)
        if found is None:
            return
        similarity, count = found
        action = detector.action
        em = self.events
        em.emit(ConvergenceDetected(em.session_id, em.run_id, action, similarity, count))
        if action == "stop":
            raise LoopDetected("agent stopped: convergence detected")
        if action == "ask_user":
            raise UserInputRequired("convergence detected, user input needed")

    def call_model(self, turn: int, request: ModelRequest) -> ModelResponse:
        """Make the model call (streaming or not), cancel-aware.

        A typed run in tool mode names its final-answer tool: that tool's
        input deltas are the answer's text, so observers get them as
        ``on_text_delta`` too.

        Raises:
            Cancelled: the signal fired before or during the call.
            LoopError: the call failed (foreign exceptions become ``ModelError``).
        """
        cancel = self.rc.cancel
        if cancel.is_cancelled():
            raise Cancelled(cancel.reason)
        if self.parts.turn_mode == "non_streaming":
            response = self._complete_turn(turn, request)
        else:
            check = self.answer_check
            response = self._stream_turn(turn, request, check.final_tool if check is not None else None)
        if cancel.is_cancelled():
            raise Cancelled(cancel.reason)
        return response

    def _next_event(self, it: Iterator[object]) -> Any:
        """The call's next event (None at its end), read unfenced; foreign errors become ``ModelError``."""
        rc = self.rc
        rc.lock.release()  # unfenced: a cancel may take the run over while the model is awaited
        try:
            return next(it, None)
        except LoopError:
            raise
        except Exception as exc:
            if rc.cancel.is_cancelled():
                raise Cancelled(rc.cancel.reason) from exc
            raise ModelError(f"stream failed: {type(exc).__name__}: {exc}") from exc
        finally:
            rc.refence()

    def _complete_turn(self, turn: int, request: ModelRequest) -> ModelResponse:
        """A non-streaming turn: the same retries, one whole reply.

        The first attempt is made directly (most calls need no retry); a
        failure goes on through the handler's retry events.
        """
        parts, rc, em = self.parts, self.rc, self.events
        call = parts.stream_handler.complete_turn(parts.client, request, rc.cancel)
        cancel = rc.cancel
        self.model_call = call  # before the call starts: a cancel from now on closes it
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
                ev = self._next_event(it)
                if ev is None:
                    break
                if type(ev) is StreamRescue:
                    if cancel.is_cancelled():
                        raise Cancelled(cancel.reason)
                    reply: ModelResponse = ev.response  # the reply is the call's last event
                    return reply
                if type(ev) is RetryWait:
                    em.emit(self._retry_event(turn, ev))
                elif type(ev) is StreamAttemptReset:
                    em.attempt_reset(turn, ev.attempt)
        finally:
            self.model_call = None
        raise Cancelled(cancel.reason)  # ended without a reply: only a close (cancel) does that

    def _stream_turn(self, turn: int, request: ModelRequest, answer_tool: Optional[str]) -> ModelResponse:
        """A streaming turn: deltas to observers (and the text streamer) as they come."""
        parts, rc, em = self.parts, self.rc, self.events
        streamer = parts.text_streamer
        events = parts.stream_handler.stream_turn(parts.client, request, rc.cancel)
        acc = StreamAccumulator()
        rescued: Optional[ModelResponse] = None
        tool_slots: dict[int, tuple[str, str]] = {}
        # The streamer is an outlet too: it gets the reply's pieces as the events
        # do, through the same mask (a key split across pieces is masked whole).
        em.text_sink = None if streamer is None else _sink(rc, streamer)
        it = iter(events)
        self.model_call = events  # before the call starts: a cancel from now on closes it
        try:
            while True:
                ev = self._next_event(it)
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
                    # The whole reply came at once: its pieces go out as the streamed ones
                    # would have (one delta per part), so every outlet that shows deltas
                    # (observers, the text streamer, the CLI) shows the reply.
                    rescued = ev.response
                    it = itertools.chain(response_events(rescued, chunk=WHOLE_PART), it)
                elif isinstance(ev, RetryWait):
                    em.emit(self._retry_event(turn, ev))
                else:
                    acc.feed(ev)
            if not rc.cancel.is_cancelled():
                em.flush_deltas()  # on an error the phase's close lets go of them instead
        finally:
            self.model_call = None
            em.text_sink = None
        if rc.cancel.is_cancelled():
            raise Cancelled(rc.cancel.reason)
        if rescued is not None:
            return rescued
        return acc.build()


def _sink(rc: RunContext, streamer: Callable[[str], None]) -> Callable[[str], None]:
    """The text streamer as the events' text sink: called unfenced, its failure contained."""

    def sink(piece: str) -> None:
        with rc.unfenced():  # user code: never holds a cancel
            try:
                streamer(piece)
            except Exception:
                log.exception("text streamer raised; ignored")

    return sink


__all__ = ["MEMORY_PREFIX", "ModelTurn", "turn_query"]
