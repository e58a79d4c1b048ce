"""A run whose thread cannot start gives its session's lease back at once."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from loopctl import BareLoop
from loopctl.sessions import SQLiteSessionStore
from loopctl.testing import ScriptedClient, reply


def test_a_run_thread_that_cannot_start_leaves_the_session_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SQLiteSessionStore(tmp_path / "s.db")
    loop = BareLoop(ScriptedClient([reply("hello")])).with_session(store.session("ada"))
    real_start = threading.Thread.start

    def refuse_run_threads(self: threading.Thread) -> None:
        if self.name.startswith("loopctl-run-"):
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", refuse_run_threads)
    with pytest.raises(RuntimeError, match="can't start"):
        loop.run("hi")
    monkeypatch.setattr(threading.Thread, "start", real_start)
    assert not [t for t in threading.enumerate() if t.name.startswith("loopctl-session-lease")]
    # Another loop on the same session is not refused as busy, and this one runs again.
    other = BareLoop(ScriptedClient([reply("again")])).with_session(store.session("ada"))
    assert other.run("hi").output == "again"
    other.close()
    loop.close()
    store.close()


def test_a_start_with_a_session_whose_thread_cannot_start_leaves_the_loop_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SQLiteSessionStore(tmp_path / "s.db")
    loop = BareLoop(ScriptedClient([reply("plain")]))
    real_start = threading.Thread.start

    def refuse_run_threads(self: threading.Thread) -> None:
        if self.name.startswith("loopctl-run-"):
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", refuse_run_threads)
    with pytest.raises(RuntimeError, match="can't start"):
        loop.start("hi", session=store.session("ada"))
    monkeypatch.setattr(threading.Thread, "start", real_start)
    # The session was never the loop's: a plain run writes nothing into it.
    assert loop.run("unrelated").output == "plain"
    assert store.session("ada").messages() == []
    loop.close()
    store.close()
