"""The sub-agent tree: one cancel stops it, approvals and guidance reach any depth."""

from __future__ import annotations

import sqlite3
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any, Optional

import pytest
from support import WAIT, GatedReply, Recorder, join_loop_threads, run_in_thread

from loopctl import BareLoop, Cancelled, ConfigError, RunRegistry, ToolContext, tool
from loopctl.observers import ApprovalRequested, Observer, RunEnd
from loopctl.sessions import SQLiteSessionStore
from loopctl.sessions.base import Session
from loopctl.testing import ScriptedClient, call, calls, reply

CANCEL_BOUND_S = 0.1


class Waiter:
    """A tool that blocks until its run is cancelled (cancel-aware, like a good long tool)."""

    def __init__(self) -> None:
        self.entered = threading.Event()

        @tool(name="wait_here")
        def wait_here(ctx: ToolContext) -> str:
            """Waits for the run's cancel."""
            self.entered.set()
            ctx.cancel.wait(WAIT)
            return "stopped"

        self.tool = wait_here


def chain(depth: int, leaf_tools: Any, leaf_script: list[Any]) -> list[BareLoop]:
    """``depth`` + 1 loops: loops[0] delegates to loops[1] ... to loops[depth] (the leaf).

    Each loop's script ends with ``reply("again")`` items so it can run again.
    """
    leaf = BareLoop(ScriptedClient(leaf_script + [reply("again")]), tools=leaf_tools)
    loops = [leaf]
    for level in range(depth - 1, -1, -1):
        below = loops[0]
        name = f"level{level + 1}"
        loops.insert(
            0,
            BareLoop(
                ScriptedClient([call(name, task=f"task {level + 1}"), reply(f"done {level}"), reply("again")]),
                tools=[below.as_tool(name, f"delegates to level {level + 1}")],
            ),
        )
    return loops


def last_error(loop: BareLoop) -> Optional[BaseException]:
    return loop.session.runs[-1].stop_reason


# -- item 2: the cancel tree ---------------------------------------------------------------------


@pytest.mark.parametrize("how", ["loop", "handle", "other_thread"])
def test_a_parent_cancel_reaches_every_subagent_at_depth_three_and_the_tree_is_reusable(how: str) -> None:
    waiter = Waiter()
    loops = chain(3, [waiter.tool], [call("wait_here")])
    root = loops[0]
    handle = root.start("go")
    assert waiter.entered.wait(WAIT)
    t0 = time.perf_counter()
    if how == "loop":
        assert root.cancel("stop all")
    elif how == "handle":
        assert handle.cancel("stop all")
    else:
        t, errors = run_in_thread(lambda: handle.cancel("stop all"))
        t.join(WAIT)
        assert not errors
    with pytest.raises(Cancelled):
        handle.result(WAIT)
    elapsed = time.perf_counter() - t0
    assert elapsed < CANCEL_BOUND_S * 5, elapsed  # the benchmark holds the 100 ms figure
    assert [loop.is_running for loop in loops] == [False] * len(loops)
    for loop in loops:
        assert isinstance(last_error(loop), Cancelled), loop
    for loop in loops:  # every loop in the tree is reusable at once
        assert loop.run("again?").stop_reason is None


