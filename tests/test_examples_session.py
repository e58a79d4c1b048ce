"""The web examples keep their conversations in a session store, through Flask's and Django's test clients.

``GET /runs`` shows the session's current conversation AS STORED (what the
model sees next) and its run in flight; ``POST /conversations`` starts a new
one (CSRF-checked, claimed in the store at once). Owner checks: another
browser's conversation id is an unknown id. A restarted server (a new app
and registry on the same SQLite file, the same cookie) shows the
conversation and continues it: the model receives the earlier turns. The
session cookie holds only the owner id and the current conversation's id,
so two tabs with one cookie lose nothing. Also the default database path,
and the small things a first visit shows.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from session_support import corrupt_row
from test_examples import EXAMPLES, Client, Web, _DjangoSession, _FlaskSession, _load
from web_support import StoredRegistry

from loopctl import BareLoop
from loopctl.demo.model import OfflineModel
from loopctl.demo.tools import AddTool, LookupTool, MultiplyTool
from loopctl.hosting.registry import RunRegistry
from loopctl.testing import ScriptedClient, reply

KINDS = ["flask", "django"]
SECRET = "test-secret"


def _loop() -> BareLoop:
    return BareLoop(OfflineModel(), [AddTool(), MultiplyTool(), LookupTool()])


@contextlib.contextmanager
def _app(kind: str, registry: RunRegistry, factory: Callable[[], BareLoop] = _loop) -> Iterator[Web]:
    """The example ``kind`` on ``registry``: a server process, as far as the test can tell."""
    opened: list[Any] = []
    saved = None
    if kind == "flask":
        pytest.importorskip("flask")
        app = _load("flask_app").create_app(registry, factory, secret_key=SECRET)
        new_client = lambda: Client(_FlaskSession(app, opened))  # noqa: E731
    else:
        pytest.importorskip("django")
        view = _load("django_view")
        saved = view.REGISTRY, view.LOOP_FACTORY
        view.REGISTRY, view.LOOP_FACTORY = registry, factory
        new_client = lambda: Client(_DjangoSession(opened))  # noqa: E731
    try:
        yield Web(registry, new_client)
    finally:
        for r in opened:
            r.close()
        registry.close()
        if saved is not None:
            view.REGISTRY, view.LOOP_FACTORY = saved


@pytest.fixture(params=KINDS)
def web(request: pytest.FixtureRequest) -> Iterator[Web]:
    with _app(request.param, StoredRegistry()) as app:
        yield app


NOW = [0.0]  # the forgetful registry's clock, moved by the test


@pytest.fixture(params=KINDS)
def forgetful(request: pytest.FixtureRequest) -> Iterator[Web]:
    """An app whose registry forgets a finished run once its clock passes 10 s."""
    NOW[0] = 0.0
    with _app(request.param, StoredRegistry(keep_finished_s=10, clock=lambda: NOW[0])) as app:
        yield app


def _finish(web: Client, question: str, conversation: Any = None) -> dict[str, Any]:
    code, body = web.post("/runs", {"input": question, "conversation": conversation})
    assert code == 201, body
    _, end = web.stream(f"/runs/{body['run_id']}/events").until("run_end")
    assert end["success"] is True
    return body  # type: ignore[no-any-return]


def _texts(shown: dict[str, Any]) -> list[str]:
    """The stored conversation's text, one entry per message, as GET /runs gives it."""
    return ["".join(p.get("text", "") for p in m["parts"] if p["type"] == "text") for m in shown["messages"]]


def _cookie(client: Client) -> tuple[str, str]:
    """The session cookie's name and value."""
    inner = client.app.client
    if isinstance(client.app, _FlaskSession):
        found = inner.get_cookie("session")
        assert found is not None
        return "session", found.value
    return "sessionid", inner.cookies["sessionid"].value


def _cookie_data(client: Client) -> dict[str, Any]:
    """What the signed session cookie holds, decoded with the app's key."""
    name, value = _cookie(client)
    if isinstance(client.app, _FlaskSession):
        app = client.app.client.application
        return dict(app.session_interface.get_signing_serializer(app).loads(value))
    from django.contrib.sessions.serializers import JSONSerializer
    from django.core import signing

    salt = "django.contrib.sessions.backends.signed_cookies"
    return dict(signing.loads(value, salt=salt, serializer=JSONSerializer))


