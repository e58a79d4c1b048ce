"""Sessions whose stored record went bad, and sessions deleted and made again, on both stores.

A session's record (its revision, update time, a key of the wrong Redis
type, a row that is not UTF-8) that cannot be read is that session's
``SessionCorrupt``: the others load, run and list as before. A loop that
kept a session that was then deleted and made again reads the new one
(incarnations), and a file made by the first schema is migrated.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, List

import pytest
from celery_support import redis_for_module
from session_support import make_store
from support import Recorder

from loopctl import BareLoop, Message, SessionCorrupt
from loopctl.observers import RunEnd, RunStart
from loopctl.sessions import SQLiteSessionStore
from loopctl.sessions.base import SessionStore
from loopctl.testing import ScriptedClient, reply


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    yield from redis_for_module(3)


class Place:
    """Where one test's stores live, and raw access to spoil what they hold."""

    def __init__(self, kind: str, where: str) -> None:
        self.kind, self.where = kind, where
        self.prefix = f"r{time.time_ns()}"
        self.opened: List[SessionStore] = []

    def open(self, **kw: Any) -> SessionStore:
        if self.kind == "redis":
            kw.setdefault("prefix", self.prefix)
        store = make_store(self.kind, self.where, **kw)
        self.opened.append(store)
        return store

    def key(self, session_id: str, part: str) -> str:
        return f"{self.prefix}:{hashlib.sha256(session_id.encode('utf-8')).hexdigest()}:{part}"

    def spoil(self, sql: str, args: Any, redis_cmd: Callable[[Any], object]) -> None:
        """Run ``sql`` on the SQLite file, or ``redis_cmd(client)`` on Redis."""
        if self.kind == "sqlite":
            con = sqlite3.connect(self.where)
            with con:
                con.execute(sql, args)
            con.close()
            return
        import redis

        client = redis.Redis.from_url(self.where)
        try:
            redis_cmd(client)
        finally:
            client.close()


