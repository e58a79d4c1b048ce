"""A cancelled run on a stored session ends at once, whatever the store is doing.

Its end never waits for the store: the lease goes back on the lease's own
thread just after the run has ended. Until it has, the loop's next run (or
any run through the same store object) waits for it instead of meeting a
spurious ``SessionBusy``, and ``store.close()`` waits for it too, so the
lease never outlives a closed store.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest
from support import WAIT, Gate, run_in_thread

from loopctl import BareLoop, Cancelled, Tool, ToolContext
from loopctl.sessions import SQLiteSessionStore
from loopctl.testing import ScriptedClient, call, reply

#: The cancel bound, with room for a loaded machine; the store's own wait is 30 s.
PROMPT_S = 1.0


class WaitForCancel(Tool):
    """Signals that the run is in its tool call, then waits for the run's cancel."""

    name = "wait"
    description = "Waits for the cancel."

    def __init__(self) -> None:
        self.entered = threading.Event()

    def call(self, input: Any, ctx: ToolContext) -> str:
        self.entered.set()
        ctx.cancel.wait(WAIT)
        return "stopped"


def waiting_loop(store: SQLiteSessionStore, then: str = "never") -> tuple[BareLoop, WaitForCancel]:
    tool = WaitForCancel()
    client = ScriptedClient([call("wait"), reply(then)])
    return BareLoop(client, [tool]).with_session(store.session("s")), tool


def cancelled_loop(store: SQLiteSessionStore, then: str = "never") -> BareLoop:
    """A loop whose started run was cancelled in its tool call and has ended ``Cancelled``."""
    loop, tool = waiting_loop(store, then)
    handle = loop.start("go")
    assert tool.entered.wait(WAIT)
    assert handle.cancel("stop")
    with pytest.raises(Cancelled):
        handle.result(PROMPT_S)  # its lease may still be being given back
    return loop


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteSessionStore]:
    s = SQLiteSessionStore(tmp_path / "s.db")
    yield s
    s.close()


class GatedRelease:
    """Holds the store's lease release until ``gate`` opens (a store that is slow to answer)."""

    def __init__(self, store: SQLiteSessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.gate = Gate()
        backend = store.backend
        real = backend.release

        def release(session_id: str, token: str) -> None:
            self.gate.pass_through()
            real(session_id, token)

        monkeypatch.setattr(backend, "release", release)
        # Whoever waits for a lease being given back says so first.
        self.waiting = threading.Event()
        handbacks = store.handbacks
        real_wait = handbacks.wait

        def wait(session_id: Optional[str], timeout: float) -> bool:
            self.waiting.set()
            return real_wait(session_id, timeout)

        monkeypatch.setattr(handbacks, "wait", wait)


@pytest.mark.parametrize("how", ["start", "run"])
def test_a_cancelled_run_ends_at_once_while_another_connection_holds_the_store_locked(
    store: SQLiteSessionStore, how: str
) -> None:
    loop, tool = waiting_loop(store)
    if how == "start":
        handle = loop.start("go")
        running: Optional[threading.Thread] = None
        errors: list[BaseException] = []
    else:

        def run() -> None:
            loop.run("go")

        running, errors = run_in_thread(run)
    assert tool.entered.wait(WAIT)
    other = sqlite3.connect(str(store.path), isolation_level=None, timeout=0)
    other.execute("BEGIN IMMEDIATE")  # another process writing the file
    try:  # result(PROMPT_S) and join(PROMPT_S) are the bound: the store's own wait is 30 s
        if running is None:
            assert handle.cancel("stop")
            with pytest.raises(Cancelled):
                handle.result(PROMPT_S)
        else:
            assert loop.cancel("stop")
            running.join(PROMPT_S)
            assert not running.is_alive(), "run() did not return after its cancel"
            assert [type(e) for e in errors] == [Cancelled]
    finally:
        other.execute("ROLLBACK")
        other.close()
    # The lease goes back once the file is free: the same loop and another store on it run on.
    assert loop.run("again").output == "never"
    elsewhere = SQLiteSessionStore(store.path)
    elsewhere.session("s").acquire().release()
    elsewhere.close()
    loop.close()


def test_the_loops_next_run_waits_for_a_cancelled_runs_lease_instead_of_raising_session_busy(
    store: SQLiteSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = GatedRelease(store, monkeypatch)
    loop = cancelled_loop(store, then="next")
    slow.gate.wait_entered()
    outputs: list[str] = []

    def next_run() -> None:
        try:
            outputs.append(loop.run("again").output)
        finally:
            slow.waiting.set()  # a run refused at once does not leave the test waiting

    t, errors = run_in_thread(next_run)
    assert slow.waiting.wait(WAIT)  # the next run waits for the lease
    slow.gate.open()
    t.join(WAIT)
    assert errors == [] and outputs == ["next"]
    loop.close()


def test_closing_the_store_waits_for_a_lease_being_given_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SQLiteSessionStore(tmp_path / "s.db")
    slow = GatedRelease(store, monkeypatch)
    loop = cancelled_loop(store)
    t, errors = run_in_thread(store.close)
    assert slow.waiting.wait(WAIT)
    slow.gate.open()
    t.join(WAIT)
    assert errors == []
    # The lease was given back before the store closed: another process takes the session.
    again = SQLiteSessionStore(tmp_path / "s.db")
    again.session("s").acquire().release()
    again.close()
    loop.close()


def test_a_registry_start_waiting_for_a_lease_being_given_back_holds_no_other_caller(
    store: SQLiteSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loopctl import RunRegistry

    slow = GatedRelease(store, monkeypatch)
    loop, tool = waiting_loop(store, then="next")
    registry = RunRegistry()
    first = registry.start(loop, "go")
    assert tool.entered.wait(WAIT)
    assert registry.cancel(first)
    with pytest.raises(Cancelled):
        registry.result(first, timeout=PROMPT_S)
    slow.gate.wait_entered()
    started: list[str] = []
    t, errors = run_in_thread(lambda: started.append(registry.start(loop, "again")))
    assert slow.waiting.wait(WAIT)  # the start waits for the lease
    listed = threading.Event()
    lister, list_errors = run_in_thread(lambda: (registry.list(), listed.set()))
    assert listed.wait(WAIT), "the registry's other callers waited with the start"
    slow.gate.open()
    t.join(WAIT)
    lister.join(WAIT)
    assert errors == [] and list_errors == []
    assert registry.result(started[0], timeout=WAIT).output == "next"
    registry.close()
    loop.close()
