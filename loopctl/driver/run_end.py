"""RunEnding: a run's ending point and its single exit door (``RunDriver``'s last handlers).

``reach_end`` is the one place a run reaches its ending point, at ``Done``
or as an error ends it: from there on no cancel reaches it, and a cancel
taken before it (or one a host's ``at_end`` hook reports) is how the run
ends. ``_finalize`` is the exit every run passes, its steps in order.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

from loopctl.approvals import RUN_ENDED
from loopctl.approvals.gate import report_unreported
from loopctl.driver.run_state import RunState
from loopctl.driver.subagent_runs import hand_over
from loopctl.errors import Cancelled, LoopError, MaxTurnsExceeded, scrub_error
from loopctl.machine import CancelledOutcome, Failed, MaxTurnsReached, Outcome
from loopctl.records import Run

log = logging.getLogger("loopctl")


class RunEnding(RunState):
    """The end of a run: its ending point, the error a terminal outcome raises, ``_finalize``."""

    __slots__ = ()

    def reach_end(self, error: Optional[LoopError] = None) -> Optional[Cancelled]:
        """The run's ending point, at ``Done`` or as ``error`` ends it (mutates): no cancel reaches it after.

        Returns the ``Cancelled`` the run ends with instead, if any: a cancel
        that reached it before this point (whatever else was ending it), or
        the one a host's ``at_end`` returns (a cancel the host took but had
        not delivered). The hook is asked first, once, fenced (as a
        checkpoint sink is), unless the run is cancelled already; one that
        raises is logged and counts as None.
        """
        rc = self.rc
        cancel = rc.cancel
        hook, self.at_end = self.at_end, None  # asked once, whichever way the run ends
        stopped: Optional[Cancelled] = None
        if hook is not None and not isinstance(error, Cancelled) and not cancel.is_cancelled():
            try:
                stopped = hook()
            except Exception:
                log.exception("run %s: the host's at_end hook failed; the run ends as it would", rc.run.id)
        if self.pass_ending_point() and stopped is None and not isinstance(error, Cancelled):
            stopped = Cancelled(cancel.reason)  # taken before ``ending``: the run ends cancelled
        return stopped

    def pass_ending_point(self) -> bool:
        """Mark the run as past its ending point, once (mutates); True if it took a cancel.

        Under the lock ``loop.cancel()`` takes: a cancel it accepted (True)
        came before, and is the run's. Whether the signal had fired then is
        kept (``took_cancel``): re-arming the signal clears that cancel
        only; one fired after this point stays for the next run.
        """
        rc = self.rc
        with self.busy:
            if not rc.ending:
                rc.ending = True
                self.took_cancel = rc.cancel.is_cancelled()
            return self.took_cancel

    def keeps_later_cancel(self) -> bool:
        """True when a cancel fired on the signal now is the next run's (past the end, none taken)."""
        return self.rc.ending and not self.took_cancel

    def error_for(self, outcome: Outcome) -> LoopError:
        """The error a terminal outcome raises."""
        if type(outcome) is MaxTurnsReached:
            return MaxTurnsExceeded(self.config.max_turns)
        if type(outcome) is CancelledOutcome:
            return Cancelled(self.rc.cancel.reason)
        if type(outcome) is Failed:
            return outcome.error
        return LoopError(f"unmapped terminal outcome: {outcome!r}")

    def set_error_state(self, error: LoopError) -> None:
        """Tell the brain how the run ended: cancelled, or failed with ``error``."""
        if isinstance(error, Cancelled):
            self.machine.cancel()
        else:
            self.machine.fail(error)

    def _finalize(self, error: Optional[LoopError]) -> None:
        """The single exit door; its steps run in this order.

        0. a completed run of a stored session writes its messages (a
        failed write makes it a failed run); 1. record end time and stop
        reason; 2. success: commit pending and
        consolidate memory (its error is logged); failure: discard pending;
        3. clear a loop-detection stop that never fired; 4. close a phase a
        cancel cut short (failed ``on_turn_end``), then ``on_run_end``
        (hooks first, then observers); 5. re-arm the cancel signal, last,
        and free the loop. The steering slot closes first, so a push from
        ``on_run_end`` is refused; the approval slot with it (calls still
        waiting are denied "run ended", reported by ``on_approval_resolved``
        before the run's last events).
        """
        rc = self.rc
        self.pass_ending_point()  # a run taken over on cancel passes it here
        if rc.subagents is not None:  # a cancel cut a delegation short: let its runs end first
            rc.subagents.settle()
        tally = self.tally
        if error is not None and tally is not None and not tally.abandoned:
            # The body itself ends a run whose cancel woke it from a wave before
            # the takeover could: the tools it gave up on are abandoned all the same.
            self.resources.abandon(tally)
        try:
            self.steering.close()
            rc.approvals.close(RUN_ENDED)
            hand_over(rc.run)  # a sub-agent run settles with its caller before anything that may block
            if error is None and self.link is not None:
                error = self.link.save(self.machine)  # a failed write fails the run
            run = rc.run
            run.end = end = time.time()
            run.stop_reason = error
            self._settle(run, error)
            self._report_end(run, error, end)
        finally:
            self.owner._release(rc, error, self.keeps_later_cancel())

    def _settle(self, run: Run, error: Optional[LoopError]) -> None:
        """Finalize's step 2-3: keep or drop the run's pending messages; clear a stop never fired."""
        m = self.machine
        parts = self.parts
        if error is None:
            m.commit_pending()
            if parts.memory is not None:
                try:
                    parts.memory.consolidate()
                except Exception:
                    log.exception("memory consolidate failed after run %s", run.id)
        else:
            m.discard_pending()
            scrub_error(error)  # the run's error and its causes leave masked, whoever made them
            error.run = run
        if parts.loop_detector is not None:
            parts.loop_detector.consume_pending_stop()

    def _report_end(self, run: Run, error: Optional[LoopError], end: float) -> None:
        """Finalize's step 4: unreported approvals, a phase cut short, then ``run_end``."""
        em = self.events
        report_unreported(self.rc.approvals, em, em.session_id)
        phase = em.open_phase
        if phase is not None:  # a phase cut short (cancel, an escape): close it, failed
            em.close_phase(phase, str(error) if error is not None else "run ended", _class_name(error))
        em.run_end(
            run.input,
            error is None,
            None if error is None else str(error),
            run.turn_count,
            (end - run.start) * 1000.0,
            _class_name(error),
        )


def _class_name(error: Optional[BaseException]) -> Optional[str]:
    """The ``error_type`` of an end event: the error's class name, None on success."""
    return None if error is None else type(error).__name__


__all__ = ["RunEnding"]