def test_a_cancel_reaches_each_level_within_the_bound() -> None:
    ends: dict[str, float] = {}
    arrived = threading.Condition()

    class Ends(Observer):
        def on_run_end(self, event: RunEnd) -> None:
            with arrived:
                ends.setdefault(event.subagent, time.perf_counter())
                arrived.notify_all()

    waiter = Waiter()
    loops = chain(3, [waiter.tool], [call("wait_here")])
    loops[0].register_observer(Ends())
    handle = loops[0].start("go")
    assert waiter.entered.wait(WAIT)
    wall0 = time.time()
    handle.cancel()
    with pytest.raises(Cancelled):
        handle.result(WAIT)
    # every run in the tree ended, cancelled, within the bound of the one cancel
    for depth, loop in enumerate(loops):
        run = loop.session.runs[-1]
        assert isinstance(run.stop_reason, Cancelled)
        assert run.end is not None and run.end - wall0 < CANCEL_BOUND_S, (depth, run.end - wall0)
    # A cancelled run's events are handed to a delivery thread (a blocked
    # observer never holds the cancel), so they may reach the root's
    # observers after its result: wait for them, bounded.
    levels = {"level1/level2/level3", "level1/level2", "level1"}
    with arrived:
        assert arrived.wait_for(lambda: set(ends) >= levels, WAIT), sorted(ends)


class BlockedEnd(Observer):
    """Blocks in ``on_run_end`` until released: user code at a run's own end that takes its time."""

    def __init__(self) -> None:
        self.inside = threading.Event()
        self.release = threading.Event()

    def on_run_end(self, event: RunEnd) -> None:
        self.inside.set()
        self.release.wait(WAIT)


def test_a_cancel_is_not_held_by_a_subagent_blocked_in_user_code_at_its_own_end() -> None:
    """The sub-agent answered and is in its own end (an observer blocks there) when the caller is cancelled."""
    from loopctl import Usage

    for depth in (1, 2, 1, 2, 1):
        blocked = BlockedEnd()
        loops = chain(depth, [], [reply("found it", usage=Usage(7, 3))])
        leaf = loops[-1]
        leaf.register_observer(blocked)
        handle = loops[0].start("go")
        assert blocked.inside.wait(WAIT)
        wall0 = time.time()
        assert handle.cancel()
        with pytest.raises(Cancelled):
            handle.result(WAIT)
        record = handle.record
        assert record.end is not None and record.end - wall0 < CANCEL_BOUND_S, (depth, record.end - wall0)
        assert record.usage == Usage(7, 3)  # the blocked run's tokens reached the root's record all the same
        assert leaf.is_running  # still in its observer: nothing waited for it
        blocked.release.set()
        for t in threading.enumerate():  # the leaf's thread, and the bodies its end releases
            if t.name.startswith("loopctl-run-"):
                t.join(WAIT)
        assert not any(loop.is_running for loop in loops)
        assert leaf.session.runs[-1].output == "found it"  # it completed on its own account


class ReportingSession(Session):
    """A real session that reports when a run's start reaches the store for its lease."""

    def __init__(self, store: Any, session_id: str) -> None:
        super().__init__(store, session_id, None)
        self.acquiring = threading.Event()

    def acquire(self, holder: Optional[str] = None) -> Any:
        self.acquiring.set()
        return super().acquire(holder)


@pytest.mark.parametrize("depth", [1, 2])
def test_a_cancel_stops_a_subagent_whose_start_waits_for_its_session_store(tmp_path: Path, depth: int) -> None:
    """The leaf's start is blocked opening its session (another writer holds the SQLite file's lock)."""
    db = tmp_path / "s.db"
    store = SQLiteSessionStore(db)
    session = ReportingSession(store, "leaf-conv")
    leaf_client = ScriptedClient([reply("leaf answer"), reply("later")])
    leaf = BareLoop(leaf_client).with_session(session)
    loops = [leaf]
    for level in range(depth, 0, -1):
        below = loops[0]
        tool_ = below.as_tool(f"level{level}", "delegates", keep_history=below is leaf)
        loops.insert(0, BareLoop(ScriptedClient([call(f"level{level}", task="t"), reply("again")]), tools=[tool_]))
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another writer (another process, say) holds the write lock
    try:
        handle = loops[0].start("go")
        assert session.acquiring.wait(WAIT)
        t0 = time.perf_counter()
        assert handle.cancel("stop")
        with pytest.raises(Cancelled):
            handle.result(WAIT)
        elapsed = time.perf_counter() - t0
    finally:
        other.execute("ROLLBACK")  # the store answers the blocked start only now, after the cancel
        other.close()
    # The thread that waited in the store (the body of the run that called the
    # leaf) exits once the store answers: the leaf's start is refused there.
    for loop in loops[:-1]:
        join_loop_threads(loop)
    assert elapsed < CANCEL_BOUND_S * 5, elapsed  # not the settling wait (a second)
    for loop in loops[:-1]:
        assert isinstance(last_error(loop), Cancelled)
    assert leaf_client.requests == []  # the leaf's run never began: no model call ...
    assert leaf.session.runs == []
    assert store.session("leaf-conv").messages() == []  # ... and nothing written
    assert not any(loop.is_running for loop in loops)
    assert leaf.run("again").output == "leaf answer"  # the leaf's loop and lease are free
    assert [m.text for m in store.session("leaf-conv").messages()] == ["again", "leaf answer"]
    store.close()


