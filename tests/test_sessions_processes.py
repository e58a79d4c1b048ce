"""One writer per session across real processes, on both stores (point 3 of sessions).

A child process (``session_child.py``) holds a session in a run gated on its
stdin; this process's run on the same session raises ``SessionBusy`` and
changes nothing; the other way round too; and a holder killed with SIGKILL
frees the session once its lease lapses (the clock is injected: no 60 s wait).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, List

import pytest
from celery_support import RedisServer, missing_requirements
from session_support import make_store

from loopctl import BareLoop, SessionBusy
from loopctl.sessions.base import SessionStore
from loopctl.testing import ScriptedClient, call, reply

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    why = missing_requirements()
    if why is not None:
        pytest.skip(why)
    server = RedisServer()
    try:
        yield server.url(2)
    finally:
        server.stop()


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


def test_3_a_killed_holder_frees_the_session_when_its_lease_lapses(place: List[str]) -> None:
    store = open_store(place)
    child = Child(place, "k", "hold")
    try:
        assert child.line() == "in-tool"
    finally:
        child.kill9()  # SIGKILL: no finalize, no release
    with pytest.raises(SessionBusy):  # its lease is still live (60 s)
        BareLoop(ScriptedClient([reply("never")])).with_session(store.session("k")).run("too soon")
    late: Callable[[], float] = lambda: time.time() + 61  # noqa: E731  (a minute later)
    later = open_store(place, clock=late)
    assert BareLoop(ScriptedClient([reply("mine")])).with_session(later.session("k")).run("later").output == "mine"
    assert texts(store, "k") == ["user:later", "assistant:mine"]  # the killed run wrote nothing
    later.close()
    store.close()
