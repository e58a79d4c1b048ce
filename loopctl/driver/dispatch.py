"""Tool dispatch: sequential or parallel waves, results in request order.

Every attempt of a call goes through one pipeline (reference §5.5), split
in three phases so that events and state stay on the run's thread:

- begin (run thread, fenced): cancel check, ``on_tool_pre``, pre-tool hooks
  (a block is a soft error with no ``on_tool_post``), the loop detector's
  pre-check (a pending stop is a hard ``LoopDetected``), the health gate
  (keyed on the requested name; an open breaker is a soft refusal);
- execute (unfenced; inline for a lone call, on the loop's pool for a
  parallel wave): through ``loop._pipeline`` when set, else the registry;
- finish (run thread, fenced): detector record, ``on_tool_post``, post-tool
  hooks, health record (under the resolved name), memory trajectory
  (successful calls only), then recovery: a ``Retry`` waits (cancel-aware,
  unfenced), applies the correction and runs the whole pipeline again with
  ``attempt + 1``; more than five retries is ``ToolRecoveryExhausted``.

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
import zlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Callable, Optional

import attrs

from loopctl.driver.checkpoint import settle
from loopctl.errors import Cancelled, ToolRecoveryExhausted
from loopctl.hooks import ToolHookContext
from loopctl.messages import ToolCallPart, ToolResultPart
from loopctl.observers import ToolPost
from loopctl.tools.base import ToolContext, ToolOutput
from loopctl.tools.pipeline import DispatchContext, invoke_tool, not_found_text
from loopctl.tools.recovery import (
    MAX_RETRIES,
    CorrectionKind,
    ExponentialBackoffRecovery,
    Fail,
    FailureAnalysis,
    NoopReflector,
    RecoveryAction,
    ReflectionContext,
    Retry,
)

if TYPE_CHECKING:
    from loopctl.driver.handle import RunContext
    from loopctl.driver.loop import BareLoop

log = logging.getLogger("loopctl")

_RUN, _BLOCKED, _GATED = 0, 1, 2
_trajectory_entry: Any = None  # loopctl.context.memory.trajectory_entry, imported on first use


def result_hash(text: str) -> str:
    """A short, stable, non-cryptographic hash of a result's text."""
    return format(zlib.crc32(text.encode("utf-8", "surrogatepass")), "08x") if text else ""


def _cancel_wait(cancel: Any, delay: float) -> bool:
    return bool(cancel.wait(delay))


class _Call:
    """One call's state across its attempts."""

    __slots__ = ("original", "call", "attempt", "ctx", "out", "ms", "resolved", "correction")

    def __init__(self, call: ToolCallPart) -> None:
        self.original = call
        self.call = call
        self.attempt = 0
        self.ctx: Optional[ToolContext] = None
        self.out = ToolOutput("")
        self.ms = 0.0
        self.resolved = call.name
        self.correction: Any = None

    def result(self) -> ToolResultPart:
        o = self.original
        return ToolResultPart(o.id, o.name, self.out.text, self.out.is_error)