def _carry(source: Client, target: Client) -> None:
    """Give ``target`` ``source``'s cookies and CSRF token: the same browser, another tab or server."""
    if isinstance(source.app, _FlaskSession):
        target.app.client.set_cookie(*_cookie(source))
    else:
        for name, morsel in source.app.client.cookies.items():
            target.app.client.cookies[name] = morsel.value
    target.token = source.token


@pytest.mark.parametrize("kind", KINDS)
def test_web_session_shows_its_stored_conversation_and_no_one_elses(kind: str) -> None:
    with _app(kind, StoredRegistry()) as web:
        assert web.get("/runs") == (200, {"conversation": None, "messages": [], "running": None})
        first = _finish(web.owner, "What is 12 + 30?")
        second = _finish(web.owner, "What is 1 + 2?", first["conversation"])
        assert second["conversation"] == first["conversation"]
        code, shown = web.get("/runs")
        assert code == 200 and shown["conversation"] == first["conversation"] and shown["running"] is None
        texts = _texts(shown)
        assert texts[0] == "What is 12 + 30?" and "What is 1 + 2?" in texts
        assert texts[texts.index("What is 1 + 2?") - 1].endswith("12 + 30 = 42.")
        calls = [p for m in shown["messages"] for p in m["parts"] if p["type"] == "tool_call"]
        assert [(c["name"], c["input"]) for c in calls] == [("add", {"a": 12, "b": 30}), ("add", {"a": 1, "b": 2})]

        stranger = web.new_client()
        stranger.open_page()
        assert stranger.get("/runs") == (200, {"conversation": None, "messages": [], "running": None})
        # The owner's conversation id is an unknown id to another browser.
        refused = stranger.post("/runs", {"input": "What is 2 + 2?", "conversation": first["conversation"]})
        assert refused == (404, {"error": "unknown conversation"})
        assert stranger.post("/runs", {"input": "What is 2 + 2?", "conversation": "../etc"})[0] == 400
        theirs = _finish(stranger, "What is 2 + 2?")
        assert theirs["conversation"] != first["conversation"]
        assert _texts(stranger.get("/runs")[1])[0] == "What is 2 + 2?"
        assert web.get("/runs")[1] == shown  # unchanged


def test_web_new_conversation_is_csrf_checked_and_starts_empty(web: Web) -> None:
    first = _finish(web.owner, "What is 12 + 30?")
    assert web.post("/conversations", csrf=False)[0] == 403
    assert web.get("/runs")[1]["conversation"] == first["conversation"]  # unchanged

    code, fresh = web.post("/conversations")
    assert code == 201 and fresh["conversation"] not in (None, first["conversation"])
    assert web.get("/runs") == (200, {"conversation": fresh["conversation"], "messages": [], "running": None})
    follow_up = _finish(web.owner, "What is 1 + 1?")  # no id given: the current conversation
    assert follow_up["conversation"] == fresh["conversation"]
    assert _texts(web.get("/runs")[1])[0] == "What is 1 + 1?"  # nothing of the first conversation
    # The first conversation is still there, whole, and can be continued.
    again = _finish(web.owner, "What is 2 + 2?", first["conversation"])
    code, shown = web.get("/runs")
    assert shown["conversation"] == again["conversation"] == first["conversation"]
    assert [t for t in _texts(shown) if t.startswith("What")] == ["What is 12 + 30?", "What is 2 + 2?"]


def test_web_conversation_outlives_the_registrys_memory(forgetful: Web) -> None:
    first = _finish(forgetful.owner, "What is 12 + 30?")
    shown = forgetful.get("/runs")[1]
    # Once the run's thread is gone the registry compacts it and, its clock
    # past keep_finished_s, prunes it on the next access: the store still has it.
    for thread in threading.enumerate():
        if thread.name == f"loopctl-run-{first['run_id'][:12]}":
            thread.join(10)
    NOW[0] = 11.0
    assert forgetful.get(f"/runs/{first['run_id']}")[0] == 404
    assert forgetful.get("/runs") == (200, shown)
    assert _texts(shown)[0] == "What is 12 + 30?"