def test_a_cancel_through_the_registry_stops_the_tree_and_its_stream_ends_last() -> None:
    with RunRegistry() as reg:
        for _ in range(20):
            waiter = Waiter()
            loops = chain(2, [waiter.tool], [call("wait_here")])
            rid = reg.start(loops[0], "go")
            assert waiter.entered.wait(WAIT)
            assert reg.cancel(rid, "from the registry")
            with pytest.raises(Cancelled):
                reg.result(rid, WAIT)
            assert reg.status(rid).state == "cancelled"
            for loop in loops:
                assert isinstance(last_error(loop), Cancelled)
                assert not loop.is_running
            kinds = [(ev["type"], ev["subagent"]) for _, ev in reg.events(rid, timeout=WAIT)]
            assert kinds[-1] == ("run_end", "")
            ends = [k for k in kinds if k[0] == "run_end"]
            assert ends == [("run_end", "level1/level2"), ("run_end", "level1"), ("run_end", "")]


class OwnEnd(Recorder):
    """A recorder that also signals the run's own end (not a sub-agent's)."""

    def __init__(self) -> None:
        super().__init__()
        self.own_end = threading.Event()

    def _record(self, event: Any) -> None:
        super()._record(event)
        if isinstance(event, RunEnd) and not event.subagent:
            self.own_end.set()


class SlowToolPre(Observer):
    """The sub-agent loop's own observer (a log shipper, say), blocked in ``on_tool_pre`` until released."""

    def __init__(self) -> None:
        self.inside = threading.Event()
        self.release = threading.Event()

    def on_tool_pre(self, event: Any) -> None:
        self.inside.set()
        self.release.wait(WAIT)


class SubDone(Observer):
    """Registered after ``as_tool``: its ``on_run_end`` comes after the forwarder has handed the run's events on."""

    def __init__(self) -> None:
        self.done = threading.Event()

    def on_run_end(self, event: RunEnd) -> None:
        self.done.set()


def test_no_subagent_event_reaches_the_parents_observers_after_its_run_end() -> None:
    """Cancelled while the sub-agent's own observer holds its events back; they come up after the parent ended."""
    waiter = Waiter()
    slow, sub_done = SlowToolPre(), SubDone()
    sub = BareLoop(ScriptedClient([call("wait_here")]), tools=[waiter.tool])
    sub.with_observer(slow)
    parent = BareLoop(ScriptedClient([call("sub", task="t")]), tools=[sub.as_tool("sub", "s")])
    sub.with_observer(sub_done)
    seen = OwnEnd()
    parent.with_observer(seen)
    handle = parent.start("go")
    assert slow.inside.wait(WAIT)
    handle.cancel("stop")
    with pytest.raises(Cancelled):
        handle.result(WAIT)
    assert seen.own_end.wait(WAIT)  # the parent's on_run_end was delivered
    with seen.lock:
        at_end = len(seen.events)
    slow.release.set()  # the sub-agent's held-back events now go on to the forwarder
    assert sub_done.done.wait(WAIT)
    join_loop_threads(sub)
    for t in threading.enumerate():  # a delivery thread the takeovers handed events to
        if t.name.startswith("loopctl-events-"):
            t.join(WAIT)
    with seen.lock:
        late = [(type(e).__name__, e.subagent) for e in seen.events[at_end:]]
        last = seen.events[-1]
    assert late == []
    assert isinstance(last, RunEnd) and last.subagent == "" and last.run_id == handle.run_id
    assert any(getattr(e, "subagent", "") == "sub" for e in seen.events)  # in-order sub-agent events came