@pytest.fixture(params=["sqlite", "redis"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    kind = request.param
    where = str(tmp_path / "s.db") if kind == "sqlite" else request.getfixturevalue("redis_url")
    p = Place(kind, where)
    yield p
    for store in p.opened:
        store.close()


def texts(messages: List[Message]) -> List[str]:
    return [f"{m.role.value}:{m.text}" for m in messages]


def two_sessions(store: SessionStore) -> None:
    for sid in ("good", "bad"):
        BareLoop(ScriptedClient([reply(f"{sid} answer")])).with_session(store.session(sid)).run(f"{sid} question")


def assert_only_bad_is_corrupt(
    store: SessionStore, caplog: pytest.LogCaptureFixture, *, record: bool = True, lease: bool = True
) -> None:
    """``bad`` raises ``SessionCorrupt`` naming it; ``good`` reads, runs and lists as before.

    ``record``: the session's record is bad (``list()`` leaves it out);
    else a message row is (the record lists). ``lease``: the lease can
    still be taken (a Redis meta key of the wrong type refuses it too).
    """
    with pytest.raises(SessionCorrupt) as info:
        store.session("bad").messages()
    assert info.value.session_id == "bad" and "'bad'" in str(info.value)
    client = ScriptedClient([reply("never")])
    rec = Recorder()
    loop = BareLoop(client).with_session(store.session("bad")).with_observer(rec)
    with pytest.raises(SessionCorrupt) as failed:
        loop.run("again")
    assert client.requests == []  # it failed at the run's start, before the model
    # A failed run, not a refused one: its record and its bracket of events.
    run = failed.value.run
    assert run is not None and loop.session.runs == [run] and run.stop_reason is failed.value
    assert run.end is not None and run.turns == [] and run.input == "again"
    assert rec.types() == [RunStart, RunEnd] and rec.of(RunEnd)[0].error_type == "SessionCorrupt"
    if lease:
        store.session("bad").acquire().release()  # the failed run gave the lease back
    else:
        with pytest.raises(SessionCorrupt):
            store.session("bad").acquire()
    with caplog.at_level(logging.WARNING, logger="loopctl"):
        listed = sorted(i.id for i in store.list())  # never failed for all
    if record:
        assert listed == ["good"] and ("'bad'" in caplog.text or "hash" in caplog.text)
    else:
        assert listed == ["bad", "good"]
    assert texts(store.session("good").messages()) == ["user:good question", "assistant:good answer"]
    assert BareLoop(ScriptedClient([reply("fine")])).with_session(store.session("good")).run("more").output == "fine"
    assert store.delete("bad") is True  # a corrupt session can still be removed
    assert store.session("bad").messages() == []


def test_a_revision_that_is_not_a_number_is_that_sessions_corruption_only(
    place: Place, caplog: pytest.LogCaptureFixture
) -> None:
    store = place.open()
    two_sessions(store)
    place.spoil(
        "UPDATE sessions SET revision = 'zz' WHERE id = 'bad'", (),
        lambda r: r.hset(place.key("bad", "meta"), "revision", "zz"),
    )
    with pytest.raises(SessionCorrupt, match="revision"):
        lease = store.session("bad").acquire()
        try:
            lease.append([Message.user("x")])  # a write cannot add one to it either
        finally:
            lease.release()
    assert_only_bad_is_corrupt(store, caplog)


def test_sqlite_an_update_time_that_is_not_a_number_leaves_the_session_out_of_the_list_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    place = Place("sqlite", str(tmp_path / "s.db"))
    store = place.open()
    two_sessions(store)
    place.spoil("UPDATE sessions SET updated = 'zz' WHERE id = 'bad'", (), lambda r: None)
    with caplog.at_level(logging.WARNING, logger="loopctl"):
        assert [i.id for i in store.list()] == ["good"]
    assert "session 'bad' is corrupt" in caplog.text
    # Its conversation is intact: it reads, and a run on it writes a good time again.
    assert BareLoop(ScriptedClient([reply("ok")])).with_session(store.session("bad")).run("on").output == "ok"
    assert sorted(i.id for i in store.list()) == ["bad", "good"]
    store.close()


def test_a_message_row_that_is_not_utf8_is_session_corrupt_without_its_text(
    place: Place, caplog: pytest.LogCaptureFixture
) -> None:
    store = place.open()
    two_sessions(store)
    secret = b'\xff{"api_key":"sk-live-SECRET1234567890"}'
    place.spoil(
        "UPDATE messages SET body = CAST(? AS TEXT) WHERE session_id = 'bad' AND seq = 1", (secret,),
        lambda r: r.lset(place.key("bad", "msgs"), 1, secret),
    )
    with pytest.raises(SessionCorrupt) as info:
        store.session("bad").messages()
    assert info.value.position == 1 and "SECRET" not in str(info.value) and "api_key" not in str(info.value)
    assert_only_bad_is_corrupt(store, caplog, record=False)
    assert "SECRET" not in caplog.text


def test_sqlite_an_owner_that_is_not_utf8_is_that_sessions_corruption_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    place = Place("sqlite", str(tmp_path / "s.db"))
    store = place.open()
    two_sessions(store)
    place.spoil("UPDATE sessions SET owner = CAST(? AS TEXT) WHERE id = 'bad'", (b"\xffsk-live-SECRET1234567890",),
                lambda r: None)
    with pytest.raises(SessionCorrupt) as info:  # taking the lease reads the owner too
        store.session("bad").acquire()
    assert "SECRET" not in str(info.value)
    assert_only_bad_is_corrupt(store, caplog, lease=False)
    assert "SECRET" not in caplog.text
    store.close()


@pytest.mark.parametrize("part", ["msgs", "meta"])
def test_redis_a_key_of_the_wrong_type_is_that_sessions_corruption_only(
    redis_url: str, part: str, caplog: pytest.LogCaptureFixture
) -> None:
    place = Place("redis", redis_url)
    store = place.open()
    two_sessions(store)
    key = place.key("bad", part)
    place.spoil("", (), lambda r: (r.delete(key), r.set(key, "garbage")))
    assert_only_bad_is_corrupt(store, caplog, lease=part != "meta")
    store.close()


# -- deleted and made again ------------------------------------------------------------------


def test_a_loop_whose_session_was_deleted_and_made_again_reads_the_new_one(place: Place) -> None:
    store = place.open()
    client = ScriptedClient([reply("secret-answer"), reply("a2")])
    a = BareLoop(client).with_session(store.session("s"))
    a.run("my secret")
    assert store.delete("s") is True
    BareLoop(ScriptedClient([reply("b1")])).with_session(place.open().session("s")).run("b-hello")
    assert store.session("s").load()[0] == 1  # back at the revision loop A last wrote
    a.run("a-next")
    sent = texts(list(client.requests[-1].messages))
    assert sent == ["user:b-hello", "assistant:b1", "user:a-next"]  # not the deleted conversation
    assert texts(store.session("s").messages()) == sent + ["assistant:a2"]  # loop and store agree
    a.close()


def test_a_host_that_read_a_session_before_it_was_made_again_gets_the_new_one(place: Place) -> None:
    store = place.open()
    BareLoop(ScriptedClient([reply("old")])).with_session(store.session("s")).run("old question")
    snapshot = store.session("s").read()
    assert snapshot.revision == 1 and snapshot.incarnation
    store.delete("s")
    BareLoop(ScriptedClient([reply("new")])).with_session(store.session("s")).run("new question")
    assert store.session("s").read().incarnation != snapshot.incarnation
    client = ScriptedClient([reply("next")])
    loop = BareLoop.from_history(client, history=snapshot.messages)
    loop.with_session(store.session("s"), revision=snapshot.revision, incarnation=snapshot.incarnation).run("go")
    assert texts(list(client.requests[0].messages)) == ["user:new question", "assistant:new", "user:go"]
    assert texts(store.session("s").messages()) == ["user:new question", "assistant:new", "user:go", "assistant:next"]


_SCHEMA_1 = (
    "CREATE TABLE loopctl_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "INSERT INTO loopctl_meta VALUES ('sessions_schema', '1')",
    "CREATE TABLE sessions (id TEXT PRIMARY KEY, owner TEXT, revision INTEGER NOT NULL,"
    " created REAL NOT NULL, updated REAL NOT NULL)",
    "CREATE INDEX sessions_owner ON sessions(owner, updated)",
    "CREATE TABLE messages (session_id TEXT NOT NULL, seq INTEGER NOT NULL,"
    " body TEXT NOT NULL, PRIMARY KEY (session_id, seq))",
    "CREATE TABLE leases (session_id TEXT PRIMARY KEY, token TEXT NOT NULL, until REAL NOT NULL)",
    "CREATE TABLE removed (session_id TEXT NOT NULL, revision INTEGER NOT NULL,"
    " seq INTEGER NOT NULL, body TEXT NOT NULL, at REAL NOT NULL)",
    "INSERT INTO sessions VALUES ('old', 'ann', 1, 1.0, 1.0)",
    """INSERT INTO messages VALUES ('old', 0, '{"role":"user","parts":[{"type":"text","text":"hi"}]}')""",
)


def test_a_file_made_by_the_first_schema_is_migrated_and_its_sessions_go_on(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    con = sqlite3.connect(path)
    with con:
        for stmt in _SCHEMA_1:
            con.execute(stmt)
    con.close()
    store = SQLiteSessionStore(path)
    assert texts(store.session("old", owner="ann").messages()) == ["user:hi"]
    assert store.session("old", owner="ann").read().incarnation is None  # stored before incarnations
    client = ScriptedClient([reply("one"), reply("two")])
    a = BareLoop(client).with_session(store.session("old", owner="ann"))
    a.run("again")
    assert [(i.id, i.revision, i.messages) for i in store.list(owner="ann")] == [("old", 2, 3)]
    # Deleted and made again: the new incarnation is told from the old one's none.
    store.delete("old")
    for _ in range(2):
        BareLoop(ScriptedClient([reply("b")])).with_session(store.session("old", owner="ann")).run("b")
    a.run("a")
    assert texts(list(client.requests[-1].messages)) == ["user:b", "assistant:b", "user:b", "assistant:b", "user:a"]
    store.close()
    con = sqlite3.connect(path)
    try:
        assert con.execute("SELECT value FROM loopctl_meta WHERE key = 'sessions_schema'").fetchone() == ("2",)
        assert "incarnation" in {r[1] for r in con.execute("PRAGMA table_info(sessions)")}
    finally:
        con.close()