@pytest.mark.parametrize("kind", KINDS)
def test_web_run_in_flight_is_named_and_not_yet_stored(kind: str) -> None:
    # multiply waits on the run's cancel signal: the run is in flight while looked at.
    held = lambda: BareLoop(OfflineModel(), [AddTool(), MultiplyTool(delay=60), LookupTool()])  # noqa: E731
    with _app(kind, StoredRegistry(), held) as web:
        _in_flight(web)


def _in_flight(web: Web) -> None:
    done = _finish(web.owner, "What is 12 + 30?")
    stored = web.get("/runs")[1]["messages"]
    code, body = web.post("/runs", {"input": "multiply 6 by 7"})
    assert code == 201 and body["conversation"] == done["conversation"]
    seen, _ = web.stream(f"/runs/{body['run_id']}/events").until("tool_pre", tool="multiply")
    # A reloaded page: the stored past (not the run in flight, not yet written) and the run to follow.
    assert web.get("/runs") == (200, {"conversation": body["conversation"], "messages": stored, "running": body["run_id"]})
    # Following it again resumes after the last event the page saw.
    resumed = web.stream(f"/runs/{body['run_id']}/events", {"Last-Event-ID": str(seen)})
    assert web.post("/runs", {"input": "What is 1 + 1?"})[0] == 409
    assert web.post(f"/runs/{body['run_id']}/cancel")[0] == 200
    events = list(resumed)
    assert events[0][0] == seen + 1 and events[-1][1]["type"] == "run_end"
    # A cancelled run leaves the stored conversation as it was.
    assert web.get("/runs") == (200, {"conversation": body["conversation"], "messages": stored, "running": None})


def _recording(replies: list[str], made: list[ScriptedClient]) -> Callable[[], BareLoop]:
    def factory() -> BareLoop:
        made.append(ScriptedClient([reply(r) for r in replies]))
        return BareLoop(made[-1])

    return factory


@pytest.mark.parametrize("kind", KINDS)
def test_web_restart_shows_and_continues_the_conversation(kind: str, tmp_path: Path) -> None:
    db = tmp_path / "web.db"
    before: list[ScriptedClient] = []
    with _app(kind, StoredRegistry(db), _recording(["Hello, Ada."], before)) as first_server:
        browser = first_server.owner
        started = _finish(browser, "Hi, I am Ada.")
        shown = browser.get("/runs")[1]

    # A new process: a new registry and store on the same file; the browser keeps its cookie.
    after: list[ScriptedClient] = []
    with _app(kind, StoredRegistry(db), _recording(["You are Ada."], after)) as second_server:
        again = second_server.new_client()
        _carry(browser, again)
        assert again.get("/runs") == (200, shown)
        assert _texts(shown) == ["Hi, I am Ada.", "Hello, Ada."]
        continued = _finish(again, "Who am I?", shown["conversation"])
        assert continued["conversation"] == started["conversation"]
        assert [m.text for m in after[0].requests[0].messages] == ["Hi, I am Ada.", "Hello, Ada.", "Who am I?"]
        assert _texts(again.get("/runs")[1]) == ["Hi, I am Ada.", "Hello, Ada.", "Who am I?", "You are Ada."]
        # Another browser on the restarted server still cannot name it.
        stranger = second_server.new_client()
        stranger.open_page()
        assert stranger.post("/runs", {"input": "x", "conversation": started["conversation"]})[0] == 404


def test_web_corrupt_conversation_is_an_error_naming_it_and_a_new_one_works(web: Web) -> None:
    first = _finish(web.owner, "What is 12 + 30?")
    corrupt_row("sqlite", str(web.registry.path), first["conversation"], 1)
    code, refused = web.get("/runs")
    assert code == 500 and first["conversation"] in refused["error"] and "{not json" not in refused["error"]
    # A run on it is a failed run (no model call): its run_end names the conversation.
    code, failed = web.post("/runs", {"input": "What is 1 + 1?"})
    assert code == 201 and failed["conversation"] == first["conversation"]
    _, end = web.owner.stream(f"/runs/{failed['run_id']}/events").until("run_end")
    assert end["success"] is False and end["error_type"] == "SessionCorrupt"
    assert first["conversation"] in end["error"] and "{not json" not in end["error"]
    assert sorted(r.state for r in web.registry.list(owner=_cookie_data(web.owner)["owner"])) == [
        "completed",
        "failed",
    ]
    fresh = web.post("/conversations")[1]["conversation"]
    assert web.get("/runs") == (200, {"conversation": fresh, "messages": [], "running": None})
    assert _texts(web.get("/runs")[1]) == []
    _finish(web.owner, "What is 1 + 1?")