class Dispatcher:
    """Runs one turn's tool calls for a loop.

    Attributes:
        sleep: ``sleep(cancel, seconds) -> bool`` waits between recovery
            retries (True if cancelled meanwhile); tests inject a fake.
    """

    def __init__(self, loop: BareLoop) -> None:
        self.loop = loop
        self.sleep: Callable[[Any, float], bool] = _cancel_wait

    # -- batches ---------------------------------------------------------------

    def dispatch(
        self, rc: RunContext, turn: int, calls: Sequence[ToolCallPart]
    ) -> list[ToolResultPart]:
        """Run ``calls``; results in the same order.

        Raises:
            Cancelled: the signal fired before a call, between calls or waves,
                while a wave was running, or during a retry's backoff.
            LoopDetected: the loop detector's stop was pending.
            ToolRecoveryExhausted: a call needed more than five retries.
        """
        if not calls:
            return []
        parallel = self.loop._run_config_now.parallel
        loop = self.loop
        if parallel.mode == "sequential" or parallel.max_concurrency == 1 or len(calls) == 1:
            out = []
            for c in calls:
                out.append(self._run_one(rc, turn, _Call(c)))
                settle(loop, rc, out[-1:])
            return out
        results: list[Optional[ToolResultPart]] = [None] * len(calls)
        for wave in self._plan_waves(calls, parallel.max_concurrency):
            self._check_cancel(rc)
            if len(wave) == 1:
                i = wave[0]
                results[i] = self._run_one(rc, turn, _Call(calls[i]))
            else:
                for i, r in zip(wave, self._run_wave(rc, turn, [calls[i] for i in wave])):
                    results[i] = r
            settle(loop, rc, [results[i] for i in wave])
        return results  # type: ignore[return-value]

    def _check_cancel(self, rc: RunContext) -> None:
        if rc.cancel.is_cancelled():
            raise Cancelled(self.loop._cancel.reason)

    def _run_one(self, rc: RunContext, turn: int, st: _Call) -> ToolResultPart:
        """The whole per-call pipeline, inline on the run's thread, retries included."""
        while True:
            kind = self._begin(rc, turn, st)
            if kind == _BLOCKED:
                return st.result()
            if kind == _RUN:
                with rc.unfenced():
                    self._execute(turn, st)
                self._check_cancel(rc)
            retry = self._finish(rc, turn, st, kind == _GATED)
            if retry is None:
                return st.result()
            self._prepare_retry(rc, st, retry)

    def _plan_waves(self, calls: Sequence[ToolCallPart], limit: int) -> list[list[int]]:
        """Group call indices into waves, keeping request order across waves.

        Safe calls join the current wave up to ``limit`` unless their resource
        key is already in it; an unsafe call runs alone.
        """
        registry = self.loop._tools
        waves: list[list[int]] = []
        current: list[int] = []
        keys: set[str] = set()
        for i, call in enumerate(calls):
            tool = registry.get(call.name)
            safe = tool is not None and tool.is_concurrency_safe(call.input)
            if not safe:
                if current:
                    waves.append(current)
                waves.append([i])
                current, keys = [], set()
                continue
            key = tool.resource_key(call.input)  # type: ignore[union-attr]
            if len(current) >= limit or (key is not None and key in keys):
                waves.append(current)
                current, keys = [], set()
            current.append(i)
            if key is not None:
                keys.add(key)
        if current:
            waves.append(current)
        return waves

    def _run_wave(
        self, rc: RunContext, turn: int, calls: Sequence[ToolCallPart]
    ) -> list[ToolResultPart]:
        states = [_Call(c) for c in calls]
        kinds = [self._begin(rc, turn, st) for st in states]
        runnable = [st for st, k in zip(states, kinds) if k == _RUN]
        if runnable:
            self._execute_together(rc, turn, runnable)
        self._check_cancel(rc)
        slots: list[Optional[ToolResultPart]] = [None] * len(states)
        retries: list[tuple[int, Retry]] = []
        for k, (st, kind) in enumerate(zip(states, kinds)):
            if kind == _BLOCKED:
                slots[k] = st.result()
                continue
            retry = self._finish(rc, turn, st, kind == _GATED)
            if retry is None:
                slots[k] = st.result()
            else:
                retries.append((k, retry))
        for k, retry in retries:
            st = states[k]
            self._prepare_retry(rc, st, retry)
            slots[k] = self._run_one(rc, turn, st)
        return slots  # type: ignore[return-value]

    def _execute_together(self, rc: RunContext, turn: int, states: list[_Call]) -> None:
        lock = threading.Lock()
        all_done = threading.Event()
        remaining = [len(states)]

        def work(st: _Call) -> None:
            try:
                if st.ctx is not None and st.ctx.cancel.is_cancelled():
                    return  # cancelled while it waited for a worker: never start it
                self._execute(turn, st)
            finally:
                with lock:
                    remaining[0] -= 1
                    if remaining[0] == 0:
                        all_done.set()

        pool = self.loop._executor()
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

    def _hook_ctx(self, rc: RunContext, turn: int, st: _Call) -> ToolHookContext:
        c = st.call
        return ToolHookContext(self.loop.session.id, rc.run.id, turn, c.id, c.name, c.input, st.attempt)

    def _begin(self, rc: RunContext, turn: int, st: _Call) -> int:
        """Run thread: cancel check, pre event, hooks, detector pre-check, health gate."""
        self._check_cancel(rc)
        loop = self.loop
        call = st.call
        loop._emitter.tool_pre(turn, call.id, call.name, st.attempt)
        hooks = loop._hooks
        if hooks is not None and hooks.hooks:
            decision = hooks.pre_tool_use(self._hook_ctx(rc, turn, st))
            if decision.blocks:
                st.out = ToolOutput.error(f"Tool '{call.name}' blocked: {decision.reason or 'blocked by hook'}")
                return _BLOCKED
        detector = loop._loop_detector
        if detector is not None:
            stop = detector.pre_check()
            if stop is not None:
                raise stop
        health = loop._health
        if health is not None:
            refusal = health.check(call.name)
            if refusal is not None:
                st.out, st.ms, st.resolved = ToolOutput.error(refusal), 0.0, call.name
                return _GATED
        st.ctx = ToolContext(
            loop.session.id, rc.run.id, turn, call.id, loop._ensure_temp_dir(), rc.cancel, loop.tool_extras
        )
        self._check_cancel(rc)  # biased: a cancel from on_tool_pre or a hook means it never starts
        return _RUN

    def _execute(self, turn: int, st: _Call) -> None:
        """Any thread, unfenced: run the attempt; never raises."""
        loop = self.loop
        call = st.call
        t0 = time.perf_counter()
        pipeline = loop._pipeline
        try:
            if pipeline is None:
                tool = loop._tools.get(call.name)
                if tool is None:
                    out = ToolOutput.error(not_found_text(call.name, loop._tools))
                else:
                    out = invoke_tool(tool, call.input, st.ctx)
                st.resolved = call.name
            else:
                d = DispatchContext(call.name, call.input, call.name, call.id, turn, st.attempt, st.ctx, loop._tools)
                out = pipeline.dispatch(d)
                st.resolved = d.tool_name
        except Exception as exc:  # a custom pipeline that raises; never kill the run
            out = ToolOutput.error(f"Tool '{call.name}' raised {type(exc).__name__}: {exc}")
        st.out = out
        st.ms = (time.perf_counter() - t0) * 1000.0

    def _finish(self, rc: RunContext, turn: int, st: _Call, gated: bool) -> Optional[Retry]:
        """Run thread: record, post event, hooks, health, memory, recovery.

        Returns a ``Retry`` when the call should run again, else None.
        """
        loop = self.loop
        call, out = st.call, st.out
        detector = loop._loop_detector
        if detector is not None and not gated:
            found = detector.record(call.name, call.input, out.text, out.is_error)
            if found is not None:
                loop._emitter.loop_detected(found[0], found[1])
        em = loop._emitter
        if em.wants(ToolPost):  # hashing costs more than the check
            em.tool_post(turn, call.id, call.name, st.attempt, out.is_error, st.ms, out.text, result_hash(out.text))
        hooks = loop._hooks
        if hooks is not None and hooks.hooks:
            hooks.post_tool_use(self._hook_ctx(rc, turn, st), out.text, out.is_error)
        if gated:
            return None  # it never ran: nothing to record, nothing to retry
        health = loop._health
        if health is not None:
            health.record(st.resolved, not out.is_error)
        if not out.is_error:
            if loop._memory is not None:
                with rc.unfenced():  # a store may block (SQLite locks): let cancel take over
                    self._remember(st)
            return None
        if loop._reflector is None and loop._recovery is None:
            return None
        return self._recover(rc, turn, st)

    def _remember(self, st: _Call) -> None:
        global _trajectory_entry
        try:
            if _trajectory_entry is None:
                from loopctl.context.memory import trajectory_entry

                _trajectory_entry = trajectory_entry
            # tool={name}; input={JSON, 500 chars}; result={500 chars}, tagged "trajectory"
            self.loop._memory.store(_trajectory_entry(st.resolved, st.call.input, st.out.text))
        except Exception:
            log.exception("memory store of a tool trajectory failed (tool %r)", st.resolved)

    # -- recovery ------------------------------------------------------------------

    def _recover(self, rc: RunContext, turn: int, st: _Call) -> Optional[Retry]:
        loop = self.loop
        reflector = loop._reflector if loop._reflector is not None else NoopReflector()
        strategy = loop._recovery if loop._recovery is not None else ExponentialBackoffRecovery()
        limit = getattr(strategy, "max_attempts", MAX_RETRIES)
        max_attempts = limit if isinstance(limit, int) else MAX_RETRIES
        tool = loop._tools.get(st.call.name)
        schema = tool.schema() if tool is not None else None
        rctx = ReflectionContext(st.attempt, max_attempts, loop._run_input, turn, st.call.id)
        call, text = st.call, st.out.text
        with rc.unfenced():  # a reflector may ask a model: blocking work
            analysis, action = _decide(reflector, strategy, text, call, schema, rctx, st.attempt, max_attempts)
        if type(action) is not Retry:
            return None
        st.correction = analysis.correction
        return action

    def _prepare_retry(self, rc: RunContext, st: _Call, retry: Retry) -> None:
        """Ceiling check, cancel-aware backoff, correction; then ``attempt + 1``."""
        if st.attempt + 1 > MAX_RETRIES:
            raise ToolRecoveryExhausted(st.original.name, MAX_RETRIES + 1)
        delay = retry.delay if retry.delay > 0 else 0.0
        if delay > 0:
            with rc.unfenced():
                self.sleep(rc.cancel, delay)
        self._check_cancel(rc)
        st.call = _corrected(st.call, st.correction)
        st.correction = None
        st.attempt += 1


