"""RunThread: the thread a run's body executes on.

One thread per run, named ``loopctl-run-<id>``, started by ``BareLoop``. It
runs the body in the run's copied ``contextvars`` context and, once the run
is over, drops everything that would keep the ended run alive (the context,
the driver, the frames of its error's traceback), so refcounting frees it.
"""

from __future__ import annotations

import threading
from typing import Optional

from loopctl.driver.handle import RunContext
from loopctl.driver.run import RunDriver
from loopctl.errors import release_frames


class RunThread(threading.Thread):
    """A run's thread: the body, in the run's copied context.

    A subclass rather than ``target=ctx.run, args=(...)``: the bound method
    and the args tuple would be two more objects per run in flight.
    """

    def __init__(self, rc: RunContext, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._rc: Optional[RunContext] = rc

    def run(self) -> None:
        rc = self._rc
        self._rc = None
        assert rc is not None and rc.context is not None
        try:
            # The plain function and its argument, not ``rc.driver.body``: a
            # bound method would be one more object for as long as the run lasts.
            rc.context.run(RunDriver.body, rc.driver)
        finally:
            # The run is over (or its takeover finalized it): drop the
            # context <-> driver cycle and the locals its error's traceback
            # holds, so refcounting frees the run at once.
            rc.driver = None
            release_frames(rc.error)
            del rc  # this frame keeps no reference to the ended run


__all__ = ["RunThread"]
