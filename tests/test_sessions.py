"""Session stores and ``BareLoop.with_session``, on both stores (SQLite file, real redis-server).

Each test names the point of the sessions feature it covers: (1) the stores,
(2) a loop continuing a stored conversation, written only by completed runs,
compaction's result stored, (3) one writer per session, (4) bad data and ids.
Processes are in ``test_sessions_processes.py``; the registry in
``test_sessions_registry.py``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, List

import pytest
from celery_support import redis_for_module
from session_support import corrupt_row, make_store

from loopctl import (
    BareLoop,
    Cancelled,
    LoopBusy,
    LoopError,
    Message,
    ModelError,
    RunRegistry,
    SessionBusy,
    SessionConfig,
    SessionCorrupt,
    ToolCallPart,
    ToolContext,
    ToolResultPart,
    tool,
)
from loopctl.messages import ThinkingPart
from loopctl.observers import CallbackObserver, RunEnd, RunStart
from loopctl.sessions import SQLiteSessionStore
from loopctl.sessions.base import SessionStore
from loopctl.testing import ScriptedClient, call, reply


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    yield from redis_for_module(1)


_counter = iter(range(1_000_000))


@pytest.fixture(params=["sqlite", "redis"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., SessionStore]]:
    """Opens stores of one kind at one place (as separate processes would)."""
    kind = request.param
    if kind == "sqlite":
        where = str(tmp_path / "sessions.db")
    else:
        where = request.getfixturevalue("redis_url")
    prefix = f"t{next(_counter)}:{time.time_ns()}"
    opened: List[SessionStore] = []

    def open_store(**kw: Any) -> SessionStore:
        if kind == "redis":
            kw.setdefault("prefix", prefix)
        store = make_store(kind, where, **kw)
        opened.append(store)
        return store

    open_store.kind = kind  # type: ignore[attr-defined]
    open_store.where = where  # type: ignore[attr-defined]
    open_store.prefix = prefix  # type: ignore[attr-defined]
    yield open_store
    for s in opened:
        s.close()


def texts(messages: List[Message]) -> List[str]:
    return [f"{m.role.value}:{m.text}" for m in messages]


def snapshot(store: SessionStore, sid: str) -> Any:
    s = store.session(sid)
    return texts(s.messages()), s.load()[0], [(i.id, i.messages, i.revision) for i in store.list()]


# -- 1. the stores ----------------------------------------------------------------------


def test_1_sqlite_store_keeps_one_row_per_message_in_wal_with_a_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = SQLiteSessionStore(path)
    lease = store.session("a").acquire()
    lease.append([Message.user("hi"), Message.assistant("hello")])
    lease.release()
    store.close()
    con = sqlite3.connect(path)
    try:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        rows = con.execute("SELECT seq FROM messages WHERE session_id = 'a' ORDER BY seq").fetchall()
        assert rows == [(0,), (1,)]
        assert con.execute("SELECT value FROM loopctl_meta WHERE key = 'sessions_schema'").fetchone() == ("2",)
    finally:
        con.close()


def test_1_every_part_type_round_trips_through_the_store(opener: Callable[..., SessionStore]) -> None:
    store = opener()
    msgs = [
        Message.user("question ✓"),
        Message("assistant", (ThinkingPart("hmm", "sig"), ToolCallPart("c1", "add", {"a": 1, "b": [2]}))),
        Message.from_tool_results([ToolResultPart("c1", "add", "3", False)]),
        Message.assistant("three"),
    ]
    lease = store.session("parts").acquire()
    assert lease.append(msgs) == 1
    lease.release()
    assert opener().session("parts").messages() == msgs  # a second store (another process) reads them


def test_1_lone_surrogates_round_trip_through_the_store(opener: Callable[..., SessionStore]) -> None:
    # What json.loads gives for a browser's string cut inside an emoji: a valid str with no UTF-8 form.
    cut = json.loads('"Nice \\ud83d"')
    msgs = [
        Message.user(cut),
        Message("assistant", (ToolCallPart("c1", "echo", {"text": "\udc00 low", "n": [cut]}),)),
        Message.from_tool_results([ToolResultPart("c1", "echo", "got \udfff", False)]),
        Message.assistant("reply \ud800 é ✓"),
    ]
    lease = opener().session("cut").acquire()
    try:
        lease.append(msgs)
    finally:
        lease.release()
    assert opener().session("cut").messages() == msgs  # a second store (another process) reads them back


def test_1_a_row_without_lone_surrogates_is_stored_as_before(tmp_path: Path) -> None:
    # Rows written by earlier versions are compared byte for byte by a replace: unchanged text stays unescaped.
    store = SQLiteSessionStore(tmp_path / "s.db")
    lease = store.session("a").acquire()
    try:
        lease.append([Message.user("é ✓ 🎉"), Message.user("cut \ud83d")])
    finally:
        lease.release()
    store.close()
    con = sqlite3.connect(tmp_path / "s.db")
    try:
        bodies = [r[0] for r in con.execute("SELECT body FROM messages WHERE session_id = 'a' ORDER BY seq")]
    finally:
        con.close()
    assert bodies[0] == json.dumps(Message.user("é ✓ 🎉").to_dict(), ensure_ascii=False, separators=(",", ":"))
    assert "\\ud83d" in bodies[1]


def test_1_list_by_owner_and_delete(opener: Callable[..., SessionStore]) -> None:
    store = opener()
    for sid, owner in (("a1", "alice"), ("a2", "alice"), ("b1", "bob")):
        lease = store.session(sid, owner=owner).acquire()
        lease.append([Message.user(sid)])
        lease.release()
    assert sorted(i.id for i in store.list(owner="alice")) == ["a1", "a2"]
    assert [i.id for i in store.list(owner="bob")] == ["b1"]
    assert sorted(i.id for i in store.list()) == ["a1", "a2", "b1"]
    assert store.list(owner="carol") == []
    with pytest.raises(KeyError):
        store.session("a1", owner="bob").messages()  # another owner's session is an unknown id
    assert store.delete("a1") is True
    assert store.delete("a1") is False
    assert sorted(i.id for i in store.list(owner="alice")) == ["a2"]
    assert store.session("a1").messages() == []


# -- 2. a loop on a stored session ---------------------------------------------------------


def test_2_a_new_loop_continues_the_stored_conversation(opener: Callable[..., SessionStore]) -> None:
    first = BareLoop(ScriptedClient([reply("one"), reply("two")])).with_session(opener().session("c"))
    first.run("hi")
    first.run("again")
    client = ScriptedClient([reply("three")])
    later = BareLoop(client).with_session(opener().session("c"))  # a restarted process
    assert later.run("more").output == "three"
    sent = texts(list(client.requests[0].messages))
    assert sent == ["user:hi", "assistant:one", "user:again", "assistant:two", "user:more"]
    assert texts(opener().session("c").messages()) == sent + ["assistant:three"]


def test_2_a_run_with_lone_surrogates_in_its_input_and_reply_completes_and_is_stored(
    opener: Callable[..., SessionStore],
) -> None:
    cut = json.loads('"Nice \\ud83d"')
    loop = BareLoop(ScriptedClient([reply("Thanks \udc00!")])).with_session(opener().session("c"))
    assert loop.run(cut).output == "Thanks \udc00!"
    assert [m.text for m in opener().session("c").messages()] == [cut, "Thanks \udc00!"]
    assert opener().session("c").messages() == loop.conversation()
    # A host that rebuilt the loop from the store replaces the stored conversation
    # at its next write: the rows with escapes are the same rows, so none is removed.
    store = opener()
    session = store.session("c")
    revision, history = session.load()
    again = BareLoop.from_history(ScriptedClient([reply("more \ud800")]), history=history)
    assert again.with_session(session, revision=revision).run("again").output == "more \ud800"
    assert [m.text for m in store.session("c").messages()] == [cut, "Thanks \udc00!", "again", "more \ud800"]
    assert store.removed("c") == []  # type: ignore[attr-defined]


def test_2_a_loop_reads_again_what_another_writer_added_between_its_runs(
    opener: Callable[..., SessionStore],
) -> None:
    store = opener()
    client = ScriptedClient([reply("one"), reply("three")])
    loop = BareLoop(client).with_session(store.session("c"))
    loop.run("hi")
    other = BareLoop(ScriptedClient([reply("two")])).with_session(opener().session("c"))
    other.run("elsewhere")
    loop.run("back")
    assert texts(list(client.requests[1].messages)) == [
        "user:hi", "assistant:one", "user:elsewhere", "assistant:two", "user:back",
    ]
    assert len(store.session("c").messages()) == 6


def test_2_a_cancelled_run_leaves_the_store_exactly_as_it_was(opener: Callable[..., SessionStore]) -> None:
    store = opener()
    BareLoop(ScriptedClient([reply("one")])).with_session(store.session("c")).run("hi")
    before = snapshot(store, "c")
    entered = threading.Event()

    @tool
    def wait(ctx: ToolContext) -> str:
        """Waits for the cancel."""
        entered.set()
        ctx.cancel.wait(10)
        return "late"

    loop = BareLoop(ScriptedClient([call("wait"), reply("never")]), [wait]).with_session(store.session("c"))
    handle = loop.start("go")
    assert entered.wait(10)
    handle.cancel("user left")
    with pytest.raises(Cancelled):
        handle.result(10)
    assert snapshot(store, "c") == before
    loop.close()


def test_2_a_failed_run_leaves_the_store_as_it_was_and_a_new_session_absent(
    opener: Callable[..., SessionStore],
) -> None:
    store = opener()
    BareLoop(ScriptedClient([reply("one")])).with_session(store.session("c")).run("hi")
    before = snapshot(store, "c")
    loop = BareLoop(ScriptedClient([call("nope"), ModelError("down")])).with_session(store.session("c"))
    with pytest.raises(ModelError):
        loop.run("go")
    assert snapshot(store, "c") == before
    fresh = BareLoop(ScriptedClient([ModelError("down")])).with_session(store.session("new"))
    with pytest.raises(ModelError):
        fresh.run("go")
    assert [i.id for i in store.list()] == ["c"]  # the failed first run created nothing


def test_2_after_compaction_the_store_holds_what_the_loop_would_send(opener: Callable[..., SessionStore]) -> None:
    store = opener()
    long = [Message.user("u" * 1200) if i % 2 == 0 else Message.assistant("a" * 1200) for i in range(30)]
    lease = store.session("c").acquire()
    lease.append(long)
    lease.release()
    client = ScriptedClient([reply("short")])
    loop = BareLoop(client, config=SessionConfig(context_window=10_000)).with_session(store.session("c"))
    loop.run("go")
    stored = store.session("c").messages()
    assert stored == loop.conversation()
    assert stored[:-1] == list(client.requests[0].messages)  # exactly what was sent, then the reply
    assert len(stored) < len(long)
    removed = store.removed("c")  # type: ignore[attr-defined]
    kept = len(long) - len(removed)
    assert 0 < len(removed) < len(long) and {rev for rev, _ in removed} == {2}
    # The audit keeps exactly what the compaction took out; the shared head stayed in place.
    assert long == stored[:kept] + [Message.from_dict(json.loads(row)) for _, row in removed]
    BareLoop(ScriptedClient([reply("next")]), config=SessionConfig(context_window=10_000)).with_session(
        store.session("c")
    ).run("again")
    assert store.session("c").messages()[: len(stored)] == stored  # later runs append again


def test_2_a_write_whose_lease_was_lost_fails_the_run_and_writes_nothing(
    opener: Callable[..., SessionStore],
) -> None:
    now = [1000.0]
    store = opener(lease_s=60, clock=lambda: now[0])
    entered, go = threading.Event(), threading.Event()

    @tool
    def wait() -> str:
        """Waits for the test."""
        entered.set()
        go.wait(10)
        return "done"

    loop = BareLoop(ScriptedClient([call("wait"), reply("ok")]), [wait]).with_session(store.session("c"))
    handle = loop.start("go")
    assert entered.wait(10)
    now[0] += 3600  # the holder looks dead: its lease expired, and another writer takes the session
    thief = store.session("c").acquire()
    thief.append([Message.user("thief")])
    go.set()
    with pytest.raises(SessionBusy):
        handle.result(10)
    thief.release()
    assert texts(store.session("c").messages()) == ["user:thief"]
    loop.close()


# -- 3. one writer per session ----------------------------------------------------------------


def test_3_a_second_run_on_a_busy_session_raises_session_busy_and_changes_nothing(
    opener: Callable[..., SessionStore],
) -> None:
    store = opener()
    BareLoop(ScriptedClient([reply("one")])).with_session(store.session("c")).run("hi")
    entered, go = threading.Event(), threading.Event()

    @tool
    def wait() -> str:
        """Waits for the test."""
        entered.set()
        go.wait(10)
        return "done"

    first = BareLoop(ScriptedClient([call("wait"), reply("ok")]), [wait]).with_session(store.session("c"))
    handle = first.start("first")
    assert entered.wait(10)
    before = snapshot(store, "c")
    client = ScriptedClient([reply("never")])
    second = BareLoop(client).with_session(opener().session("c"))
    results: List[BaseException] = []

    def try_run() -> None:
        try:
            second.run("second")
        except BaseException as exc:
            results.append(exc)

    t = threading.Thread(target=try_run)
    t.start()
    t.join(10)
    (err,) = results
    assert isinstance(err, SessionBusy) and isinstance(err, LoopBusy)
    assert err.session_id == "c" and "'c'" in str(err)
    assert client.requests == [] and second.session.runs == []
    assert snapshot(store, "c") == before
    with pytest.raises(SessionBusy):
        store.delete("c")
    go.set()
    handle.result(10)
    stored = texts(store.session("c").messages())
    assert stored[-4] == "user:first" and stored[-1] == "assistant:ok"
    assert second.run("second").output == "never"  # free again once the first run ended
    go.clear()
    entered.clear()
    third = BareLoop(ScriptedClient([call("wait"), reply("ok")]), [wait]).with_session(store.session("c"))
    handle = third.start("third", run_id="same-id")
    assert entered.wait(10)
    with pytest.raises(SessionBusy):
        BareLoop(ScriptedClient([reply("never")])).with_session(store.session("c")).run("x", run_id="same-id")
    go.set()
    handle.result(10)
    third.close()
    first.close()


def test_3_a_lapsed_lease_frees_the_session_and_a_live_one_is_renewed(
    opener: Callable[..., SessionStore],
) -> None:
    now = [1000.0]
    store = opener(lease_s=60, clock=lambda: now[0])
    session = store.session("c")
    holder = session.acquire()  # a holder that then dies without releasing
    now[0] += 59
    with pytest.raises(SessionBusy):
        session.acquire()
    now[0] += 2
    taker = session.acquire()  # 61 s without a renewal: lapsed
    taker.release()
    holder._stop.set()  # stop the dead holder's renewal thread (its process is gone)
    holder.release()

    renewed = threading.Event()
    started = time.time()
    ticks = [0]

    def clock() -> float:
        ticks[0] += 1
        if ticks[0] > 5:  # the acquire, then four renewals
            renewed.set()
        return time.time()

    live = opener(lease_s=1.5, clock=clock)
    lease = live.session("r").acquire()
    assert renewed.wait(20)  # the keeper renews it on its own thread, every lease_s / 3
    assert time.time() - started > 1.5  # older than one lease: alive only because it was renewed
    with pytest.raises(SessionBusy):
        live.session("r").acquire()
    lease.release()
    live.session("r").acquire().release()


# -- 4. bad data and ids -------------------------------------------------------------------------


def test_4_a_corrupt_row_raises_session_corrupt_naming_the_session_and_others_load(
    opener: Callable[..., SessionStore],
) -> None:
    store = opener()
    for sid in ("bad one", "good"):
        lease = store.session(sid).acquire()
        lease.append([Message.user(f"{sid} secret-text"), Message.assistant("ok")])
        lease.release()
    corrupt_row(opener.kind, opener.where, "bad one", 1, opener.prefix)  # type: ignore[attr-defined]
    with pytest.raises(SessionCorrupt) as info:
        store.session("bad one").messages()
    assert info.value.session_id == "bad one" and info.value.position == 1
    assert "'bad one'" in str(info.value) and "not json" not in str(info.value)
    assert texts(store.session("good").messages()) == ["user:good secret-text", "assistant:ok"]
    client = ScriptedClient([reply("never")])
    loop = BareLoop(client).with_session(store.session("bad one"))
    with pytest.raises(SessionCorrupt):
        loop.run("go")
    assert client.requests == []
    store.session("bad one").acquire().release()  # the failed load gave the lease back


def test_4_a_run_on_a_corrupt_session_is_a_failed_run_never_a_refused_start(
    opener: Callable[..., SessionStore],
) -> None:
    """``SessionCorrupt`` is the run's error (with its ``Run``), through ``start()`` and a registry too.

    A busy session refuses a start (nothing exists); an unreadable one
    fails the run at its start, before any model call: the run has its
    record and its bracket of events, and the store is left as it was. A
    cancel fired on the signal before it is still that run's (one cancel,
    one cancelled run).
    """
    store = opener()
    lease = store.session("bad one").acquire()
    lease.append([Message.user("question"), Message.assistant("answer")])
    lease.release()
    corrupt_row(opener.kind, opener.where, "bad one", 1, opener.prefix)  # type: ignore[attr-defined]
    client = ScriptedClient([reply("never")])
    events: List[Any] = []
    loop = BareLoop(client).with_session(store.session("bad one")).with_observer(CallbackObserver(events.append))
    handle = loop.start("one")  # no refusal: the run starts
    with pytest.raises(SessionCorrupt) as info:
        handle.result(10)
    run = info.value.run
    assert run is not None and run is handle.record and run.stop_reason is info.value and run.end is not None
    assert [type(e) for e in events] == [RunStart, RunEnd] and not events[-1].success
    loop.cancel_signal().cancel("before the next run")
    with pytest.raises(Cancelled):  # taken before the run's end: the cancel is how it ends
        loop.run("two")
    assert not loop.is_cancelled()
    with pytest.raises(SessionCorrupt):  # and the next run fails as the first did
        loop.run("three")
    assert client.requests == [] and [type(r.stop_reason) for r in loop.session.runs] == [
        SessionCorrupt,
        Cancelled,
        SessionCorrupt,
    ]
    with RunRegistry(session_store=store) as registry:
        rid = registry.start(BareLoop(client), "four", session_id="bad one")
        with pytest.raises(SessionCorrupt) as again:
            registry.result(rid, timeout=10)
        assert again.value.run is not None and again.value.run.id == rid
        status = registry.status(rid)
        assert status.state == "failed" and "'bad one'" in (status.error or "")
        assert [e["type"] for _, e in registry.events(rid, timeout=10)] == ["run_start", "run_end"]
    assert client.requests == []
    with pytest.raises(SessionCorrupt):  # the store is as it was: still unreadable, nothing written
        store.session("bad one").messages()
    store.session("bad one").acquire().release()  # no run kept its lease


@pytest.mark.parametrize(
    "sid", ["ünïcødé 🎉", "a/b/../c", "with space\nand newline", "x" * 1024, "%2F:*?[]{}", "0"]
)
def test_4_any_non_empty_id_works(opener: Callable[..., SessionStore], sid: str) -> None:
    store = opener()
    BareLoop(ScriptedClient([reply("ok")])).with_session(store.session(sid)).run("hi")
    assert texts(opener().session(sid).messages()) == ["user:hi", "assistant:ok"]
    assert [i.id for i in store.list()] == [sid]
    assert store.delete(sid) is True


def test_4_bad_ids_are_refused(opener: Callable[..., SessionStore]) -> None:
    store = opener()
    with pytest.raises(ValueError):
        store.session("")
    with pytest.raises(TypeError):
        store.session(7)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        store.session("\ud800")  # not valid Unicode
    with pytest.raises(ValueError):
        store.delete("")
    with pytest.raises(ValueError):
        store.session("x" * 65_537)  # bounded: an id is a name, not a payload
    assert store.session("y" * 65_536).messages() == []


def test_with_session_is_a_builder_step(tmp_path: Path) -> None:
    store = SQLiteSessionStore(tmp_path / "s.db")
    loop = BareLoop(ScriptedClient([reply("ok")]))
    with pytest.raises(LoopError):
        loop.with_session("not a session")
    loop.with_session(store.session("c")).run("hi")
    with pytest.raises(LoopError):
        loop.with_session(store.session("d"))
    assert loop.stored_session.id == "c"
    store.close()


def test_2_a_host_that_built_the_loop_from_session_load_continues_without_a_second_read(
    opener: Callable[..., SessionStore],
) -> None:
    store = opener()
    BareLoop(ScriptedClient([reply("one")])).with_session(store.session("c")).run("hi")
    session = store.session("c")
    revision, history = session.load()
    client = ScriptedClient([reply("two")])
    BareLoop.from_history(client, history=history).with_session(session, revision=revision).run("again")
    assert texts(store.session("c").messages()) == ["user:hi", "assistant:one", "user:again", "assistant:two"]
    assert store.removed("c") == []  # type: ignore[attr-defined]  # the replace only extended it

    # The store moved past the revision the host read: the run reads it again.
    revision, history = session.load()
    BareLoop(ScriptedClient([reply("three")])).with_session(store.session("c")).run("elsewhere")
    client = ScriptedClient([reply("four")])
    BareLoop.from_history(client, history=history).with_session(session, revision=revision).run("last")
    assert texts(list(client.requests[0].messages))[4:] == ["user:elsewhere", "assistant:three", "user:last"]
    assert len(store.session("c").messages()) == 8


def test_2_the_brain_takes_a_reloaded_history_only_between_runs() -> None:
    from loopctl.machine import LoopMachine, MachinePolicy

    m = LoopMachine([Message.user("old")])
    epoch = m.history_epoch
    m.load_history([Message.user("a"), Message.assistant("b")])
    assert [x.text for x in m.history] == ["a", "b"] and m.history_epoch == epoch + 1
    m.accept_input("next")
    m.next_step(MachinePolicy(5, 0, 80, True))
    with pytest.raises(RuntimeError):
        m.load_history([])  # a run is in flight: its pending would be orphaned
    assert [x.text for x in m.history] == ["a", "b"]