def _decide(
    reflector: Any,
    strategy: Any,
    error: str,
    call: ToolCallPart,
    schema: Any,
    rctx: ReflectionContext,
    attempt: int,
    max_attempts: int,
) -> tuple[FailureAnalysis, RecoveryAction]:
    try:
        analysis = reflector.analyze(error, call.name, call.input, schema, rctx)
        if not isinstance(analysis, FailureAnalysis):
            raise TypeError(f"analyze() returned {type(analysis).__name__}, not FailureAnalysis")
    except Exception as exc:
        log.exception("reflector failed on tool %r; treated as not recoverable", call.name)
        return FailureAnalysis(False, f"reflector failed: {exc}"), Fail("reflector failed")
    try:
        action = strategy.decide(analysis, attempt, max_attempts)
    except Exception as exc:
        log.exception("recovery strategy failed on tool %r; giving up", call.name)
        return analysis, Fail(f"strategy failed: {exc}")
    return analysis, action


def _corrected(call: ToolCallPart, correction: Any) -> ToolCallPart:
    """Apply an input fix or a tool change; anything else (or a bad fix) is skipped."""
    if correction is None:
        return call
    kind = getattr(correction, "kind", None)
    if kind == CorrectionKind.INPUT_FIX:
        new = getattr(correction, "modified_input", None)
        if isinstance(new, Mapping):
            return attrs.evolve(call, input=dict(new))
        log.warning("input fix for tool %r is not an object (%r); retrying uncorrected", call.name, new)
    elif kind == CorrectionKind.TOOL_CHANGE:
        name = getattr(correction, "alternative_tool", None)
        if isinstance(name, str) and name:
            return attrs.evolve(call, name=name)
        log.warning("tool change for %r names no tool; retrying uncorrected", call.name)
    return call


__all__ = ["Dispatcher", "result_hash"]