def release_after(barrier: threading.Barrier, gate: GatedReply) -> None:
    barrier.wait()
    gate.release.set()


def test_a_cancel_racing_the_subagents_completion_yields_exactly_one_outcome() -> None:
    """The sub-agent's answer and the parent's cancel, released together, 200 times.

    Whichever wins inside the sub-agent (its answer, or the cancel), the
    parent ends ``Cancelled`` once, with no history and no soft error from
    the race in its record, the sub-agent run has exactly one end, and both
    loops run again at once.
    """
    for _ in range(200):
        gate = GatedReply(reply("42"))
        child = BareLoop(ScriptedClient([gate, reply("again")]))
        parent = BareLoop(
            ScriptedClient([call("research", task="t"), reply("done"), reply("again")]),
            tools=[child.as_tool("research", "r")],
        )
        rec = OwnEnd()
        parent.register_observer(rec)
        handle = parent.start("go")
        gate.wait_entered()
        barrier = threading.Barrier(2)
        t, errors = run_in_thread(partial(release_after, barrier, gate))
        barrier.wait()
        handle.cancel("race")
        t.join(WAIT)
        assert not errors
        with pytest.raises(Cancelled):
            handle.result(WAIT)
        assert parent.conversation() == []  # a cancelled run leaves no history
        [child_run] = child.session.runs
        assert child_run.end is not None
        assert child_run.stop_reason is None or isinstance(child_run.stop_reason, Cancelled)
        assert (child_run.output == "42") == (child_run.stop_reason is None)
        assert rec.own_end.wait(WAIT)
        own_ends = [e for e in rec.of(RunEnd) if e.subagent == ""]
        assert [e.error_type for e in own_ends] == ["Cancelled"]
        assert not child.is_running and not parent.is_running
        assert child.run("reuse").stop_reason is None and parent.run("reuse").stop_reason is None


# -- item 3: approvals bubble up ----------------------------------------------------------------


class Asked(Observer):
    def __init__(self) -> None:
        self.asked = threading.Event()
        self.requested: list[ApprovalRequested] = []

    def on_approval_requested(self, event: ApprovalRequested) -> None:
        self.requested.append(event)
        self.asked.set()


def approval_chain(depth: int) -> tuple[list[BareLoop], list[str]]:
    paid: list[str] = []

    @tool(requires_approval=True)
    def pay(to: str) -> str:
        """Pays someone.

        Args:
            to: who.
        """
        paid.append(to)
        return f"paid {to}"

    return chain(depth, [pay], [call("pay", to="bob"), reply("leaf done")]), paid


@pytest.mark.parametrize("depth,path", [(1, "level1"), (2, "level1/level2")])
def test_a_subagents_call_needing_approval_shows_in_the_parents_handle_and_approve_answers_it(
    depth: int, path: str
) -> None:
    loops, paid = approval_chain(depth)
    asked = Asked()
    loops[0].register_observer(asked)
    handle = loops[0].start("go")
    assert asked.asked.wait(WAIT)
    assert asked.requested[0].subagent == path
    pending = handle.pending_approvals()
    assert [(p.tool, p.subagent, p.run_id, dict(p.arguments)) for p in pending] == [
        ("pay", path, handle.run_id, {"to": "bob"})
    ]
    assert handle.approve(pending[0].call_id, by="alice")
    assert handle.result(WAIT).output == "done 0"
    assert paid == ["bob"]
    assert handle.pending_approvals() == []


