"""Tool dispatch: sequential or parallel waves, results in request order.

Every batch first passes the admission gate (``admission.admit``: unique
ids, resolved names, frozen validated arguments); a call's attempts then
run with the admitted tool and a fresh plain copy of the admitted
arguments, and a recovery correction is admitted again before it runs.

Every attempt of a call goes through the same steps, split in three
phases so that events and state stay on the run's thread:

- begin (run thread): cancel check, ``on_tool_pre``, then the call's GATE
  (``_gate``: the one point where a call may wait before it runs; today the
  pre-tool hooks, run UNFENCED so a ``ConfirmationHook`` waiting for a
  person never holds a cancel; a block is a soft error with no
  ``on_tool_post``), the loop detector's pre-check (a pending stop is a
  hard ``LoopDetected``), the health gate (keyed on the requested name; an
  open breaker is a soft refusal);
- execute (unfenced; inline for a lone call, on the loop's pool for a
  parallel wave): through the pipeline when set, else the registry. A
  ``KeyboardInterrupt`` from a tool cancels the run ("interrupted"); any
  other ``BaseException`` (``SystemExit``, ``GeneratorExit``) is a soft
  error naming it, alone or in a wave;
- finish (run thread): detector record, ``on_tool_post``, post-tool hooks
  (unfenced), health record (under the resolved name), memory trajectory
  (successful calls only), then recovery: a ``Retry`` waits (cancel-aware,
  unfenced), applies the correction and runs the whole pipeline again with
  ``attempt + 1``; more than five retries is ``ToolRecoveryExhausted``.

The dispatcher holds the loop's parts and resources, never the loop; a
run lends it itself (its ``RunState``).

A wave fires every ``on_tool_pre`` (in request order), runs its calls
together (each in a copy of the run's contextvars), then fires every ``on_tool_post`` in request order; retries of a
wave's calls then run one by one. A hard error (cancel, loop stop, recovery
exhausted) ends the batch and the run; finished siblings are discarded.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, Optional

from loopctl.approvals.gate import ParkedBatch
from loopctl.cancel import CancelSignal
from loopctl.driver.admission import Admitted, admit, taken
from loopctl.driver.approval_gate import dispatch_parked, park_batch, pipeline_gate
from loopctl.driver.loop_watch import count_answer, stop_if_armed
from loopctl.driver.recovery import apply_correction, plan_retry
from loopctl.driver.tool_calls import CallState, plan_waves, result_hash
from loopctl.errors import Cancelled, ToolRecoveryExhausted
from loopctl.events import ToolPost, ToolPre
from loopctl.events.hooks import ToolHookContext
from loopctl.frozen import thaw
from loopctl.messages import ToolCallPart, ToolResultPart
from loopctl.timeouts import bounded
from loopctl.tools.base import ToolContext, ToolOutput
from loopctl.tools.pipeline import DispatchContext, invoke_tool, not_found_text
from loopctl.tools.recovery import MAX_RETRIES, Retry

if TYPE_CHECKING:
    from loopctl.driver.handle import RunContext
    from loopctl.driver.parts import LoopParts
    from loopctl.driver.resources import LoopResources
    from loopctl.driver.run_state import RunState

log = logging.getLogger("loopctl")

_RUN, _BLOCKED, _GATED = 0, 1, 2
_trajectory_entry: Any = None  # loopctl.context.memory.trajectory_entry, imported on first use


def _cancel_wait(cancel: CancelSignal, delay: float) -> bool:
    return bool(cancel.wait(bounded(delay)))


class Dispatcher:
    """Runs one turn's tool calls; holds the loop's parts and resources, not the loop.

    ``sleep(cancel, seconds) -> bool`` waits between recovery retries
    (True if cancelled meanwhile); tests inject a fake.
    """

    __slots__ = ("parts", "resources", "sleep")

    def __init__(self, parts: LoopParts, resources: LoopResources) -> None:
        self.parts = parts
        self.resources = resources
        self.sleep: Callable[[CancelSignal, float], bool] = _cancel_wait

    # -- batches ---------------------------------------------------------------

    def dispatch(self, run: RunState, turn: int, calls: Sequence[ToolCallPart]) -> list[ToolResultPart]:
        """Admit ``calls`` (the gate), then run them; results in the same order.

        Raises:
            Cancelled: the signal fired before a call, between calls or waves,
                while a wave was running, or during a retry's backoff; or a
                tool raised ``KeyboardInterrupt`` (the run is cancelled).
            LoopDetected: the loop detector's stop was pending.
            ToolRecoveryExhausted: a call needed more than five retries.
        """
        admitted, run.admitted = run.admitted, None
        if not calls:
            return []
        tools = self.parts.tools
        return self._dispatch_admitted(run, turn, taken(admitted, calls, tools) or admit(calls, tools, run.rc.unfenced))

    def _dispatch_admitted(self, run: RunState, turn: int, calls: Sequence[Admitted]) -> list[ToolResultPart]:
        parallel = run.parallel
        settled = run.settle if run.durable is not None else None
        sequential = parallel.mode == "sequential" or parallel.max_concurrency == 1 or len(calls) == 1
        parts = self.parts
        asks = parts.approval_policy is not None or parts.tools.has_approval_tools
        parked = self._park(run, turn, calls) if asks else None
        if parked is not None:  # some calls wait for a person: see approval_gate
            waves = [[i] for i in range(len(calls))] if sequential else self._plan_waves(run, calls, parallel.max_concurrency)

            def run_group(group: Sequence[Admitted]) -> list[ToolResultPart]:
                out = self._run_group(run, turn, group)
                if settled is not None:
                    settled(out)
                return out

            return dispatch_parked(
                parked, calls, waves, run_group, lambda: self._check_cancel(run.rc), run.rc.unfenced,
                lambda call, text: self._denied(run, call, text),
            )
        if sequential:
            if settled is None:
                return [self._run_one(run, turn, CallState(c)) for c in calls]
            out = []
            for c in calls:
                out.append(self._run_one(run, turn, CallState(c)))
                settled(out[-1:])
            return out
        results: list[Optional[ToolResultPart]] = [None] * len(calls)
        for wave in self._plan_waves(run, calls, parallel.max_concurrency):
            self._check_cancel(run.rc)
            if len(wave) == 1:
                i = wave[0]
                results[i] = self._run_one(run, turn, CallState(calls[i]))
            else:
                for i, r in zip(wave, self._run_wave(run, turn, [calls[i] for i in wave])):
                    results[i] = r
            if settled is not None:
                settled([results[i] for i in wave])  # type: ignore[misc]
        return results  # type: ignore[return-value]

    def _park(self, run: RunState, turn: int, calls: Sequence[Admitted]) -> Optional[ParkedBatch]:
        rc = run.rc
        return park_batch(
            rc.approvals, self.parts.approval_policy, calls, events=run.events,
            session_id=run.session_id, turn=turn,
            default_timeout=rc.run.config.approval_timeout, unfenced=rc.unfenced,
            before_asking=lambda: stop_if_armed(self.parts.loop_detector),
        )

    def _run_group(self, run: RunState, turn: int, calls: Sequence[Admitted]) -> list[ToolResultPart]:
        if len(calls) == 1:
            return [self._run_one(run, turn, CallState(calls[0]))]
        return self._run_wave(run, turn, calls)

    def _check_cancel(self, rc: RunContext) -> None:
        if rc.cancel.is_cancelled():
            raise Cancelled(rc.cancel.reason)

    def _check_interrupted(self, rc: RunContext, states: Sequence[CallState]) -> None:
        """A tool raised ``KeyboardInterrupt``: the user means the run, so cancel it."""
        for st in states:
            if st.interrupted:
                rc.cancel.cancel("interrupted")
                raise Cancelled("interrupted")

    def _run_one(self, run: RunState, turn: int, st: CallState) -> ToolResultPart:
        """The whole per-call pipeline, inline on the run's thread, retries included."""
        rc = run.rc
        while True:
            kind = self._begin(run, turn, st)
            if kind == _BLOCKED:
                return st.result()
            if kind == _RUN:
                self._execute_inline(run, turn, st)
                if st.interrupted:
                    self._check_interrupted(rc, (st,))
                if rc.cancel.is_cancelled():
                    raise Cancelled(rc.cancel.reason)
            retry = self._finish(run, turn, st, kind == _GATED)
            if retry is None:
                return st.result()
            self._prepare_retry(run, turn, st, retry)

    def _execute_inline(self, run: RunState, turn: int, st: CallState) -> None:
        """Run the attempt on the run's thread, unfenced (a cancel may abandon it)."""
        tally = run.tool_tally()
        tally.inline = True
        try:
            with run.rc.unfenced():
                self._execute(turn, st)
        finally:
            tally.inline = False
            if tally.abandoned:  # rare: the run was abandoned meanwhile
                self.resources.inline_ended(tally)

    def _plan_waves(self, run: RunState, calls: Sequence[Admitted], limit: int) -> list[list[int]]:
        return plan_waves(calls, limit, run.rc.unfenced)

    def _run_wave(self, run: RunState, turn: int, calls: Sequence[Admitted]) -> list[ToolResultPart]:
        rc = run.rc
        states = [CallState(c) for c in calls]
        kinds = [self._begin(run, turn, st) for st in states]
        runnable = [st for st, k in zip(states, kinds) if k == _RUN]
        if runnable:
            self._execute_together(run, turn, runnable)
        self._check_interrupted(rc, runnable)
        self._check_cancel(rc)
        slots: list[Optional[ToolResultPart]] = [None] * len(states)
        retries: list[tuple[int, Retry]] = []
        for k, (st, kind) in enumerate(zip(states, kinds)):
            if kind == _BLOCKED:
                slots[k] = st.result()
                continue
            retry = self._finish(run, turn, st, kind == _GATED)
            if retry is None:
                slots[k] = st.result()
            else:
                retries.append((k, retry))
        for k, retry in retries:
            st = states[k]
            self._prepare_retry(run, turn, st, retry)
            slots[k] = self._run_one(run, turn, st)
        return slots  # type: ignore[return-value]

    def _execute_together(self, run: RunState, turn: int, states: list[CallState]) -> None:
        rc = run.rc
        resources = self.resources
        pool = resources.executor(run.parallel.max_concurrency)
        if pool is None:
            # Past the bound on abandoned tool threads: no new threads; the
            # wave's calls run one by one on the run's thread.
            for st in states:
                self._execute_inline(run, turn, st)
                if st.interrupted or rc.cancel.is_cancelled():
                    return
            return
        tally = run.tool_tally()  # what the pool's threads hold: never the run itself
        lock = threading.Lock()
        all_done = threading.Event()
        remaining = [len(states)]

        def work(st: CallState) -> None:
            try:
                if st.ctx is not None and st.ctx.cancel.is_cancelled():
                    return  # cancelled while it waited for a worker: never start it
                resources.tool_started(tally)
                try:
                    self._execute(turn, st)
                finally:
                    resources.tool_ended(tally)
            finally:
                with lock:
                    remaining[0] -= 1
                    if remaining[0] == 0:
                        all_done.set()

        wake = all_done.set
        rc.cancel.add_listener(wake)
        try:
            with rc.unfenced():
                for st in states:
                    # each task runs in its own copy of the run's contextvars
                    pool.submit(contextvars.copy_context().run, work, st)
                all_done.wait()
        finally:
            rc.cancel.remove_listener(wake)

    # -- one attempt's phases ------------------------------------------------------

    def _hook_ctx(self, run: RunState, turn: int, st: CallState) -> ToolHookContext:
        c = st.call
        return ToolHookContext(run.session_id, run.rc.run.id, turn, c.id, c.name, c.input, st.attempt)

    def _begin(self, run: RunState, turn: int, st: CallState) -> int:
        """Run thread: cancel check, pre event, the gate, detector pre-check, health gate."""
        rc = run.rc
        cancel = rc.cancel
        if cancel.is_cancelled():
            raise Cancelled(cancel.reason)
        parts = self.parts
        call = st.call
        em = run.events
        if em.wants(ToolPre):
            em.emit(ToolPre(em.session_id, em.run_id, turn, call.id, call.name, st.attempt))
        hooks = parts.hooks
        if hooks is not None and hooks.hooks and self._gate(run, turn, st):
            return _BLOCKED
        stop_if_armed(parts.loop_detector)
        if st.refusal is not None:
            st.out, st.ms, st.resolved = ToolOutput.error(st.refusal), 0.0, call.name
            return _GATED
        health = parts.health
        if health is not None:
            refusal = health.check(call.name)
            if refusal is not None:
                st.out, st.ms, st.resolved = ToolOutput.error(refusal), 0.0, call.name
                return _GATED
        st.ctx = ToolContext(
            run.session_id, rc.run.id, turn, call.id, self.resources.ensure_temp_dir, rc.cancel, parts.tool_extras
        )
        if cancel.is_cancelled():  # biased: a cancel from on_tool_pre or a hook means it never starts
            raise Cancelled(cancel.reason)
        return _RUN

    def _gate(self, run: RunState, turn: int, st: CallState) -> bool:
        """The one point where a call may wait before it runs; True when it is blocked.

        Runs unfenced (a hook may wait for a person): a cancel meanwhile takes
        the run over at once. Its soft answer, when blocked, is in ``st.out``.
        """
        hooks = self.parts.hooks
        assert hooks is not None
        ctx = self._hook_ctx(run, turn, st)
        with run.rc.unfenced():
            decision = hooks.pre_tool_use(ctx)
        if decision.blocks:
            st.out = ToolOutput.error(f"Tool '{st.call.name}' blocked: {decision.reason or 'blocked by hook'}")
            return True
        return False

    def _execute(self, turn: int, st: CallState) -> None:
        """Any thread, unfenced: run the attempt; never raises."""
        parts = self.parts
        call = st.call
        t0 = time.perf_counter()
        pipeline = parts.pipeline
        try:
            # The tool gets its own plain copy of the admitted (frozen) arguments.
            if pipeline is None:
                tool = st.tool
                if tool is None:
                    out = ToolOutput.error(not_found_text(call.name, parts.tools))
                else:
                    out = invoke_tool(tool, thaw(call.input), st.ctx)
                st.resolved = call.name
            else:
                args = thaw(call.input)
                gate = pipeline_gate(call, st.tool, parts.tools, parts.approval_policy)  # a layer's rewrite passes it
                d = DispatchContext(call.name, args, call.name, call.id, turn, st.attempt, st.ctx, parts.tools, gate)
                out = pipeline.dispatch(d)
                st.resolved = d.tool_name
        except Exception as exc:  # a custom pipeline that raises; never kill the run
            out = ToolOutput.error(f"Tool '{call.name}' raised {type(exc).__name__}: {exc}")
        except KeyboardInterrupt:
            st.interrupted = True  # the run is cancelled by whoever waits for this call
            out = ToolOutput.error(f"Tool '{call.name}' was interrupted (KeyboardInterrupt)")
        except BaseException as exc:  # SystemExit, GeneratorExit: the tool failed, not the run
            out = ToolOutput.error(f"Tool '{call.name}' raised {type(exc).__name__}: {exc}")
        st.out = out
        st.ms = (time.perf_counter() - t0) * 1000.0

    def _finish(self, run: RunState, turn: int, st: CallState, gated: bool) -> Optional[Retry]:
        """Run thread: record, post event, hooks, health, memory, recovery.

        Returns a ``Retry`` when the call should run again, else None.
        """
        parts = self.parts
        rc = run.rc
        call, out = st.call, st.out
        em = run.events
        if not gated:
            count_answer(parts.loop_detector, em, call, out)
        if em.wants(ToolPost):  # hashing costs more than the check
            em.emit(
                ToolPost(
                    em.session_id, em.run_id, turn, call.id, call.name, st.attempt,
                    out.is_error, st.ms, out.text, result_hash(out.text),
                )
            )
        hooks = parts.hooks
        if hooks is not None and hooks.hooks:
            ctx = self._hook_ctx(run, turn, st)
            with rc.unfenced():  # user code: never holds a cancel
                hooks.post_tool_use(ctx, out.text, out.is_error)
        if gated:
            return None  # it never ran: nothing to record, nothing to retry
        health = parts.health
        if health is not None:
            health.record(st.resolved, not out.is_error)
        if not out.is_error:
            if parts.memory is not None:
                with rc.unfenced():  # a store may block (SQLite locks): let cancel take over
                    self._remember(st)
            return None
        if parts.reflector is None and parts.recovery is None:
            return None
        return plan_retry(parts, run, turn, st)

    def _denied(self, run: RunState, call: ToolCallPart, text: str) -> ToolResultPart:
        """The answer to a call a person denied (or whose approval timed out): it never ran."""
        out = ToolOutput.error(text)
        count_answer(self.parts.loop_detector, run.events, call, out)
        return ToolResultPart(call.id, call.name, out.text, True)

    def _remember(self, st: CallState) -> None:
        global _trajectory_entry
        memory = self.parts.memory
        if memory is None:
            return
        try:
            if _trajectory_entry is None:
                from loopctl.context.memory import trajectory_entry

                _trajectory_entry = trajectory_entry
            # tool={name}; input={JSON, 500 chars}; result={500 chars}, tagged "trajectory"
            memory.store(_trajectory_entry(st.resolved, st.call.input, st.out.text))
        except Exception:
            log.exception("memory store of a tool trajectory failed (tool %r)", st.resolved)

    # -- recovery ------------------------------------------------------------------

    def _prepare_retry(self, run: RunState, turn: int, st: CallState, retry: Retry) -> None:
        """Ceiling check, cancel-aware backoff, correction (admitted again); then ``attempt + 1``.

        An approval covers the call as it was approved: a correction that
        changes it into a call needing approval is refused, not run.
        """
        rc = run.rc
        if st.attempt + 1 > MAX_RETRIES:
            raise ToolRecoveryExhausted(st.original.name, MAX_RETRIES + 1)
        delay = retry.delay if retry.delay > 0 else 0.0
        if delay > 0:
            with rc.unfenced():
                self.sleep(rc.cancel, delay)
        self._check_cancel(rc)
        apply_correction(self.parts, run, turn, st)
        st.attempt += 1


__all__ = ["Dispatcher", "result_hash"]
