"""A process that runs a loop on a stored session (for ``test_sessions_processes.py``).

``python session_child.py KIND WHERE PREFIX SESSION MODE``:

- ``hold``: runs a loop whose tool prints ``in-tool`` and waits for a line on
  stdin (the test's gate), then finishes the run and prints ``done``;
- ``try``: runs a one-reply loop and prints ``busy`` (``SessionBusy``) or ``ran``;
- ``exit``: starts a run on the session through a ``RunRegistry`` whose model
  call prints ``in-model`` and never returns, then, at a line on stdin,
  leaves the interpreter with ``sys.exit(0)`` while that run is in flight.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from session_support import make_store

from loopctl import BareLoop, RunRegistry, SessionBusy, tool
from loopctl.messages import ModelResponse
from loopctl.testing import ScriptedClient, call, reply


def exit_mid_run(store: Any, sid: str) -> None:
    never = threading.Event()

    def stuck(request: Any) -> ModelResponse:
        print("in-model", flush=True)
        never.wait(120)  # the process exits first
        return reply("never")

    registry = RunRegistry(session_store=store)
    registry.start(BareLoop(ScriptedClient([stuck])), "in flight", session_id=sid)
    sys.stdin.readline()
    sys.exit(0)  # an orderly exit, the run still in flight on its (daemon) thread


def main() -> None:
    kind, where, prefix, sid, mode = sys.argv[1:6]
    kw = {"prefix": prefix} if kind == "redis" else {}
    store = make_store(kind, where, **kw)

    @tool
    def gate() -> str:
        """Waits for the test's line on stdin."""
        print("in-tool", flush=True)
        sys.stdin.readline()
        return "released"

    if mode == "exit":
        exit_mid_run(store, sid)
    if mode == "hold":
        loop = BareLoop(ScriptedClient([call("gate"), reply("child done")]), [gate]).with_session(store.session(sid))
        loop.run("from child")
        print("done", flush=True)
    else:
        loop = BareLoop(ScriptedClient([reply("child ran")])).with_session(store.session(sid))
        try:
            loop.run("child try")
        except SessionBusy:
            print("busy", flush=True)
        else:
            print("ran", flush=True)
    loop.close()
    store.close()


if __name__ == "__main__":
    main()
