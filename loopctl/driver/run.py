"""RunDriver: one run of the hands, its handlers in timeline order.

The run object is split once: ``RunState`` (run_state.py) is what the run
holds (its context, the loop's parts and collaborators it was lent, its
input, config, policy and per-step figures); ``RunDriver`` is what it does.
The model turn (``ModelTurn``, llm_turn.py), the compaction pass
(``Compaction``, compaction.py) and the end (``RunEnding``, run_end.py:
the ending point and ``_finalize``) are its methods, kept in their own
modules. It never holds the loop.

Read top to bottom it is the run's timeline: ``body`` (audit entry ->
``on_run_start`` -> ``accept_input`` -> loop over ``next_step``; the
steering slot was opened by the launch, before ``start()`` returned),
handler 1 ``call_llm``, handler 2 ``call_tools``, handler 3
``compact``, then ``finalize``. The brain decides, the hands report: the
request's measured size goes to ``prepare_turn`` (call the model, or
compact first), a provider's ``ContextOverflow`` to ``context_overflow``,
and a ``Done`` is acted on with ``conclude``.

The body runs fenced (``RunContext.lock``) except around blocking work and
user code; on cancel, ``take_over`` (on the waiting thread) finalizes the
run itself while the body is blocked, and the body leaves silently when it
wakes (see ``handle.py``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Optional

from loopctl.driver.checkpoint import ResumePoint, restore
from loopctl.driver.compaction import Compaction
from loopctl.driver.dispatch import Dispatcher
from loopctl.driver.emission import RunEvents
from loopctl.driver.handle import Abandoned, RunContext
from loopctl.driver.llm_turn import ModelTurn, turn_query
from loopctl.driver.meter import TokenMeter
from loopctl.driver.parts import LoopParts
from loopctl.driver.run_end import RunEnding
from loopctl.driver.run_state import Release
from loopctl.errors import (
    Cancelled,
    ContextOverflow,
    LoopError,
)
from loopctl.events import OutputValidationFailed, SteeringDelivered, ToolCallReceived
from loopctl.machine import (
    CallLLM,
    CallTools,
    Compact,
    Completed,
    Done,
    Failed,
    LoopMachine,
)
from loopctl.messages import (
    Message,
)
from loopctl.output import OutputCheck
from loopctl.output.answers import answer_system, answer_tools, shape_options, shape_request

if TYPE_CHECKING:
    from loopctl.cancel import CancelSignal
    from loopctl.driver.resources import LoopResources
    from loopctl.driver.signals import RunSteering
    from loopctl.records import Session

log = logging.getLogger("loopctl")


class RunDriver(ModelTurn, Compaction, RunEnding):
    """One run: what it does, in timeline order (its state is ``RunState``)."""

    __slots__ = ("dispatcher",)

    def __init__(
        self,
        rc: RunContext,
        parts: LoopParts,
        machine: LoopMachine,
        meter: TokenMeter,
        events: RunEvents,
        dispatcher: Dispatcher,
        steering: RunSteering,
        session: Session,
        busy: threading.Lock,
        loop_cancel: CancelSignal,
        owner: Release,
        resources: LoopResources,
        answer_check: Optional[OutputCheck] = None,
    ) -> None:
        super().__init__(
            rc, parts, machine, meter, events, steering, session, busy, loop_cancel, owner, resources, answer_check
        )
        self.dispatcher = dispatcher

    # -- the body: one run, start to finish ---------------------------------------------

    def body(self) -> None:
        """The run's thread: every step, then ``finalize``; leaves silently if abandoned."""
        rc = self.rc
        held = True
        try:
            error: Optional[LoopError] = None
            try:
                self.steps()
            except Abandoned:
                held = False
                return
            except LoopError as exc:
                error = exc
            except BaseException as exc:  # a bug, or a user callback's escape
                error = LoopError(f"internal error: {type(exc).__name__}: {exc}")
                error.__cause__ = exc
                log.exception("run %s failed inside the driver", rc.run.id)
            try:
                if error is not None:
                    error = self.reach_end(error) or error
                    self.set_error_state(error)
            finally:
                self._finalize(error)
        except Abandoned:  # abandoned while finalize delivered: the takeover owns the end
            held = False
        finally:
            if held and not rc.finished:
                # Something escaped finalize itself: still close the slot and
                # free the loop, so a stray handle cannot push into a dead run.
                self.steering.close()
                self.owner._release(rc, rc.error, self.keeps_later_cancel())
            if held:
                rc.lock.release()
            rc.done.set()
            rc.wake.set()

    def take_over(self) -> None:
        """On cancel (the waiting thread): once the body blocks, finish the run here.

        A run already in ``finalize`` (or done) is left to its body.
        """
        rc = self.rc
        with rc.lock:
            if rc.finished or rc.ending:
                return
            rc.abandoned = True
            if self.tally is not None:  # none: no tool call has run yet
                self.resources.abandon(self.tally)
            self.events.take_over()  # observers may be blocked: never deliver on this thread
            err = Cancelled(self.loop_cancel.reason)
            self.set_error_state(err)
            self._finalize(err)
        rc.done.set()
        rc.wake.set()

    def steps(self) -> None:
        """Audit entry, ``on_run_start``, ``accept_input``; then loop over ``next_step``."""
        rc = self.rc
        run = rc.run
        m = self.machine
        self.session.runs.append(run)
        self.begin()
        if self.durable is not None:
            self.durable.base_epoch = m.history_epoch
        point = self.resume_point
        if point is None:
            self.events.run_start(run.input)
            m.accept_input(run.input, self.answer_check)
        else:
            self.resume(point)
        link = self.link
        if link is not None and link.unreadable is not None:
            unreadable, link.unreadable = link.unreadable, None
            raise unreadable  # the stored conversation cannot be read: the run fails before any turn
        self.measure_overhead()  # user code, unfenced: after the run's first event, so a cancel there still has it
        policy = self.policy
        cancel = rc.cancel
        while True:
            if cancel.is_cancelled():
                m.cancel()
            step = m.next_step(policy)
            t = type(step)
            if t is CallLLM:
                self.call_llm(step.turn)  # type: ignore[union-attr]
            elif t is CallTools:
                self.call_tools(step)  # type: ignore[arg-type]
            elif t is Compact:
                self.compact(step.reason)  # type: ignore[union-attr]
            else:
                stopped = self.reach_end()  # from here a cancel no longer reaches this run
                if stopped is not None:
                    raise stopped
                outcome = m.conclude(policy)
                if type(outcome) is Completed:
                    run.output = outcome.final_text
                    run.output_value = outcome.value
                    return
                raise self.error_for(outcome)

    def begin(self) -> None:
        """Per-run resets and the run's fixed request options."""
        parts = self.parts
        reset_loops = getattr(parts.loop_detector, "reset", None)
        if reset_loops is not None:
            reset_loops()  # tool-loop detection is per run; convergence persists
        if self.config.reset_managers:
            for part in (parts.health, parts.loop_detector, parts.convergence, parts.fallback):
                reset = getattr(part, "reset", None)
                if reset is not None:
                    reset()
        self.gathers = bool(parts.contributors) or (parts.memory is not None and self.config.memory_top_k > 0)
        opts = parts.request_options
        check = self.answer_check
        self.base_options = shape_options(check, None if opts.is_empty() else opts)
        self.tool_names = parts.tools.name_set()

    def measure_overhead(self) -> None:
        """The request overhead, fixed for the run: system prompt and tool schemas, measured."""
        parts = self.parts
        check = self.answer_check
        with self.rc.unfenced():  # made again after the tools changed: their input_schema() is user code
            schemas = parts.tools.schemas()
        self.meter.begin_run(answer_system(check, parts.session_config.system_prompt), answer_tools(check, schemas))

    def resume(self, point: ResumePoint) -> None:
        """``on_run_resumed``, then the machine where the checkpoint left the run."""
        cp = point.checkpoint
        run = self.rc.run
        self.events.run_resumed(run.input, point.attempt, point.cause, cp.turns_taken if cp else 0)
        answered = restore(point, self.machine, run, self.parts.tools, self.answer_check, self.rc.unfenced)
        if self.durable is not None:
            self.durable.answered = list(answered.values())
            if cp is not None and cp.history is not None:
                self.durable.base_epoch = -1  # the host holds an older history: checkpoints carry ours

    # -- handler 1: one model call -----------------------------------------------------

    def call_llm(self, turn: int) -> None:
        """Drain steering, gather extras, measure, let the brain decide; then call the model."""
        m = self.machine
        em = self.events
        parts = self.parts
        meter = self.meter
        tools = parts.tools
        if tools.has_refreshers:
            with self.rc.unfenced():  # a tool source's own IO (an MCP list): never holds a cancel
                tools.refresh()
                tools.schemas()  # for the request: made again by the tools' own (user) code when they changed
            self.tool_names = tools.name_set()
        conv_last = m.pending if len(m.pending) else m.history
        query = turn_query(self.run_input, turn, conv_last)
        steering = self.steering
        gather = self.gathers
        while True:
            arrived = steering.arrived  # before the drain: a push landing after it is seen below
            self.drain_steering(turn)
            transients: Sequence[Message] = self.gather_transients(turn, query) if gather else ()
            if steering.arrived == arrived:
                break
        extra = meter.count(transients) if transients else 0
        raw = meter.raw(m) + extra
        figure = meter.calibration.scale(raw)
        if type(m.prepare_turn(figure, self.policy)) is not CallLLM:
            # Deferral: compact first, with room reserved for these extras.
            self.deferred_tokens = extra
            return
        meter.calibration.note_prediction(raw)
        if parts.fallback is not None:
            self.route_model()
        options, opening = self.turn_opening(turn, query)
        request = self.build_request(transients, options)
        if self.answer_check is not None:
            request = shape_request(self.answer_check, request)
        try:
            with em.phase(turn, "llm", figure, opening) as phase:
                response = self.ask_model(turn, request)
                self.record_reply(turn, query, figure, response, phase)
            rejected = m.answer_rejected
            if rejected is not None:
                em.emit(
                    OutputValidationFailed(
                        em.session_id, em.run_id, rejected.turn, tuple(rejected.errors),
                        rejected.attempt, rejected.max_attempts,
                    )
                )
        except ContextOverflow as exc:
            # The brain decides: one compact-and-retry per turn, else the run fails.
            step = m.context_overflow(exc, figure, self.policy)
            if type(step) is Done and type(step.outcome) is Failed and step.outcome.error is not exc:
                step.outcome.error.__cause__ = exc
            return
        self.boundary("model")

    def drain_steering(self, turn: int) -> None:
        """Move pushed guidance into pending (``on_steering`` when any arrived)."""
        msgs = self.steering.drain()
        if not msgs:
            return
        for msg in msgs:
            self.machine.inject(msg)
        em = self.events
        em.emit(SteeringDelivered(em.session_id, em.run_id, turn, tuple(msgs)))

    # -- handler 2: the tools the reply asked for ---------------------------------------

    def call_tools(self, step: CallTools) -> None:
        """Dispatch the calls not pre-answered; ONE results message, in request order."""
        turn = step.turn
        em = self.events
        m = self.machine
        received = (
            tuple(
                ToolCallReceived(em.session_id, em.run_id, turn, p.call.id, p.call.name, p.call.input)
                for p in step.calls
            )
            if em.wants(ToolCallReceived)
            else ()
        )
        results = [p.preresolved for p in step.calls]
        todo = [i for i, p in enumerate(step.calls) if p.preresolved is None]
        with em.phase(turn, "tools", m.context_tokens, received, self.llm_phase) as phase:
            outs = self.dispatcher.dispatch(self, turn, [step.calls[i].call for i in todo])
            for i, r in zip(todo, outs):
                results[i] = r
            m.tool_results([Message.from_tool_results(results)])  # type: ignore[arg-type]
            figure = self.meter.figure(m)
            m.set_context_tokens(figure)
            phase.context_tokens = figure
        self.boundary("tools")

    # -- handler 3: compact ----------------------------------------------------------------

    def compact(self, reason: str) -> None:
        """One compaction pass; the deferred extras' reservation is used once."""
        deferred, self.deferred_tokens = self.deferred_tokens, 0
        self.run_compaction(reason, deferred)


__all__ = ["RunDriver"]