def test_deny_on_the_parent_answers_a_subagents_call() -> None:
    loops, paid = approval_chain(1)
    asked = Asked()
    loops[0].register_observer(asked)
    handle = loops[0].start("go")
    assert asked.asked.wait(WAIT)
    call_id = handle.pending_approvals()[0].call_id
    assert handle.deny(call_id, "not today")
    assert handle.result(WAIT).output == "done 0"
    assert paid == []
    denied = [p for m in loops[1].conversation() for p in m.tool_results]
    assert denied[0].is_error and "not today" in denied[0].output


def test_registry_lists_and_answers_a_subagents_pending_approval() -> None:
    loops, paid = approval_chain(2)
    asked = Asked()
    loops[0].register_observer(asked)
    with RunRegistry() as reg:
        rid = reg.start(loops[0], "go")
        assert asked.asked.wait(WAIT)
        pending = reg.pending_approvals(rid)
        assert [(p.subagent, p.run_id) for p in pending] == [("level1/level2", rid)]
        assert pending[0].to_dict()["subagent"] == "level1/level2"
        assert reg.approve(rid, pending[0].call_id, by="ops")
        assert reg.result(rid, WAIT).output == "done 0"
        types = [(ev["type"], ev["subagent"]) for _, ev in reg.events(rid, timeout=WAIT)]
    assert ("approval_requested", "level1/level2") in types
    assert ("approval_resolved", "level1/level2") in types
    assert paid == ["bob"]


def test_approving_a_subagents_call_after_the_parent_was_cancelled_returns_false() -> None:
    loops, paid = approval_chain(2)
    asked = Asked()
    loops[0].register_observer(asked)
    with RunRegistry() as reg:
        rid = reg.start(loops[0], "go")
        assert asked.asked.wait(WAIT)
        call_id = reg.pending_approvals(rid)[0].call_id
        assert loops[1].is_running and loops[2].is_running  # the whole tree is in flight
        assert reg.cancel(rid)
        with pytest.raises(Cancelled):
            reg.result(rid, WAIT)
        assert reg.approve(rid, call_id) is False
        assert reg.deny(rid, call_id, "late") is False
        assert reg.pending_approvals(rid) == []
    assert paid == []
    for loop in loops:
        assert isinstance(last_error(loop), Cancelled)


# -- item 4: guidance ----------------------------------------------------------------------------------


def test_registry_steer_to_a_subagent_lands_at_its_next_turn_boundary() -> None:
    gate = GatedReply(call("noop"))

    @tool
    def noop() -> str:
        """Does nothing."""
        return "ok"

    child_client = ScriptedClient([gate, reply("child done")])
    child = BareLoop(child_client, tools=[noop])
    parent_client = ScriptedClient([call("research", task="t"), reply("done")])
    parent = BareLoop(parent_client, tools=[child.as_tool("research", "r")])
    with RunRegistry() as reg:
        rid = reg.start(parent, "go")
        gate.wait_entered()
        assert reg.steer(rid, "focus on 2026", to="research")
        assert reg.steer(rid, "nobody", to="nobody") is False
        gate.release.set()
        assert reg.result(rid, WAIT).output == "done"
        assert reg.leftovers(rid) == []
    texts = [m.text for m in child_client.requests[1].messages]
    assert texts[-1] == "focus on 2026"
    assert all("focus on 2026" not in m.text for r in parent_client.requests for m in r.messages)


