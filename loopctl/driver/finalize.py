"""finalize(): the single exit door every run leaves through, in the seed's order.

1. record the end time and the stop reason on the ``Run``;
2. success: commit pending and consolidate memory (its error is logged);
   failure: discard pending (history stays as before the run, except for a
   compaction the run completed);
3. clear a pending loop-detection stop that never fired;
4. close a phase that was cut short with a failed ``on_turn_end``, then
   ``on_run_end`` (run-end hooks first, then observers);
5. re-arm the cancel signal, last, and free the loop for the next run.

The steering slot closes first, so a push from ``on_run_end`` is refused;
the approval slot with it (calls still waiting are denied "run ended" and
reported by ``on_approval_resolved`` before the run's last events).
Steps 5's bookkeeping runs even if an observer or a store misbehaves.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Optional

from loopctl.approvals import RUN_ENDED
from loopctl.driver.approval_gate import report_unreported
from loopctl.errors import LoopError

if TYPE_CHECKING:
    from loopctl.driver.handle import RunContext
    from loopctl.driver.loop import BareLoop

log = logging.getLogger("loopctl")


def finalize_run(loop: BareLoop, rc: RunContext, error: Optional[LoopError]) -> None:
    """Close the run's steering slot, record, commit or discard, notify, re-arm."""
    with loop._busy:
        rc.ending = True
    try:
        loop._steering._close_and_seal()
        rc.approvals.close(RUN_ENDED)  # calls still waiting are denied "run ended"
        run = rc.run
        run.end = time.time()
        run.stop_reason = error
        m = loop._machine
        if error is None:
            m.commit_pending()
            if loop._memory is not None:
                try:
                    loop._memory.consolidate()
                except Exception:
                    log.exception("memory consolidate failed after run %s", run.id)
        else:
            m.discard_pending()
            error.run = run
        if loop._loop_detector is not None:
            loop._loop_detector.consume_pending_stop()
        report_unreported(rc.approvals, loop._emitter, loop._session.id)
        phase = loop._open_phase
        if phase is not None:  # a phase cut short (cancel, an escape): close it, failed
            loop._open_phase = None
            turn, name, t0, in_tok, out_tok, stop, ctx_tokens = phase
            loop._emitter.turn_end(
                turn,
                name,
                False,
                str(error) if error is not None else "run ended",
                (time.perf_counter() - t0) * 1000.0,
                in_tok,
                out_tok,
                stop,
                ctx_tokens,
                loop._window(),
            )
        loop._emitter.run_end(
            run.input,
            error is None,
            None if error is None else str(error),
            run.turn_count,
            (run.end - run.start) * 1000.0,
        )
    finally:
        if rc.listener is not None:
            loop._cancel.remove_listener(rc.listener)
        rc.error = error
        with loop._busy:
            loop._cancel.reset()  # last: one cancel = one cancelled run
            loop._emitter.tap = None  # before the loop is free: the next run sets its own
            loop._emitter.run_id = ""  # events between runs belong to no run
            loop._active = None
            rc.finished = True


__all__ = ["finalize_run"]
