"""A run whose thread cannot start gives its session's lease back at once."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from loopctl import BareLoop
from loopctl.sessions import SQLiteSessionStore
from loopctl.testing import ScriptedClient, reply


class RunThreads:
    """Makes the start of a run's thread fail (``refuse``) until ``allow``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.real_start = threading.Thread.start

    def refuse(self) -> None:
        real_start = self.real_start

        def refuse_run_threads(thread: threading.Thread) -> None:
            if thread.name.startswith("loopctl-run-"):
                raise RuntimeError("can't start new thread")
            real_start(thread)

        self.monkeypatch.setattr(threading.Thread, "start", refuse_run_threads)

    def allow(self) -> None:
        self.monkeypatch.setattr(threading.Thread, "start", self.real_start)


@pytest.fixture
def run_threads(monkeypatch: pytest.MonkeyPatch) -> RunThreads:
    return RunThreads(monkeypatch)


def test_a_run_thread_that_cannot_start_leaves_the_session_free(tmp_path: Path, run_threads: RunThreads) -> None:
    store = SQLiteSessionStore(tmp_path / "s.db")
    loop = BareLoop(ScriptedClient([reply("hello")])).with_session(store.session("ada"))
    run_threads.refuse()
    with pytest.raises(RuntimeError, match="can't start"):
        loop.run("hi")
    run_threads.allow()
    assert not [t for t in threading.enumerate() if t.name.startswith("loopctl-session-lease")]
    # Another loop on the same session is not refused as busy, and this one runs again.
    other = BareLoop(ScriptedClient([reply("again")])).with_session(store.session("ada"))
    assert other.run("hi").output == "again"
    other.close()
    loop.close()
    store.close()


def test_a_start_with_a_session_whose_thread_cannot_start_leaves_the_loop_as_it_was(
    tmp_path: Path, run_threads: RunThreads
) -> None:
    store = SQLiteSessionStore(tmp_path / "s.db")
    loop = BareLoop(ScriptedClient([reply("plain")]))
    run_threads.refuse()
    with pytest.raises(RuntimeError, match="can't start"):
        loop.start("hi", session=store.session("ada"))
    run_threads.allow()
    # The session was never the loop's: a plain run writes nothing into it.
    assert loop.run("unrelated").output == "plain"
    assert store.session("ada").messages() == []
    loop.close()
    store.close()