def test_guidance_to_a_subagent_that_never_reached_a_boundary_comes_back_as_leftovers() -> None:
    gate = GatedReply(reply("child done"))
    child = BareLoop(ScriptedClient([gate]))
    parent = BareLoop(
        ScriptedClient([call("research", task="t"), reply("done")]), tools=[child.as_tool("research", "r")]
    )
    with RunRegistry() as reg:
        rid = reg.start(parent, "go")
        gate.wait_entered()
        assert reg.steer(rid, "too late", to="research")
        gate.release.set()
        assert reg.result(rid, WAIT).output == "done"
        assert [m.text for m in reg.leftovers(rid)] == ["too late"]


def test_steer_reaches_a_nested_subagent_by_its_path() -> None:
    gate = GatedReply(call("noop"))

    @tool
    def noop() -> str:
        """Does nothing."""
        return "ok"

    leaf_client = ScriptedClient([gate, reply("leaf done")])
    leaf = BareLoop(leaf_client, tools=[noop])
    mid = BareLoop(ScriptedClient([call("search", task="s"), reply("mid done")]), tools=[leaf.as_tool("search", "s")])
    root = BareLoop(ScriptedClient([call("research", task="r"), reply("done")]), tools=[mid.as_tool("research", "r")])
    handle = root.start("go")
    gate.wait_entered()
    assert handle.steer_subagent("research/search", "deep guidance")
    gate.release.set()
    assert handle.result(WAIT).output == "done"
    assert leaf_client.requests[1].messages[-1].text == "deep guidance"


@pytest.mark.parametrize("via", ["registry", "handle"])
def test_a_malformed_subagent_path_is_the_callers_error_whatever_is_in_flight(via: str) -> None:
    # The same check as CeleryRunRegistry.steer(to=): a ConfigError (a ValueError)
    # naming the path, before any sub-agent has started and while one is in flight.
    gate = GatedReply(reply("child done"))
    child = BareLoop(ScriptedClient([gate]))
    parent_gate = GatedReply(call("research", task="t"))
    parent = BareLoop(ScriptedClient([parent_gate, reply("done")]), tools=[child.as_tool("research", "r")])
    with RunRegistry() as reg:
        if via == "registry":
            rid = reg.start(parent, "go")
            steer: Any = partial(reg.steer, rid)
            result: Any = partial(reg.result, rid)
        else:
            handle = parent.start("go")
            steer = lambda message, to: handle.steer_subagent(to, message)  # noqa: E731
            result = handle.result
        parent_gate.wait_entered()  # no sub-agent has started yet
        for moment in ("before", "during"):
            for bad in ["", "a//b", "/a", "research/", 3]:
                with pytest.raises(ConfigError, match="sub-agent name or a path") as err:
                    steer("x", to=bad)
                assert isinstance(err.value, ValueError)
            if moment == "before":
                parent_gate.release.set()
                gate.wait_entered()  # "research" is in flight now
        gate.release.set()
        assert result(WAIT).output == "done"
        if via == "registry":
            with pytest.raises(ConfigError):  # ended: still the caller's error, not a quiet False
                steer("x", to="a//b")
            with pytest.raises(KeyError):  # an unknown id is a KeyError first (SPEC 11)
                reg.steer("no-such-run", "x", to="a//b")


def test_a_call_waiting_for_its_turn_stops_at_the_cancel() -> None:
    for _ in range(10):
        gate = GatedReply(reply("first"))
        child = BareLoop(ScriptedClient([gate, reply("second"), reply("again")]))
        t = child.as_tool("research", "r")
        t.concurrency_safe = True  # both calls in one wave: the second waits for its turn
        parent = BareLoop(
            ScriptedClient([calls(("research", {"task": "a"}), ("research", {"task": "b"})), reply("done")]),
            tools=[t],
        )
        handle = parent.start("go")
        gate.wait_entered()
        handle.cancel("stop")
        with pytest.raises(Cancelled):
            handle.result(WAIT)
        gate.release.set()
        assert len(child.session.runs) == 1  # the waiting call never started a run
        assert isinstance(child.session.runs[0].stop_reason, Cancelled)
        assert not child.is_running and not parent.is_running
