"""One writer per session across real processes, on both stores (point 3 of sessions).

A child process (``session_child.py``) holds a session in a run gated on its
stdin; this process's run on the same session raises ``SessionBusy`` and
changes nothing; the other way round too. A holder killed with SIGKILL on
this host is taken over at once; a lease of another host only lapses (the
clock is injected: no 60 s wait); a process that exits with a run in flight
gives its lease back.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, List

import pytest
from celery_support import redis_for_module
from session_support import make_store

from loopctl import BareLoop, RunRegistry, SessionBusy
from loopctl.sessions.base import SessionStore
from loopctl.testing import ScriptedClient, call, reply

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    yield from redis_for_module(2)


@pytest.fixture(params=["sqlite", "redis"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[List[str]]:
    """[kind, where, prefix] shared by this process and the child."""
    kind = request.param
    where = str(tmp_path / "s.db") if kind == "sqlite" else request.getfixturevalue("redis_url")
    yield [kind, where, f"p{time.time_ns()}"]


def open_store(place: List[str], **kw: Any) -> SessionStore:
    kind, where, prefix = place
    if kind == "redis":
        kw["prefix"] = prefix
    return make_store(kind, where, **kw)


class Child:
    def __init__(self, place: List[str], sid: str, mode: str) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(TESTS), env.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen(
            [sys.executable, str(TESTS / "session_child.py"), *place, sid, mode],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )

    def line(self) -> str:
        assert self.proc.stdout is not None
        got = self.proc.stdout.readline().strip()
        if not got:
            self.proc.wait(30)
            assert self.proc.stderr is not None
            raise AssertionError(f"child said nothing; stderr:\n{self.proc.stderr.read()[-2000:]}")
        return got

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def finish(self) -> None:
        self.proc.wait(30)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()

    def kill9(self) -> None:
        self.proc.kill()
        self.finish()


def texts(store: SessionStore, sid: str) -> List[str]:
    return [f"{m.role.value}:{m.text}" for m in store.session(sid).messages()]


def test_3_a_run_here_while_another_process_holds_the_session_raises_session_busy(place: List[str]) -> None:
    store = open_store(place)
    BareLoop(ScriptedClient([reply("one")])).with_session(store.session("s/1")).run("hi")
    child = Child(place, "s/1", "hold")
    try:
        assert child.line() == "in-tool"
        before = texts(store, "s/1")
        client = ScriptedClient([reply("never")])
        with pytest.raises(SessionBusy):
            BareLoop(client).with_session(store.session("s/1")).run("here")
        assert client.requests == [] and texts(store, "s/1") == before
        child.release()
        assert child.line() == "done"
    finally:
        child.finish()
    after = texts(store, "s/1")
    assert after[:2] == ["user:hi", "assistant:one"] and after[2] == "user:from child"
    assert after[-1] == "assistant:child done"
    store.close()


def test_3_a_run_in_another_process_while_this_one_holds_the_session_is_refused(place: List[str]) -> None:
    import threading

    store = open_store(place)
    entered, go = threading.Event(), threading.Event()
    from loopctl import tool

    @tool
    def gate() -> str:
        """Waits for the test."""
        entered.set()
        go.wait(30)
        return "ok"

    loop = BareLoop(ScriptedClient([call("gate"), reply("mine")]), [gate]).with_session(store.session("s2"))
    handle = loop.start("here")
    assert entered.wait(10)
    child = Child(place, "s2", "try")
    try:
        assert child.line() == "busy"
    finally:
        child.finish()
    go.set()
    handle.result(10)
    assert texts(store, "s2")[-1] == "assistant:mine" and "user:child try" not in texts(store, "s2")
    child = Child(place, "s2", "try")
    try:
        assert child.line() == "ran"  # free once the run ended
    finally:
        child.finish()
    loop.close()
    store.close()


def test_3_a_holder_killed_with_sigkill_on_this_host_is_taken_over_at_once(place: List[str]) -> None:
    store = open_store(place)
    BareLoop(ScriptedClient([reply("one")])).with_session(store.session("k")).run("hi")
    child = Child(place, "k", "hold")
    try:
        assert child.line() == "in-tool"
    finally:
        child.kill9()  # SIGKILL: no finalize, no release; its lease would stay live for 60 s
    client = ScriptedClient([reply("mine")])
    assert BareLoop(client).with_session(store.session("k")).run("now").output == "mine"  # no wait
    assert texts(store, "k") == ["user:hi", "assistant:one", "user:now", "assistant:mine"]  # it wrote nothing
    child = Child(place, "gone", "hold")
    try:
        assert child.line() == "in-tool"
        with pytest.raises(SessionBusy):
            store.delete("gone")  # its holder lives
    finally:
        child.kill9()
    assert store.delete("gone") is False  # a dead holder's lease keeps nothing (the run never wrote)
    store.session("gone").acquire().release()
    store.close()


def test_3_a_lease_of_another_host_is_never_taken_over_and_lapses_with_its_expiry(place: List[str]) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(30)  # a pid that no longer exists, here; on the other host, who knows
    now = [1000.0]
    store = open_store(place, clock=lambda: now[0])
    token = "|".join([uuid.uuid4().hex, str(gone.pid), "1", "another-host/boot/pid:[1]"])
    assert store.backend.acquire("h", None, token, now[0], now[0] + 60, lambda held: False)
    with pytest.raises(SessionBusy):
        store.session("h").acquire()
    now[0] += 61
    store.session("h").acquire().release()  # lapsed
    store.close()


def lease_is_held(place: List[str], sid: str) -> bool:
    kind, where, prefix = place
    if kind == "sqlite":
        con = sqlite3.connect(where)
        try:
            return bool(con.execute("SELECT COUNT(*) FROM leases WHERE session_id = ?", (sid,)).fetchone()[0])
        finally:
            con.close()
    import redis

    client = redis.Redis.from_url(where)
    try:
        return bool(client.exists(f"{prefix}:{hashlib.sha256(sid.encode('utf-8')).hexdigest()}:lease"))
    finally:
        client.close()


def test_3_a_process_that_exits_with_a_run_in_flight_gives_its_lease_back(
    place: List[str], caplog: pytest.LogCaptureFixture
) -> None:
    store = open_store(place)
    BareLoop(ScriptedClient([reply("one")])).with_session(store.session("x")).run("hi")
    child = Child(place, "x", "exit")
    try:
        assert child.line() == "in-model"
        assert lease_is_held(place, "x")
        child.release()  # it calls sys.exit(0) with the run in flight
    finally:
        child.finish()
    assert child.proc.returncode == 0
    assert not lease_is_held(place, "x")  # given back at exit, not left to lapse or be taken over
    with caplog.at_level(logging.WARNING, logger="loopctl"):
        with RunRegistry(session_store=store) as registry:  # the restarted server
            rid = registry.start(BareLoop(ScriptedClient([reply("back")])), "again", session_id="x")
            assert registry.result(rid, 10).output == "back"
    assert "took over" not in caplog.text
    assert texts(store, "x") == ["user:hi", "assistant:one", "user:again", "assistant:back"]
    store.close()
