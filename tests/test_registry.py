"""RunRegistry: ids, status, results, steering, event replay, pruning, conversations.

Runs use ``ScriptedClient`` with gated callables (a model call that waits on
an ``Event``), so every interleaving is forced, never slept into. The race
tests live in ``test_registry_races.py``; the Flask session is at the end.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any, Callable, Optional

import pytest
from support import WAIT, Echoed, FakeClock, GatedReply, join_run_threads, run_thread_prefix, texts

from loopctl import BareLoop, Cancelled, LoopBusy, LoopError, Message, ModelError, Usage
from loopctl.errors import ConfigError
from loopctl.hosting.registry import RunRegistry, RunStatus
from loopctl.messages import ModelResponse
from loopctl.testing import ScriptedClient, call, reply


def make_loop(*script: Any) -> BareLoop:
    return BareLoop(ScriptedClient(list(script)), [Echoed()])


@pytest.fixture
def reg() -> Iterator[RunRegistry]:
    registry = RunRegistry()
    yield registry
    registry.close()


@pytest.fixture
def gates() -> Iterator[list[GatedReply]]:
    made: list[GatedReply] = []
    yield made
    for g in made:  # let abandoned run threads leave their gated call
        g.release.set()


def gate(gates: list[GatedReply], response: ModelResponse) -> GatedReply:
    g = GatedReply(response)
    gates.append(g)
    return g


# -- start, ids, status, result ------------------------------------------------------


def test_start_returns_the_run_id_and_every_event_carries_it(reg: RunRegistry) -> None:
    loop = make_loop(call("echo"), reply("done"))
    rid = reg.start(loop, "hi", run_id="run-7")
    assert rid == "run-7"
    events = list(reg.events(rid))
    assert [s for s, _ in events] == list(range(1, len(events) + 1))
    assert events[0][1]["type"] == "run_start" and events[-1][1]["type"] == "run_end"
    assert {e["run_id"] for _, e in events} == {"run-7"}
    assert reg.result(rid).id == "run-7"
    json.dumps([e for _, e in events])  # JSON-safe


def test_default_id_is_the_run_record_id(reg: RunRegistry) -> None:
    loop = make_loop(reply("ok"))
    rid = reg.start(loop, "hi")
    assert reg.result(rid, timeout=WAIT) is loop.session.runs[-1]
    assert loop.session.runs[-1].id == rid


def test_status_of_a_completed_run_has_output_counts_and_timestamps(reg: RunRegistry) -> None:
    usage = Usage(input_tokens=11, output_tokens=3)
    first = call("echo")
    first = ModelResponse(first.message, first.stop_reason, usage)
    loop = make_loop(first, reply("final", usage=Usage(input_tokens=20, output_tokens=5)))
    rid = reg.start(loop, "hi")
    run = reg.result(rid, timeout=WAIT)
    st = reg.status(rid)
    assert st == RunStatus(
        run_id=rid,
        state="completed",
        output="final",
        error=None,
        turns=2,
        tool_calls=1,
        input_tokens=31,
        output_tokens=8,
        started_at=run.start,
        ended_at=run.end,
    )
    assert st.ended_at is not None and st.ended_at >= st.started_at
    json.dumps(st.to_dict())


def test_status_is_running_until_the_run_ends(reg: RunRegistry, gates: list[GatedReply]) -> None:
    g = gate(gates, reply("late"))
    rid = reg.start(make_loop(call("echo"), g), "hi")
    g.wait_entered()
    st = reg.status(rid)
    assert (st.state, st.output, st.error, st.ended_at) == ("running", None, None, None)
    assert st.turns == 1 and st.tool_calls == 1
    with pytest.raises(TimeoutError, match=rid):
        reg.result(rid, timeout=0)
    g.release.set()
    assert reg.result(rid, timeout=WAIT).output == "late"
    assert reg.status(rid).state == "completed"


def test_failed_run_shows_failed_with_the_error_text(reg: RunRegistry) -> None:
    rid = reg.start(make_loop(ModelError("upstream exploded")), "hi")
    with pytest.raises(ModelError, match="upstream exploded"):
        reg.result(rid, timeout=WAIT)
    st = reg.status(rid)
    assert st.state == "failed" and "upstream exploded" in (st.error or "")
    assert st.output is None


def test_cancel_ends_the_run_cancelled_and_only_that_run(
    reg: RunRegistry, gates: list[GatedReply]
) -> None:
    g = gate(gates, reply("never"))
    loop = make_loop(g, reply("next one"))
    rid = reg.start(loop, "hi")
    g.wait_entered()
    assert reg.cancel(rid, "user pressed stop") is True
    with pytest.raises(Cancelled, match="user pressed stop"):
        reg.result(rid, timeout=WAIT)
    st = reg.status(rid)
    assert st.state == "cancelled" and "user pressed stop" in (st.error or "")
    assert reg.cancel(rid) is False  # finished
    g.release.set()
    # The next run on the same loop starts clean.
    rid2 = reg.start(loop, "again")
    assert reg.result(rid2, timeout=WAIT).output == "next one"


def test_steer_and_cancel_of_a_finished_run_return_false(reg: RunRegistry) -> None:
    loop = make_loop(reply("a"))
    rid = reg.start(loop, "hi")
    reg.result(rid, timeout=WAIT)
    assert reg.steer(rid, "too late") is False
    assert reg.cancel(rid) is False
    assert reg.leftovers(rid) == []
    assert loop.steering().take_all() == []  # nothing was stored anywhere


@pytest.mark.parametrize(
    "op",
    [
        lambda r: r.status("nope-1"),
        lambda r: r.result("nope-1"),
        lambda r: r.steer("nope-1", "x"),
        lambda r: r.cancel("nope-1"),
        lambda r: r.leftovers("nope-1"),
        lambda r: r.events("nope-1"),  # raises at once, not on first next()
    ],
)
def test_unknown_id_raises_key_error_naming_it(
    reg: RunRegistry, op: Callable[[RunRegistry], Any]
) -> None:
    with pytest.raises(KeyError, match="nope-1"):
        op(reg)


def test_an_owned_run_is_an_unknown_id_to_any_other_owner(
    reg: RunRegistry, gates: list[GatedReply]
) -> None:
    g = gate(gates, reply("mine"))
    loop = make_loop(g)
    rid = reg.start(loop, "hi", owner="alice")
    g.wait_entered()
    ops: list[Callable[[Any], Any]] = [
        lambda who: reg.status(rid, owner=who),
        lambda who: reg.result(rid, timeout=0, owner=who),
        lambda who: reg.steer(rid, "hijack", owner=who),
        lambda who: reg.cancel(rid, "hijack", owner=who),
        lambda who: reg.leftovers(rid, owner=who),
        lambda who: reg.events(rid, owner=who),
    ]
    unknown_id = "nope-" + rid[5:]
    with pytest.raises(KeyError) as unknown:
        reg.status(unknown_id)
    for stranger in ("bob", None):
        for op in ops:
            with pytest.raises(KeyError) as refused:
                op(stranger)
            # The same answer as an unknown id, so ids cannot be probed.
            assert str(refused.value).replace(rid, "ID") == str(unknown.value).replace(unknown_id, "ID")
    # The stranger's steer and cancel changed nothing: the run goes on, and
    # its owner's requests work.
    assert reg.status(rid, owner="alice").state == "running"
    assert reg.steer(rid, "be brief", owner="alice") is True
    g.release.set()
    assert reg.result(rid, timeout=WAIT, owner="alice").output == "mine"
    assert [m.text for m in reg.leftovers(rid, owner="alice")] == ["be brief"]
    types = [e["type"] for _, e in reg.events(rid, owner="alice")]
    assert types[-1] == "run_end" and "steering" not in types


def test_start_past_max_active_raises_loop_busy_and_starts_nothing(gates: list[GatedReply]) -> None:
    reg = RunRegistry(max_active=2)
    try:
        g1, g2 = gate(gates, reply("1")), gate(gates, reply("2"))
        r1 = reg.start(make_loop(g1), "a")
        reg.start(make_loop(g2), "b")
        third = make_loop(reply("3"))
        with pytest.raises(LoopBusy, match="max_active=2"):
            reg.start(third, "c", run_id="third")
        assert not third.is_running and third.session.runs == []
        assert third.client.requests == []
        assert len(reg.list()) == 2
        with pytest.raises(KeyError):
            reg.status("third")
        g1.release.set()
        reg.result(r1, timeout=WAIT)
        rid = reg.start(third, "c", run_id="third")  # a slot is free again
        assert reg.result(rid, timeout=WAIT).output == "3"
        g2.release.set()
    finally:
        reg.close()


def test_start_on_a_busy_loop_raises_loop_busy_and_registers_nothing(
    reg: RunRegistry, gates: list[GatedReply]
) -> None:
    g = gate(gates, reply("x"))
    loop = make_loop(g, reply("y"))
    reg.start(loop, "a", run_id="first")
    with pytest.raises(LoopBusy, match="first"):
        reg.start(loop, "b", run_id="second")
    with pytest.raises(KeyError):
        reg.status("second")
    g.release.set()
    reg.result("first", timeout=WAIT)


def test_duplicate_run_id_is_refused(reg: RunRegistry) -> None:
    rid = reg.start(make_loop(reply("a")), "x", run_id="same")
    with pytest.raises(LoopError, match="'same'"):
        reg.start(make_loop(reply("b")), "x", run_id="same")
    assert reg.result(rid, timeout=WAIT).output == "a"


def test_bad_arguments_raise_config_error_naming_the_value() -> None:
    with pytest.raises(ConfigError, match="max_active.*0"):
        RunRegistry(max_active=0)
    with pytest.raises(ConfigError, match="event_buffer.*-5"):
        RunRegistry(event_buffer=-5)
    with pytest.raises(ConfigError, match="keep_finished_s.*-1"):
        RunRegistry(keep_finished_s=-1)


# -- steering ----------------------------------------------------------------------------


def test_steer_during_a_model_call_is_delivered_in_the_next_request(
    reg: RunRegistry, gates: list[GatedReply]
) -> None:
    g0 = gate(gates, call("echo"))
    g1 = gate(gates, reply("done"))
    rid = reg.start(make_loop(g0, g1), "hi")
    g0.wait_entered()
    assert reg.steer(rid, "prefer brevity") is True
    assert reg.steer(rid, Message.user("and cite sources")) is True
    g0.release.set()
    g1.wait_entered()
    assert g1.request is not None
    assert texts(g1.request.messages)[-2:] == ["prefer brevity", "and cite sources"]
    g1.release.set()
    reg.result(rid, timeout=WAIT)
    steering = [e for _, e in reg.events(rid) if e["type"] == "steering"]
    assert [texts(e["messages"]) for e in steering] == [["prefer brevity", "and cite sources"]]
    assert reg.leftovers(rid) == []


def test_steer_during_the_last_call_comes_back_as_that_runs_leftover(
    reg: RunRegistry, gates: list[GatedReply]
) -> None:
    g = gate(gates, reply("final"))
    loop = make_loop(g, reply("second run"))
    rid = reg.start(loop, "hi")
    g.wait_entered()
    assert reg.steer(rid, "never drained") is True
    g.release.set()
    reg.result(rid, timeout=WAIT)
    assert texts(reg.leftovers(rid)) == ["never drained"]
    assert texts(reg.leftovers(rid)) == ["never drained"]  # reading does not consume
    assert loop.steering().take_all() == []  # the registry took it from the loop
    rid2 = reg.start(loop, "next")
    reg.result(rid2, timeout=WAIT)
    assert reg.leftovers(rid2) == []
    assert not [e for _, e in reg.events(rid2) if e["type"] == "steering"]


def test_queued_is_the_guidance_not_delivered_yet_and_its_seq_comes_before_the_delivery(
    reg: RunRegistry, gates: list[GatedReply]
) -> None:
    g0 = gate(gates, call("echo"))
    g1 = gate(gates, reply("done"))
    rid = reg.start(make_loop(g0, g1), "hi", owner="ada")
    g0.wait_entered()
    assert reg.queued(rid, owner="ada") == (len(list(reg.events(rid, timeout=0, owner="ada"))), [])
    assert reg.steer(rid, "prefer brevity", owner="ada") is True
    seq, queued = reg.queued(rid, owner="ada")
    assert texts(queued) == ["prefer brevity"]
    with pytest.raises(KeyError):
        reg.queued(rid, owner="mallory")  # another owner's run is an unknown id
    g0.release.set()
    g1.wait_entered()
    assert reg.queued(rid, owner="ada")[1] == []  # delivered: queued no more
    g1.release.set()
    reg.result(rid, timeout=WAIT, owner="ada")
    [(delivered_at, steering)] = [(n, e) for n, e in reg.events(rid, owner="ada") if e["type"] == "steering"]
    assert texts(steering["messages"]) == ["prefer brevity"] and delivered_at > seq
    assert reg.queued(rid, owner="ada")[1] == []


def test_queued_guidance_a_run_never_reaches_becomes_its_leftover(
    reg: RunRegistry, gates: list[GatedReply]
) -> None:
    g = gate(gates, reply("final"))
    rid = reg.start(make_loop(g), "hi")
    g.wait_entered()
    assert reg.steer(rid, "never drained") is True
    assert texts(reg.queued(rid)[1]) == ["never drained"]
    g.release.set()
    reg.result(rid, timeout=WAIT)
    assert reg.queued(rid) == (len(list(reg.events(rid))), [])
    assert texts(reg.leftovers(rid)) == ["never drained"]


# -- events ----------------------------------------------------------------------------


def test_consumer_attaching_mid_run_with_after_sees_exactly_the_later_events(
    reg: RunRegistry, gates: list[GatedReply]
) -> None:
    g = gate(gates, reply("done"))
    rid = reg.start(make_loop(call("echo"), call("echo"), g), "hi")
    g.wait_entered()
    early = list(reg.events(rid, timeout=0))  # what exists now; ends at the timeout
    n = len(early)
    assert n > 5 and early[-1][1]["type"] == "turn_start"
    late = reg.events(rid, after=n - 3)
    head = [next(late) for _ in range(3)]
    assert head == early[-3:]
    g.release.set()
    rest = list(late)
    everything = list(reg.events(rid))
    assert head + rest == everything[n - 3 :]
    assert rest[-1][1]["type"] == "run_end"
    assert [s for s, _ in everything] == list(range(1, len(everything) + 1))
    assert list(reg.events(rid, after=len(everything))) == []


def test_two_consumers_see_the_same_sequence(reg: RunRegistry, gates: list[GatedReply]) -> None:
    g = gate(gates, call("echo"))
    rid = reg.start(make_loop(g, call("echo"), reply("done")), "hi")
    seen: list[list[tuple[int, dict[str, Any]]]] = [[], []]
    started = threading.Barrier(3, timeout=WAIT)

    def consume(i: int) -> None:
        it = reg.events(rid)
        started.wait()
        seen[i].extend(it)

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    started.wait()
    g.release.set()
    for t in threads:
        t.join(WAIT)
    assert seen[0] == seen[1] and seen[0][-1][1]["type"] == "run_end"
    assert seen[0] == list(reg.events(rid))


def test_a_consumer_that_never_reads_does_not_block_the_run(gates: list[GatedReply]) -> None:
    reg = RunRegistry(event_buffer=3)
    try:
        g = gate(gates, call("echo"))
        rid = reg.start(make_loop(g, call("echo"), call("echo"), reply("done")), "hi")
        stalled = reg.events(rid)
        assert next(stalled)[1]["type"] == "run_start"  # attached, then never reads on
        g.release.set()
        assert reg.result(rid, timeout=WAIT).output == "done"
    finally:
        reg.close()


def test_a_consumer_behind_the_buffer_gets_one_gap_event_then_continues(gates: list[GatedReply]) -> None:
    reg = RunRegistry(event_buffer=4)
    try:
        g = gate(gates, reply("done"))
        rid = reg.start(make_loop(call("echo"), call("echo"), g), "hi")
        g.wait_entered()
        slow = reg.events(rid)
        # The buffer holds only the last 4 events of the (already long) run.
        gap_seq, gap = next(slow)
        assert gap["type"] == "gap" and gap["run_id"] == rid
        total_now = gap_seq + 4
        assert gap["dropped"] == gap_seq
        kept = [next(slow) for _ in range(4)]
        assert [s for s, _ in kept] == list(range(gap_seq + 1, total_now + 1))
        g.release.set()
        reg.result(rid, timeout=WAIT)
        rest = list(slow)
        # The run emitted more than 4 events after the consumer paused: one more gap.
        gaps = [(s, e) for s, e in rest if e["type"] == "gap"]
        assert len(gaps) == 1
        s2, gap2 = gaps[0]
        assert rest[0] == gaps[0] and gap2["dropped"] == s2 - total_now
        assert [e["type"] for _, e in rest[1:]][-1] == "run_end"
        assert [s for s, _ in rest[1:]] == list(range(s2 + 1, s2 + 5))
        # A fresh consumer with after= inside the kept window sees no gap.
        assert [s for s, _ in reg.events(rid, after=s2 + 1)] == list(range(s2 + 2, s2 + 5))
    finally:
        reg.close()


def test_events_timeout_ends_the_iterator_and_after_resumes(
    reg: RunRegistry, gates: list[GatedReply]
) -> None:
    g = gate(gates, reply("done"))
    rid = reg.start(make_loop(g), "hi")
    g.wait_entered()
    first = list(reg.events(rid, timeout=0.01))
    assert first and first[-1][1]["type"] == "turn_start"
    g.release.set()
    resumed = list(reg.events(rid, after=first[-1][0]))
    assert resumed[0][0] == first[-1][0] + 1 and resumed[-1][1]["type"] == "run_end"
    assert first + resumed == list(reg.events(rid))


def test_events_recorded_before_start_returns_are_not_lost(reg: RunRegistry) -> None:
    # An instant run may finish before start() returns; its buffer existed first.
    for i in range(50):
        rid = reg.start(make_loop(reply("x")), "hi", run_id=f"fast-{i}")
        types = [e["type"] for _, e in reg.events(rid)]
        assert types[0] == "run_start" and types[-1] == "run_end"
        assert types.count("run_start") == 1 and types.count("run_end") == 1


# -- pruning ---------------------------------------------------------------------------


def test_finished_runs_are_dropped_after_keep_finished_s(gates: list[GatedReply]) -> None:
    clock = FakeClock(100.0)
    reg = RunRegistry(keep_finished_s=30, clock=clock)
    try:
        done_id = reg.start(make_loop(reply("a")), "x")
        reg.result(done_id, timeout=WAIT)  # ended at clock 100
        g = gate(gates, reply("b"))
        live_id = reg.start(make_loop(g), "y")
        clock.now = 129.9
        assert reg.status(done_id).state == "completed"
        assert texts(reg.leftovers(done_id)) == [] and list(reg.events(done_id))
        clock.now = 130.0
        with pytest.raises(KeyError, match=done_id):
            reg.status(done_id)
        with pytest.raises(KeyError, match=done_id):
            reg.events(done_id)
        assert [s.run_id for s in reg.list()] == [live_id]
        clock.now = 10_000.0  # a running run is never dropped
        assert reg.status(live_id).state == "running"
        g.release.set()
        reg.result(live_id, timeout=WAIT)
        clock.now = 10_029.0
        assert len(reg.list()) == 1
        clock.now = 10_030.0
        assert reg.list() == []
    finally:
        reg.close()


# -- conversations and close ----------------------------------------------------------


def test_loop_for_creates_one_loop_per_key_once_under_concurrency(reg: RunRegistry) -> None:
    made: list[BareLoop] = []
    barrier = threading.Barrier(8, timeout=WAIT)
    got: list[BareLoop] = []

    def factory() -> BareLoop:
        loop = make_loop(reply("a"))
        made.append(loop)
        return loop

    def worker() -> None:
        barrier.wait()
        got.append(reg.loop_for("conv-1", factory))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert len(made) == 1 and len(got) == 8 and all(g is made[0] for g in got)
    assert reg.loop_for("conv-2", factory) is not made[0]
    assert len(made) == 2


def test_loop_for_retries_after_a_failing_factory(reg: RunRegistry) -> None:
    def broken() -> BareLoop:
        raise RuntimeError("no client today")

    with pytest.raises(RuntimeError, match="no client today"):
        reg.loop_for("k", broken)
    loop = reg.loop_for("k", lambda: make_loop(reply("ok")))
    assert reg.loop_for("k", broken) is loop


def test_a_conversation_continues_its_history_and_refuses_overlap(
    reg: RunRegistry, gates: list[GatedReply]
) -> None:
    g = gate(gates, reply("second answer"))
    client = ScriptedClient([reply("first answer"), g])

    def factory() -> BareLoop:
        return BareLoop(client)

    r1 = reg.start(reg.loop_for("c", factory), "question one")
    reg.result(r1, timeout=WAIT)
    r2 = reg.start(reg.loop_for("c", factory), "question two")
    g.wait_entered()
    with pytest.raises(LoopBusy):
        reg.start(reg.loop_for("c", factory), "question three")
    assert g.request is not None
    assert texts(g.request.messages) == ["question one", "first answer", "question two"]
    g.release.set()
    assert reg.result(r2, timeout=WAIT).output == "second answer"


def test_close_cancels_running_runs_and_refuses_new_ones(gates: list[GatedReply]) -> None:
    reg = RunRegistry()
    g1, g2 = gate(gates, reply("1")), gate(gates, reply("2"))
    conv = reg.loop_for("c", lambda: make_loop(g2))
    plain = make_loop(g1)
    for loop, g in ((plain, g1), (conv, g2)):
        # A cooperative model call: the cancel releases it, so close() can join the thread.
        loop.cancel_signal().add_listener(g.release.set)
    r1 = reg.start(plain, "a")
    r2 = reg.start(conv, "b")
    done = reg.start(make_loop(reply("3")), "c")
    reg.result(done, timeout=WAIT)
    g1.wait_entered()
    g2.wait_entered()
    reg.close()
    assert [s.state for s in reg.list()] == ["cancelled", "cancelled", "completed"]
    with pytest.raises(Cancelled, match="registry closed"):
        reg.result(r1)
    assert reg.status(r2).state == "cancelled"
    with pytest.raises(LoopError, match="closed"):
        reg.start(make_loop(reply("x")), "late")
    with pytest.raises(LoopError, match="closed"):
        reg.loop_for("other", lambda: make_loop())
    reg.close()  # idempotent
    assert not [t for t in threading.enumerate() if t.name.startswith("loopctl-run-")]


def test_close_without_a_bound_leaves_a_body_stuck_in_a_call_that_ignores_its_cancel(
    gates: list[GatedReply],
) -> None:
    # close(timeout=None) waits for every run to end; a run whose body is
    # blocked in a call that ignores the cancel ends by the cancel's takeover,
    # and its body is left behind, not waited for (maybe forever).
    reg = RunRegistry()
    g = gate(gates, reply("never"))  # no cancel listener: the call ignores the cancel
    rid = reg.start(make_loop(g), "a")
    g.wait_entered()
    body = [t for t in threading.enumerate() if t.name.startswith(run_thread_prefix(rid))]
    assert len(body) == 1
    closer = threading.Thread(target=reg.close, kwargs={"timeout": None}, name="test-closer")
    closer.start()
    closer.join(WAIT)
    assert not closer.is_alive(), "close(timeout=None) waited for a body stuck in its call"
    assert body[0].is_alive(), "the body was released by something other than the gate"
    assert reg.status(rid).state == "cancelled"
    g.release.set()
    join_run_threads(rid)


# -- a Flask app on top of the registry ----------------------------------------------


def _flask_app(registry: RunRegistry, factory: Callable[[str], BareLoop]) -> Any:
    import flask  # a test dependency (setup.cfg extras "test")

    app = flask.Flask("registry_test_app")

    @app.errorhandler(KeyError)
    def unknown(exc: KeyError) -> Any:
        return flask.jsonify(error=str(exc)), 404

    @app.errorhandler(LoopBusy)
    def busy(exc: LoopBusy) -> Any:
        return flask.jsonify(error=str(exc)), 409

    @app.post("/runs")
    def start_run() -> Any:
        body = flask.request.get_json()
        key = body["conversation"]
        loop = registry.loop_for(key, lambda: factory(key))
        return flask.jsonify(id=registry.start(loop, body["input"])), 201

    @app.get("/runs/<rid>")
    def status(rid: str) -> Any:
        return flask.jsonify(registry.status(rid).to_dict())

    @app.post("/runs/<rid>/steer")
    def steer(rid: str) -> Any:
        return flask.jsonify(accepted=registry.steer(rid, flask.request.get_json()["message"]))

    @app.post("/runs/<rid>/cancel")
    def cancel(rid: str) -> Any:
        return flask.jsonify(cancelled=registry.cancel(rid, "cancelled over HTTP"))

    @app.get("/runs/<rid>/events")
    def events(rid: str) -> Any:
        after = int(flask.request.headers.get("Last-Event-ID", "0"))
        stream = registry.events(rid, after=after, timeout=WAIT)  # KeyError -> 404 now

        def sse() -> Iterator[str]:
            for seq, event in stream:
                yield f"id: {seq}\nevent: {event['type']}\ndata: {json.dumps(event)}\n\n"

        return flask.Response(sse(), mimetype="text/event-stream")

    return app


class SSEReader:
    """Reads a streamed test-client response one SSE event at a time."""

    def __init__(self, response: Any) -> None:
        self.response = response
        self.chunks = response.iter_encoded()
        self.pending = b""

    def next(self) -> Optional[tuple[int, str, dict[str, Any]]]:
        while b"\n\n" not in self.pending:
            try:
                self.pending += next(self.chunks)
            except StopIteration:
                return None
        raw, self.pending = self.pending.split(b"\n\n", 1)
        fields = dict(line.split(": ", 1) for line in raw.decode().splitlines())
        return int(fields["id"]), fields["event"], json.loads(fields["data"])

    def until(
        self, pred: Callable[[str, dict[str, Any]], bool]
    ) -> list[tuple[int, str, dict[str, Any]]]:
        out: list[tuple[int, str, dict[str, Any]]] = []
        while True:
            item = self.next()
            assert item is not None, (
                f"stream ended before the awaited event; saw {[t for _, t, _ in out]}"
            )
            out.append(item)
            if pred(item[1], item[2]):
                return out

    def rest(self) -> list[tuple[int, str, dict[str, Any]]]:
        out: list[tuple[int, str, dict[str, Any]]] = []
        while (item := self.next()) is not None:
            out.append(item)
        return out


def test_flask_session_posts_streams_steers_and_cancels_a_run(gates: list[GatedReply]) -> None:
    g0 = gate(gates, call("echo"))
    g1 = gate(gates, reply("never sent"))
    clients = {"c1": ScriptedClient([g0, g1, reply("follow-up answer")])}
    registry = RunRegistry()
    app = _flask_app(registry, lambda key: BareLoop(clients[key], [Echoed()]))
    http = app.test_client()
    try:
        resp = http.post("/runs", json={"conversation": "c1", "input": "hello"})
        assert resp.status_code == 201
        rid = resp.get_json()["id"]
        g0.wait_entered()

        busy = http.post("/runs", json={"conversation": "c1", "input": "overlap"})
        assert busy.status_code == 409 and rid in busy.get_json()["error"]
        assert http.post(f"/runs/{rid}/steer", json={"message": "be brief"}).get_json() == {
            "accepted": True
        }

        stream = SSEReader(http.get(f"/runs/{rid}/events", buffered=False))
        head = stream.until(lambda t, e: t == "turn_start")
        assert [t for _, t, _ in head] == ["run_start", "turn_start"]
        g0.release.set()
        middle = stream.until(lambda t, e: t == "turn_start")
        assert "steering" in [t for _, t, _ in middle] and middle[-1][2]["turn"] == 1
        g1.wait_entered()
        assert g1.request is not None and texts(g1.request.messages)[-1] == "be brief"

        assert http.get(f"/runs/{rid}").get_json()["state"] == "running"
        assert http.post(f"/runs/{rid}/cancel").get_json() == {"cancelled": True}
        tail = stream.rest()
        assert tail[-1][1] == "run_end"
        assert tail[-1][2]["success"] is False and "cancelled over HTTP" in tail[-1][2]["error"]
        everything = head + middle + tail
        assert [i for i, _, _ in everything] == list(range(1, len(everything) + 1))

        status = http.get(f"/runs/{rid}").get_json()
        assert status["state"] == "cancelled" and status["turns"] == 1
        assert http.post(f"/runs/{rid}/cancel").get_json() == {"cancelled": False}
        assert http.post(f"/runs/{rid}/steer", json={"message": "late"}).get_json() == {
            "accepted": False
        }

        # Resume with Last-Event-ID: exactly the events after it, in order.
        resume_from = middle[-1][0]
        resumed = SSEReader(
            http.get(f"/runs/{rid}/events", headers={"Last-Event-ID": str(resume_from)})
        )
        assert resumed.rest() == tail

        for path in ("/runs/nope", "/runs/nope/events"):
            assert http.get(path).status_code == 404
        for path in ("/runs/nope/steer", "/runs/nope/cancel"):
            assert http.post(path, json={"message": "x"}).status_code == 404

        g1.release.set()
        again = http.post("/runs", json={"conversation": "c1", "input": "follow-up"})
        assert again.status_code == 201
        rid2 = again.get_json()["id"]
        events2 = SSEReader(http.get(f"/runs/{rid2}/events")).rest()
        assert events2[-1][2]["success"] is True
        assert http.get(f"/runs/{rid2}").get_json()["output"] == "follow-up answer"
    finally:
        registry.close()
