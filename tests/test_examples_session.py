"""The web examples' per-session endpoints, through Flask's and Django's test clients.

``GET /runs`` lists the session's current conversation and its runs (owner
checked: another session sees none of them; a run the registry pruned is
left out); ``POST /conversations`` starts a new one (CSRF-checked). Also
the small things a first visit shows: the page carries its own icon, and
Django's runserver names where its settings are.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from test_examples import EXAMPLES, Client, Web, _DjangoSession, _FlaskSession, _load

from loopctl import BareLoop
from loopctl.demo.model import OfflineModel
from loopctl.demo.tools import AddTool, LookupTool, MultiplyTool
from loopctl.hosting.registry import RunRegistry


def _loop() -> BareLoop:
    return BareLoop(OfflineModel(), [AddTool(), MultiplyTool(), LookupTool()])


def _web(kind: str, registry: RunRegistry) -> Iterator[Web]:
    opened: list[Any] = []
    saved = None
    if kind == "flask":
        pytest.importorskip("flask")
        app = _load("flask_app").create_app(registry, _loop, secret_key="test-secret")
        new_client = lambda: Client(_FlaskSession(app, opened))  # noqa: E731
    else:
        pytest.importorskip("django")
        view = _load("django_view")
        saved = view.REGISTRY, view.LOOP_FACTORY
        view.REGISTRY, view.LOOP_FACTORY = registry, _loop
        new_client = lambda: Client(_DjangoSession(opened))  # noqa: E731
    try:
        yield Web(registry, new_client)
    finally:
        for r in opened:
            r.close()
        registry.close()
        if saved is not None:
            view.REGISTRY, view.LOOP_FACTORY = saved


@pytest.fixture(params=["flask", "django"])
def web(request: pytest.FixtureRequest) -> Iterator[Web]:
    yield from _web(request.param, RunRegistry())


NOW = [0.0]  # the forgetful registry's clock, moved by the test


@pytest.fixture(params=["flask", "django"])
def forgetful(request: pytest.FixtureRequest) -> Iterator[Web]:
    """An app whose registry forgets a finished run once its clock passes 10 s."""
    NOW[0] = 0.0
    yield from _web(request.param, RunRegistry(keep_finished_s=10, clock=lambda: NOW[0]))


def _finish(web: Web, question: str, conversation: Any = None) -> dict[str, Any]:
    code, body = web.post("/runs", {"input": question, "conversation": conversation})
    assert code == 201, body
    _, end = web.stream(f"/runs/{body['run_id']}/events").until("run_end")
    assert end["success"] is True
    return body  # type: ignore[no-any-return]


def test_web_session_lists_its_conversation_and_no_one_elses(web: Web) -> None:
    assert web.get("/runs") == (200, {"conversation": None, "runs": []})
    first = _finish(web, "What is 12 + 30?")
    second = _finish(web, "What is 1 + 2?", first["conversation"])
    code, listed = web.get("/runs")
    assert code == 200 and listed["conversation"] == first["conversation"]
    assert [r["run_id"] for r in listed["runs"]] == [first["run_id"], second["run_id"]]
    assert [(r["state"], r["turns"], r["tool_calls"]) for r in listed["runs"]] == [("completed", 2, 1)] * 2
    assert listed["runs"][0]["output"].endswith("12 + 30 = 42.")

    stranger = web.new_client()
    stranger.open_page()
    assert stranger.get("/runs") == (200, {"conversation": None, "runs": []})
    # Naming the owner's conversation key gets the stranger a conversation of its own.
    theirs = _finish(stranger, "What is 2 + 2?", first["conversation"])
    assert [r["run_id"] for r in stranger.get("/runs")[1]["runs"]] == [theirs["run_id"]]
    assert [r["run_id"] for r in web.get("/runs")[1]["runs"]] == [first["run_id"], second["run_id"]]


def test_web_new_conversation_is_csrf_checked_and_starts_empty(web: Web) -> None:
    first = _finish(web, "What is 12 + 30?")
    assert web.post("/conversations", csrf=False)[0] == 403
    assert web.get("/runs")[1]["conversation"] == first["conversation"]  # unchanged

    code, fresh = web.post("/conversations")
    assert code == 201 and fresh["conversation"] not in (None, first["conversation"])
    assert web.get("/runs") == (200, {"conversation": fresh["conversation"], "runs": []})
    follow_up = _finish(web, "What is 1 + 1?", fresh["conversation"])
    code, listed = web.get("/runs")
    assert [r["run_id"] for r in listed["runs"]] == [follow_up["run_id"]]


def test_web_session_leaves_out_runs_the_registry_forgot(forgetful: Web) -> None:
    first = _finish(forgetful, "What is 12 + 30?")
    assert len(forgetful.get("/runs")[1]["runs"]) == 1
    # Once the run's thread is gone the registry compacts it and, its clock
    # past keep_finished_s, prunes it on the next access.
    for thread in threading.enumerate():
        if thread.name == f"loopctl-run-{first['run_id'][:12]}":
            thread.join(10)
    NOW[0] = 11.0
    code, listed = forgetful.get("/runs")
    assert code == 200 and listed == {"conversation": first["conversation"], "runs": []}


def test_web_page_carries_its_own_icon(web: Web) -> None:
    # An inline icon: the browser asks for no /favicon.ico, so no 404 in the log.
    page = web.owner.open_page()
    assert '<link rel="icon" href="data:image/svg+xml,' in page


def test_django_runserver_names_its_settings() -> None:
    pytest.importorskip("django")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
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
