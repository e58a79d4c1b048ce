"""Handlers 1 and 2: one model turn, and the tool phase that follows it.

Handler 1 drains steering, gathers the transient extras, re-measures and
lets the machine defer the turn into a compaction (no turn events) before
anything is sent; then it calls the model and records the reply. Handler 2
dispatches the calls that were not pre-answered and feeds every result back
as ONE user message in the model's request order. Both run fenced on the
run's thread; only the model call and the tools themselves run unfenced.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from loopctl.context.tokens import count_messages
from loopctl.driver.checkpoint import take_checkpoint
from loopctl.driver.llm_turn import build_request, call_model, gather_transients, turn_query
from loopctl.errors import (
    Cancelled,
    ContextExceeded,
    LoopDetected,
    LoopError,
    ModelError,
    RateLimitEscalation,
    UserInputRequired,
)
from loopctl.machine import CallLLM, CallTools, MachinePolicy
from loopctl.messages import Message
from loopctl.records import Turn

if TYPE_CHECKING:
    from loopctl.driver.handle import RunContext
    from loopctl.driver.loop import BareLoop


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def handle_call_llm(loop: BareLoop, rc: RunContext, turn: int, policy: MachinePolicy) -> None:
    m = loop._machine
    em = loop._emitter
    counter = loop._counter
    conv_last = m.pending if len(m.pending) else m.history
    query = turn_query(loop._run_input, turn, conv_last)
    steering = loop._steering
    gather = bool(loop._contributors) or (loop._memory is not None and loop._run_config_now.memory_top_k > 0)
    while True:
        arrived = steering._arrived  # before the drain: a push landing after it is seen below
        drain_steering(loop, turn)
        transients = gather_transients(loop, rc, turn, query) if gather else []
        if steering._arrived == arrived:
            break
    raw_conv = loop._measure_raw()
    extra = count_messages(counter, transients) if transients else 0
    raw = raw_conv + extra
    figure = loop._calibration.scale(raw)
    m.set_context_tokens(figure)
    if type(m.next_step(policy)) is not CallLLM:
        # Deferral: compact first, with room reserved for these extras.
        loop._deferred_transient_tokens = extra
        return
    loop._calibration.note_prediction(raw)
    route_model(loop)
    em.turn_start(turn, query)
    t0 = time.perf_counter()
    loop._open_phase = (turn, "llm", t0, 0, 0, None, figure)
    request = build_request(loop, transients)
    try:
        response = call_model(loop, rc, turn, request)
    except Cancelled:
        raise
    except LoopError as exc:
        if rc.cancel.is_cancelled():  # failed because it was cancelled: not the model's fault
            raise Cancelled(loop._cancel.reason) from exc
        if loop._fallback is not None and not is_overflow(loop, exc):
            # A "context too long" rejection says nothing about the model's health.
            tripped = loop._fallback.record_failure(isinstance(exc, RateLimitEscalation))
            if tripped is not None:
                em.fallback(*tripped)
        em.stream_failure(turn, loop._routed_model or loop._model_name(), str(exc))
        loop._open_phase = None
        em.turn_end(turn, "llm", False, str(exc), _ms(t0), 0, 0, None, figure, loop._window())
        if is_overflow(loop, exc):
            window = loop._session_config.context_window
            if turn in loop._overflow_retried:
                raise ContextExceeded(used=max(figure, window + 1), limit=window) from exc
            # One compact-and-retry per turn: force the emergency line.
            loop._overflow_retried.add(turn)
            m.set_context_tokens(max(window, figure) + 1)
            return
        raise
    usage = response.usage
    if usage is not None and usage.input_tokens:
        loop._calibration.observe(usage.input_tokens)
    if loop._fallback is not None:
        loop._fallback.record_success()
    em.stream_success(turn, response.model or loop._model_name(), usage)
    message = response.message
    if not message.tool_calls and loop._convergence is not None:
        check_convergence(loop, message.text)
    em.response(turn, message.text, usage)
    m.model_response(response, figure, loop._tool_names)
    figure_after = loop._measure_figure()
    m.set_context_tokens(figure_after)
    in_tok = usage.input_tokens if usage else 0
    out_tok = usage.output_tokens if usage else 0
    rc.run.turns.append(
        Turn(turn, query, message.text, tuple(message.tool_calls), in_tok, out_tok, response.stop_reason)
    )
    loop._llm_phase = (in_tok, out_tok, response.stop_reason)
    loop._open_phase = None
    em.turn_end(turn, "llm", True, None, _ms(t0), in_tok, out_tok, response.stop_reason, figure_after, loop._window())
    if rc.checkpoint is not None:
        rc.answered = []
        take_checkpoint(loop, rc, "model")

def route_model(loop: BareLoop) -> None:
    fb = loop._fallback
    if fb is None:
        return
    model = fb.before_request()  # raises FallbackExhausted when every model is down
    previous = loop._routed_model or loop._model_name()
    loop._routed_model = model
    if model != previous:
        loop._emitter.model_switched(previous, model)

def check_convergence(loop: BareLoop, text: str) -> None:
    found = loop._convergence.record(text)
    if found is None:
        return
    similarity, count = found
    action = loop._convergence.action
    loop._emitter.convergence_detected(action, similarity, count)
    if action == "stop":
        raise LoopDetected("agent stopped: convergence detected")
    if action == "ask_user":
        raise UserInputRequired("convergence detected, user input needed")

def drain_steering(loop: BareLoop, turn: int) -> None:
    msgs = loop._steering._drain()
    if not msgs:
        return
    for msg in msgs:
        loop._machine.inject(msg)
    loop._emitter.steering(turn, msgs)

def is_overflow(loop: BareLoop, exc: LoopError) -> bool:
    if not isinstance(exc, ModelError) or loop._session_config.context_window <= 0:
        return False
    text = str(exc).lower()
    return any(
        p in text
        for p in (
            "context length",
            "context_length_exceeded",
            "maximum context",
            "context window",
            "prompt is too long",
            "too many tokens",
        )
    )



def handle_call_tools(loop: BareLoop, rc: RunContext, step: CallTools) -> None:
    turn = step.turn
    em = loop._emitter
    for p in step.calls:
        em.tool_call_received(turn, p.call.id, p.call.name, p.call.input)
    t0 = time.perf_counter()
    results = [p.preresolved for p in step.calls]
    todo = [i for i, p in enumerate(step.calls) if p.preresolved is None]
    in_tok, out_tok, stop = loop._llm_phase
    loop._open_phase = (turn, "tools", t0, in_tok, out_tok, stop, loop._machine.context_tokens)
    try:
        outs = loop._dispatcher.dispatch(rc, turn, [step.calls[i].call for i in todo])
    except Cancelled:
        raise
    except LoopError as exc:
        loop._open_phase = None
        em.turn_end(turn, "tools", False, str(exc), _ms(t0), in_tok, out_tok, stop,
                    loop._machine.context_tokens, loop._window())
        raise
    for i, r in zip(todo, outs):
        results[i] = r
    ms = _ms(t0)
    m = loop._machine
    m.tool_results([Message.from_tool_results(results)])  # type: ignore[arg-type]
    figure = loop._measure_figure()
    m.set_context_tokens(figure)
    loop._open_phase = None
    em.turn_end(turn, "tools", True, None, ms, in_tok, out_tok, stop, figure, loop._window())
    take_checkpoint(loop, rc, "tools")


__all__ = ["handle_call_llm", "handle_call_tools"]
