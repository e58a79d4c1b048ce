"""Tool dispatch: sequential or parallel waves, results in request order.

Events stay on the run's thread: in a parallel wave every ``on_tool_pre``
fires, the calls run on the loop's ``ThreadPoolExecutor``, then every
``on_tool_post`` fires in request order. A lone call runs inline (no
hand-off). Blocking work runs unfenced; cancel is checked before each
call, between calls and waves, and while a wave is awaited. A hard error
(cancel, loop stop, recovery exhausted) ends the batch and the run.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Optional

from loopctl.errors import Cancelled
from loopctl.hooks import ToolHookContext
from loopctl.messages import ToolCallPart, ToolResultPart
from loopctl.tools.base import ToolContext, ToolOutput

if TYPE_CHECKING:
    from loopctl.driver.handle import RunContext
    from loopctl.driver.loop import BareLoop


def result_hash(text: str) -> str:
    """A short, stable, non-cryptographic hash of a result's text."""
    return format(zlib.crc32(text.encode("utf-8", "surrogatepass")), "08x") if text else ""


class Dispatcher:
    """Runs one turn's tool calls for a loop."""

    def __init__(self, loop: BareLoop) -> None:
        self.loop = loop

    # -- one call's stages (run on the run's thread unless noted) -------------

    def _context(self, rc: RunContext, turn: int, call: ToolCallPart) -> ToolContext:
        loop = self.loop
        return ToolContext(
            loop.session.id,
            rc.run.id,
            turn,
            call.id,
            loop._ensure_temp_dir(),
            rc.cancel,
            loop.tool_extras,
        )

    def _blocked(self, rc: RunContext, turn: int, call: ToolCallPart) -> Optional[ToolResultPart]:
        hooks = self.loop._hooks
        if hooks is None or not hooks.hooks:
            return None
        ctx = ToolHookContext(self.loop.session.id, rc.run.id, turn, call.id, call.name, call.input)
        decision = hooks.pre_tool_use(ctx)
        if not decision.blocks:
            return None
        reason = decision.reason or "blocked by hook"
        return ToolResultPart(call.id, call.name, f"Tool '{call.name}' blocked: {reason}", True)

    def _execute(self, call: ToolCallPart, ctx: ToolContext) -> ToolOutput:
        """Run the tool (any thread): registry lookup, invoke, never raises."""
        tool = self.loop._tools.get(call.name)
        if tool is None:
            names = ", ".join(self.loop._tools.names()[:10])
            return ToolOutput.error(f"Tool not found: {call.name}. Available: {names}")
        try:
            return tool.invoke(call.input, ctx)
        except Exception as exc:  # invoke converts; this guards custom overrides
            return ToolOutput.error(f"Tool '{call.name}' raised {type(exc).__name__}: {exc}")

    def _post(
        self, rc: RunContext, turn: int, call: ToolCallPart, out: ToolOutput, attempt: int, ms: float
    ) -> ToolResultPart:
        loop = self.loop
        loop._emitter.tool_post(
            turn, call.id, call.name, attempt, out.is_error, ms, out.text, result_hash(out.text)
        )
        hooks = loop._hooks
        if hooks is not None and hooks.hooks:
            ctx = ToolHookContext(loop.session.id, rc.run.id, turn, call.id, call.name, call.input)
            hooks.post_tool_use(ctx, out.text, out.is_error)
        return ToolResultPart(call.id, call.name, out.text, out.is_error)

    # -- batches ---------------------------------------------------------------

    def dispatch(
        self, rc: RunContext, turn: int, calls: Sequence[ToolCallPart]
    ) -> list[ToolResultPart]:
        """Run ``calls``; results in the same order.

        Raises:
            Cancelled: the signal fired before a call, between calls or waves,
                or while a wave was running.
        """
        if not calls:
            return []
        parallel = self.loop._run_config_now.parallel
        if parallel.mode == "sequential" or parallel.max_concurrency == 1 or len(calls) == 1:
            return [self._run_one(rc, turn, c) for c in calls]
        results: list[Optional[ToolResultPart]] = [None] * len(calls)
        for wave in self._plan_waves(calls, parallel.max_concurrency):
            if rc.cancel.is_cancelled():
                raise Cancelled(self.loop._cancel.reason)
            if len(wave) == 1:
                i = wave[0]
                results[i] = self._run_one(rc, turn, calls[i])
            else:
                for i, r in zip(wave, self._run_wave(rc, turn, [calls[i] for i in wave])):
                    results[i] = r
        return results  # type: ignore[return-value]

    def _run_one(self, rc: RunContext, turn: int, call: ToolCallPart) -> ToolResultPart:
        if rc.cancel.is_cancelled():
            raise Cancelled(self.loop._cancel.reason)
        self.loop._emitter.tool_pre(turn, call.id, call.name, 0)
        blocked = self._blocked(rc, turn, call)
        if blocked is not None:
            return blocked
        ctx = self._context(rc, turn, call)
        t0 = time.perf_counter()
        with rc.unfenced():
            out = self._execute(call, ctx)
        if rc.cancel.is_cancelled():
            raise Cancelled(self.loop._cancel.reason)
        return self._post(rc, turn, call, out, 0, (time.perf_counter() - t0) * 1000.0)

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
            key = tool.resource_key(call.input) if tool is not None else None
            if not safe:
                if current:
                    waves.append(current)
                waves.append([i])
                current, keys = [], set()
                continue
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
        em = self.loop._emitter
        for c in calls:
            em.tool_pre(turn, c.id, c.name, 0)
        slots: list[Optional[ToolResultPart]] = [None] * len(calls)
        runnable: list[int] = []
        for k, c in enumerate(calls):
            blocked = self._blocked(rc, turn, c)
            if blocked is not None:
                slots[k] = blocked
            else:
                runnable.append(k)
        contexts = {k: self._context(rc, turn, calls[k]) for k in runnable}
        outs: dict[int, tuple[ToolOutput, float]] = {}
        lock = threading.Lock()
        all_done = threading.Event()
        remaining = [len(runnable)]

        def work(k: int) -> None:
            t0 = time.perf_counter()
            out = self._execute(calls[k], contexts[k])
            with lock:
                outs[k] = (out, (time.perf_counter() - t0) * 1000.0)
                remaining[0] -= 1
                if remaining[0] == 0:
                    all_done.set()

        if runnable:
            pool = self.loop._executor()
            wake = all_done.set
            rc.cancel.add_listener(wake)
            try:
                with rc.unfenced():
                    for k in runnable:
                        pool.submit(work, k)
                    all_done.wait()
            finally:
                rc.cancel.remove_listener(wake)
        if rc.cancel.is_cancelled():
            raise Cancelled(self.loop._cancel.reason)
        for k in runnable:
            out, ms = outs[k]
            slots[k] = self._post(rc, turn, calls[k], out, 0, ms)
        return slots  # type: ignore[return-value]


__all__ = ["Dispatcher", "result_hash"]
