"""``RunRegistry(session_store=...)`` and ``start(..., session_id=..., owner=...)`` (point 5 of sessions).

A web server makes a fresh loop per request; the registry attaches the
stored session, so a restarted server (a new registry, a new store object
on the same file) shows the conversation and continues it.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import List

import pytest

from loopctl import BareLoop, ConfigError, LoopBusy, Message, RunRegistry, SessionBusy, tool
from loopctl.sessions import SQLiteSessionStore
from loopctl.testing import ScriptedClient, call, reply
from loopctl.tools import Tool


def texts(messages: List[Message]) -> List[str]:
    return [f"{m.role.value}:{m.text}" for m in messages]


def test_5_a_restarted_server_continues_the_stored_conversation(tmp_path: Path) -> None:
    db = tmp_path / "web.db"
    store = SQLiteSessionStore(db)
    with RunRegistry(session_store=store) as reg:
        rid = reg.start(BareLoop(ScriptedClient([reply("one")])), "hi", session_id="page/1", owner="alice")
        reg.result(rid, 10, owner="alice")
        rid = reg.start(BareLoop(ScriptedClient([reply("two")])), "again", session_id="page/1", owner="alice")
        reg.result(rid, 10, owner="alice")
    store.close()

    store = SQLiteSessionStore(db)  # the server came back
    assert texts(store.session("page/1", owner="alice").messages()) == [
        "user:hi", "assistant:one", "user:again", "assistant:two",
    ]
    assert [i.id for i in store.list(owner="alice")] == ["page/1"]
    client = ScriptedClient([reply("three")])
    with RunRegistry(session_store=store) as reg:
        rid = reg.start(BareLoop(client), "more", session_id="page/1", owner="alice")
        assert reg.result(rid, 10, owner="alice").output == "three"
    assert texts(list(client.requests[0].messages))[:4] == ["user:hi", "assistant:one", "user:again", "assistant:two"]
    assert len(store.session("page/1", owner="alice").messages()) == 6
    store.close()


def test_5_a_loop_for_conversation_keeps_its_session_across_runs(tmp_path: Path) -> None:
    store = SQLiteSessionStore(tmp_path / "s.db")
    client = ScriptedClient([reply("one"), reply("two")])
    with RunRegistry(session_store=store) as reg:
        loop = reg.loop_for("conv", lambda: BareLoop(client))
        reg.result(reg.start(loop, "hi", session_id="conv"), 10)
        reg.result(reg.start(loop, "again", session_id="conv"), 10)
        with pytest.raises(ConfigError):
            reg.start(loop, "other", session_id="another conversation")
    assert len(store.session("conv").messages()) == 4
    store.close()


def test_5_another_owners_session_is_an_unknown_id_and_bad_arguments_are_refused(tmp_path: Path) -> None:
    store = SQLiteSessionStore(tmp_path / "s.db")
    with RunRegistry(session_store=store) as reg:
        rid = reg.start(BareLoop(ScriptedClient([reply("one")])), "hi", session_id="s", owner="alice")
        reg.result(rid, 10, owner="alice")
        client = ScriptedClient([reply("never")])
        with pytest.raises(KeyError):
            reg.start(BareLoop(client), "peek", session_id="s", owner="mallory")
        assert client.requests == []
        with pytest.raises(ConfigError):
            reg.start(BareLoop(client), "x", session_id="s", owner=42)
        with pytest.raises(ValueError):
            reg.start(BareLoop(client), "x", session_id="")
    with RunRegistry() as plain:
        with pytest.raises(ConfigError):
            plain.start(BareLoop(ScriptedClient([reply("x")])), "x", session_id="s")
    assert texts(store.session("s", owner="alice").messages()) == ["user:hi", "assistant:one"]
    store.close()


def gated_tool(entered: threading.Event, go: threading.Event) -> Tool:
    """A tool ``gate`` that sets ``entered`` and waits (at most 10 s) for ``go``."""

    @tool
    def gate() -> str:
        """Waits for the test."""
        entered.set()
        go.wait(10)
        return "ok"

    return gate


def test_5_a_reload_finds_the_run_in_flight_on_its_session_and_a_second_start_is_busy(tmp_path: Path) -> None:
    store = SQLiteSessionStore(tmp_path / "s.db")
    entered, go = threading.Event(), threading.Event()
    gate = gated_tool(entered, go)

    with RunRegistry(session_store=store) as reg:
        rid = reg.start(
            BareLoop(ScriptedClient([call("gate"), reply("done")]), [gate]), "go", session_id="s", owner="u"
        )
        assert entered.wait(10)
        assert reg.run_on_session("s", owner="u") == rid
        assert reg.run_on_session("s", owner="other") is None
        assert reg.run_on_session("elsewhere", owner="u") is None
        with pytest.raises(SessionBusy):  # e.g. a second tab: the page shows the run in flight instead
            reg.start(BareLoop(ScriptedClient([reply("never")])), "again", session_id="s", owner="u")
        go.set()
        reg.result(rid, 10, owner="u")
        assert reg.run_on_session("s", owner="u") is None
    assert texts(store.session("s", owner="u").messages())[-1] == "assistant:done"
    store.close()


@pytest.mark.parametrize("refusal", ["max_active", "session_busy", "another_owner"])
def test_5_a_refused_start_leaves_the_loop_without_the_session(tmp_path: Path, refusal: str) -> None:
    store = SQLiteSessionStore(tmp_path / "s.db")
    lease = store.session("conv-A", owner="alice").acquire()  # conv-A exists: alice's, one message
    lease.append([Message.user("stored")])
    lease.release()
    entered, go = threading.Event(), threading.Event()
    gate = gated_tool(entered, go)

    holder = BareLoop(ScriptedClient([call("gate"), reply("held")]), [gate])
    client = ScriptedClient([reply("answer in B")])
    loop = BareLoop(client)
    owner = "mallory" if refusal == "another_owner" else "alice"
    with RunRegistry(max_active=1 if refusal == "max_active" else 8, session_store=store) as reg:
        # max_active: any run in flight; session_busy: a run on conv-A itself.
        held = reg.start(holder, "hold", session_id="conv-A" if refusal == "session_busy" else None, owner="alice")
        assert entered.wait(10)
        expected = {"max_active": LoopBusy, "session_busy": SessionBusy, "another_owner": KeyError}[refusal]
        with pytest.raises(expected):
            reg.start(loop, "hi", session_id="conv-A", owner=owner)
        go.set()
        reg.result(held, 10, owner="alice")

        assert loop.stored_session is None  # the refused start changed nothing
        # So the loop may still take another session (a loop that kept conv-A would refuse).
        rid = reg.start(loop, "to B", session_id="conv-B", owner=owner)
        assert reg.result(rid, 10, owner=owner).output == "answer in B"
    assert texts(store.session("conv-A", owner="alice").messages())[0] == "user:stored"
    assert "user:to B" not in texts(store.session("conv-A", owner="alice").messages())
    assert texts(store.session("conv-B", owner=owner).messages()) == ["user:to B", "assistant:answer in B"]
    assert texts(list(client.requests[0].messages)) == ["user:to B"]  # nothing of conv-A was loaded
    store.close()


def test_5_a_refused_start_leaves_the_loop_free_to_run_without_a_session(tmp_path: Path) -> None:
    store = SQLiteSessionStore(tmp_path / "s.db")
    lease = store.session("conv-A").acquire()  # another run holds conv-A
    try:
        loop = BareLoop(ScriptedClient([reply("plain answer")]))
        with RunRegistry(session_store=store) as reg:
            with pytest.raises(SessionBusy):
                reg.start(loop, "hi", session_id="conv-A")
            assert loop.stored_session is None
            rid = reg.start(loop, "no session here")
            assert reg.result(rid, 10).output == "plain answer"
    finally:
        lease.release()
    assert store.session("conv-A").messages() == []  # the plain run wrote nothing there
    store.close()
