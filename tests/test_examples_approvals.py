"""The web examples' approval endpoint, through Flask's and Django's test clients.

``POST /runs/<id>/approvals/<call_id>`` answers a call the run waits on:
CSRF-checked, owned (another session gets the unknown-run 404), an invalid
edit is a 400 naming the field and leaves the call waiting, the first
answer wins.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from test_examples import Client, Web, _DjangoSession, _FlaskSession, _load
from web_support import StoredRegistry

from loopctl import BareLoop
from loopctl.demo.model import OfflineModel
from loopctl.demo.tools import AddTool, LookupTool, MultiplyTool


def _approving_loop() -> BareLoop:
    loop = BareLoop(OfflineModel(), [AddTool(), MultiplyTool(), LookupTool()])
    return loop.with_approval(lambda ctx: ctx.tool == "multiply")


@pytest.fixture(params=["flask", "django"])
def web(request: pytest.FixtureRequest) -> Iterator[Web]:
    registry = StoredRegistry()
    opened: list[Any] = []
    saved = None
    if request.param == "flask":
        pytest.importorskip("flask")
        app = _load("flask_app").create_app(registry, _approving_loop, secret_key="test-secret")
        new_client = lambda: Client(_FlaskSession(app, opened))  # noqa: E731
    else:
        pytest.importorskip("django")
        view = _load("django_view")
        saved = view.REGISTRY, view.LOOP_FACTORY
        view.REGISTRY, view.LOOP_FACTORY = registry, _approving_loop
        new_client = lambda: Client(_DjangoSession(opened))  # noqa: E731
    try:
        yield Web(registry, new_client)
    finally:
        for r in opened:
            r.close()
        registry.close()
        if saved is not None:
            view.REGISTRY, view.LOOP_FACTORY = saved


def test_web_approval_endpoint_checks_csrf_owner_and_arguments(web: Web) -> None:
    code, body = web.post("/runs", {"input": "multiply 6 by 7"})
    assert code == 201, body
    rid = body["run_id"]
    events = web.stream(f"/runs/{rid}/events")
    _, asked = events.until("approval_requested", tool="multiply")
    cid = asked["call_id"]
    url = f"/runs/{rid}/approvals/{cid}"
    code, status = web.get(f"/runs/{rid}")
    assert [p["call_id"] for p in status["pending_approvals"]] == [cid]

    assert web.post(url, {"approve": True}, csrf=False)[0] == 403
    stranger = web.new_client()
    stranger.open_page()
    assert stranger.post(url, {"approve": True})[0] == 404
    assert stranger.post(f"/runs/{'0' * len(rid)}/approvals/{cid}", {"approve": True})[0] == 404
    code, err = web.post(url, {"approve": True, "arguments": {"a": "six", "b": 7}})
    assert code == 400 and "a" in err["error"]
    code, status = web.get(f"/runs/{rid}")
    assert [p["call_id"] for p in status["pending_approvals"]] == [cid]  # still waiting

    assert web.post(url, {"approve": True, "arguments": {"a": 6, "b": 8}}) == (200, {"answered": True})
    assert web.post(url, {"approve": False, "reason": "late"}) == (200, {"answered": False})
    _, resolved = events.until("approval_resolved")
    assert (resolved["approved"], resolved["by"]) == (True, "web")
    _, end = events.until("run_end")
    assert end["success"] is True
    code, status = web.get(f"/runs/{rid}")
    assert status["output"].endswith("48.")  # ran with the edited arguments
    assert [(a["approved"], a["edited"]) for a in status["approvals"]] == [(True, True)]