def test_web_session_cookie_holds_only_the_owner_and_the_conversation(web: Web) -> None:
    first = _finish(web.owner, "What is 12 + 30?")
    _finish(web.owner, "What is 1 + 2?")
    held = _cookie_data(web.owner)
    assert set(held) == {"owner", "conversation"} and held["conversation"] == first["conversation"]
    web.post("/conversations")
    assert set(_cookie_data(web.owner)) == {"owner", "conversation"}


def test_web_two_tabs_with_one_cookie_lose_no_run(web: Web) -> None:
    tab_a = web.owner
    _finish(tab_a, "What is 12 + 30?")
    tab_b = web.new_client()
    _carry(tab_a, tab_b)  # a second tab: the same cookie, from before either tab's next request
    first = tab_a.get("/runs")[1]["conversation"]
    _finish(tab_a, "What is 1 + 2?", first)  # tab A's response sets a newer cookie...
    fresh = tab_b.post("/conversations")[1]["conversation"]  # ...tab B answers with its own
    _finish(tab_b, "What is 2 + 2?", fresh)
    _finish(tab_a, "What is 3 + 4?", first)
    # Whichever cookie the browser kept, every run is in the store.
    store = web.registry.session_store
    owner = _cookie_data(tab_a)["owner"]
    assert owner == _cookie_data(tab_b)["owner"]
    counts = {info.id: info.messages for info in store.list(owner=owner)}
    assert set(counts) == {first, fresh}
    prompts = [m.text for m in store.session(first, owner=owner).messages() if m.text.startswith("What")]
    assert prompts == ["What is 12 + 30?", "What is 1 + 2?", "What is 3 + 4?"]


@pytest.mark.parametrize("kind", KINDS)
def test_web_default_database_is_in_the_users_data_folder(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip(kind)
    monkeypatch.delenv("LOOPCTL_SESSION_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    registry = _default_registry(kind)
    try:
        assert registry.session_store.path == tmp_path / "data" / "loopctl" / "web-sessions.db"
    finally:
        registry.close()
        registry.session_store.close()
    monkeypatch.setenv("LOOPCTL_SESSION_DB", str(tmp_path / "chosen.db"))
    registry = _default_registry(kind)
    try:
        assert registry.session_store.path == tmp_path / "chosen.db" and (tmp_path / "chosen.db").exists()
    finally:
        registry.close()
        registry.session_store.close()


def _default_registry(kind: str) -> Any:
    """The registry the example makes when given none (Django: at its first use)."""
    if kind == "flask":
        app = _load("flask_app").create_app(loop_factory=_loop, secret_key=SECRET)
        return app.extensions["loopctl_registry"]
    view = _load("django_view")
    saved: Optional[RunRegistry] = view.REGISTRY
    view.REGISTRY = None
    try:
        return view.registry()
    finally:
        view.REGISTRY = saved


def test_web_page_carries_its_own_icon(web: Web) -> None:
    # An inline icon: the browser asks for no /favicon.ico, so no 404 in the log.
    page = web.owner.open_page()
    assert '<link rel="icon" href="data:image/svg+xml,' in page


def test_django_runserver_names_its_settings(tmp_path: Path) -> None:
    pytest.importorskip("django")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "LOOPCTL_SESSION_DB": str(tmp_path / "web.db")}
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "django_view.py"), "runserver", "--noreload", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    # A server that never prints its banner is killed, so the read below ends.
    watchdog = threading.Timer(60, proc.kill)
    watchdog.start()
    try:
        assert proc.stdout is not None
        banner = ""
        for line in proc.stdout:
            banner += line
            if "Quit the server" in line:
                break
    finally:
        watchdog.cancel()
        watchdog.join()
        proc.kill()
        proc.wait()
    assert "using settings 'django_view'" in banner, banner
    assert "using settings None" not in banner
