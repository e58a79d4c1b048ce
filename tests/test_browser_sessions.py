"""The live page keeps its conversation in the session store, in headless Chromium, for Flask and Django.

A reload shows the stored conversation, a block per completed run, drawn as
it was shown live (less the timings the store does not keep). A restarted
server (a second server on the same SQLite file; the browser keeps its
cookie, which cookies share across ports) shows the conversation and
continues it: the model, a scripted one that records its requests,
receives the earlier turns. Two tabs opened at the same moment on a first
visit (each page made its own session; the browser keeps one cookie) both
start runs, and a page of another site cannot. Every wait is selenium's
explicit wait on the DOM.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from test_browser import WAIT_S, Page, _serve, browser  # noqa: F401
from test_browser_page import _ask, _block_lines, _ended, _open, _summaries

from loopctl import BareLoop
from loopctl.demo import OfflineModel
from loopctl.demo.tools import AddTool, LookupTool, MultiplyTool
from loopctl.testing import ScriptedClient, reply

from selenium.webdriver.common.by import By  # isort: skip
from selenium.webdriver.support import expected_conditions as ec  # isort: skip
from werkzeug.serving import make_server  # isort: skip

KINDS = ["flask", "django"]
UNTIMED = re.compile(r" \(\d+ ms\)$")


def _recording(replies: list[str], made: list[ScriptedClient]) -> Callable[[], BareLoop]:
    def factory() -> BareLoop:
        made.append(ScriptedClient([reply(r) for r in replies]))
        return BareLoop(made[-1])

    return factory


@pytest.mark.parametrize("kind", KINDS)
def test_reload_shows_the_stored_conversation(browser: Any, kind: str) -> None:  # noqa: F811
    gate = threading.Event()
    gate.set()
    factory = lambda: BareLoop(OfflineModel(delay=0.001), [AddTool(), MultiplyTool(), LookupTool()])  # noqa: E731
    with _serve(kind, factory, gate) as served:
        page = _open(browser, served)
        _ask(page, "What is 12 + 30?")
        _ended(page, 1)
        _ask(page, "What is (2 + 3) * (4 + 5)?")
        _ended(page, 2)
        live = _block_lines(page)
        assert [b[0] for b in live] == ["you: What is 12 + 30?", "you: What is (2 + 3) * (4 + 5)?"]

        browser.refresh()
        _ended(page, 2)
        assert _block_lines(page) == [[UNTIMED.sub("", line) for line in block] for block in live]
        assert _summaries(page) == ["completed · 2 turns · 1 tool call", "completed · 3 turns · 3 tool calls"]
        # What the page shows is what the store holds for this browser.
        owner_sessions = served.registry.session_store.list()
        assert len(owner_sessions) == 1 and owner_sessions[0].messages == 10


@pytest.mark.parametrize("kind", KINDS)
def test_restarted_server_shows_and_continues_the_conversation(
    browser: Any, kind: str, tmp_path: Path  # noqa: F811
) -> None:
    db = tmp_path / "web.db"
    before: list[ScriptedClient] = []
    with _serve(kind, _recording(["Hello, Ada."], before), threading.Event(), db) as first:
        page = _open(browser, first)
        _ask(page, "Hi, I am Ada.")
        _ended(page, 1)
        shown = _block_lines(page)
        assert shown == [["you: Hi, I am Ada.", "Hello, Ada."]]

    after: list[ScriptedClient] = []
    with _serve(kind, _recording(["You are Ada."], after), threading.Event(), db) as second:
        browser.get(second.url)  # the same browser: its cookie goes to the new server too
        page = Page(browser)
        _ended(page, 1)
        assert _block_lines(page) == shown
        assert _summaries(page) == ["completed · 1 turn · 0 tool calls"]
        _ask(page, "Who am I?")
        _ended(page, 2)
        page.log_shows("You are Ada.")
        assert [m.text for m in after[0].requests[0].messages] == ["Hi, I am Ada.", "Hello, Ada.", "Who am I?"]
        assert _block_lines(page)[1][0] == "you: Who am I?"
        page.wait.until(ec.element_to_be_clickable((By.ID, "run")))

        # A reload on the new server shows the whole conversation, from the store.
        browser.refresh()
        _ended(page, 2)
        assert [b[0] for b in _block_lines(page)] == ["you: Hi, I am Ada.", "you: Who am I?"]


class Requests:
    """WSGI middleware: records each request's answer; can hold the first ``GET /`` pages until all are in."""

    def __init__(self, hold_pages: int = 0) -> None:
        self.app: Any = None
        self.lock = threading.Lock()
        self.seen: list[tuple[str, str, int, bool]] = []  # method, path, status, sent a cookie
        self.pages = 0
        self.all_in: Optional[threading.Barrier] = threading.Barrier(hold_pages, timeout=WAIT_S) if hold_pages else None

    def wrap(self, app: Any) -> Requests:
        self.app = app
        return self

    def answers(self, method: str, path: str) -> list[int]:
        with self.lock:
            return [status for m, p, status, _ in self.seen if (m, p) == (method, path)]

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        method, path, cookie = environ["REQUEST_METHOD"], environ["PATH_INFO"], "HTTP_COOKIE" in environ
        if self.all_in is not None and (method, path) == ("GET", "/"):
            with self.lock:
                self.pages += 1
                hold = self.pages <= self.all_in.parties
            if hold:
                self.all_in.wait()  # no page answers before every first visit is in

        def answer(status: str, headers: Any, exc_info: Any = None) -> Any:
            with self.lock:
                self.seen.append((method, path, int(status.split()[0]), cookie))
            return start_response(status, headers, exc_info)

        return self.app(environ, answer)


def _demo(kind: str, seen: Requests) -> Any:
    factory = lambda: BareLoop(OfflineModel(delay=0.001), [AddTool(), MultiplyTool(), LookupTool()])  # noqa: E731
    return _serve(kind, factory, threading.Event(), wrap=seen.wrap)


def _settled(page: Page) -> str:
    page.wait.until(lambda _: page.el("status").text.startswith(("done", "not started")), "the run never settled")
    text: str = page.el("status").text
    return text


@pytest.mark.parametrize("kind", KINDS)
def test_two_tabs_opened_at_once_on_a_first_visit_both_start_runs(browser: Any, kind: str) -> None:  # noqa: F811
    seen = Requests(hold_pages=2)
    with _demo(kind, seen) as served:
        browser.get(served.url + "no-page-here")  # this site, and no session yet
        browser.delete_all_cookies()
        here = browser.current_window_handle
        page = Page(browser)
        try:
            # Two URLs, so the browser never holds one back behind the other's answer.
            browser.execute_script(
                "window.open(arguments[0]); window.open(arguments[1]);", served.url + "?tab=1", served.url + "?tab=2"
            )
            page.wait.until(lambda _: len(browser.window_handles) == 3, "the two tabs never opened")
            for tab in [h for h in browser.window_handles if h != here]:
                browser.switch_to.window(tab)
                _ask(page, "What is 2 + 2?")
                assert _settled(page).startswith("done"), page.el("status").text
        finally:
            for tab in [h for h in browser.window_handles if h != here]:
                browser.switch_to.window(tab)
                browser.close()
            browser.switch_to.window(here)
    with seen.lock:
        first_visits = [cookie for method, path, _, cookie in seen.seen if (method, path) == ("GET", "/")][:2]
    assert first_visits == [False, False]  # both pages made a session of their own
    # One tab's token was for the session the browser did not keep: refused,
    # then sent again with the token of the session it holds.
    assert sorted(seen.answers("POST", "/runs")) == [201, 201, 403]
    assert len(served.registry.list(all_owners=True)) == 2


@contextlib.contextmanager
def _other_site(page_html: str, reports: list[str]) -> Iterator[str]:
    """A page served from ``localhost``: another site than the app's 127.0.0.1; ``/report?x`` adds x to ``reports``."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        if environ["PATH_INFO"] == "/report":
            reports.append(environ["QUERY_STRING"])
        start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
        return [page_html.encode()]

    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="browser-test-other-site", daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_port}/"
    finally:
        server.shutdown()
        thread.join(WAIT_S)
        server.server_close()


# Tries to read the app's page (and its token), posts to it without the
# token, then submits a form to it: what a hostile page can do.
HOSTILE = """<!doctype html><title>another site</title>
<form id="f" method="post" action="{app}runs"><input name="input" value="from a form"></form>
<script>
(async () => {{
  let read = "unreadable";
  try {{ await (await fetch("{app}", {{credentials: "include"}})).text(); read = "read"; }} catch (_) {{}}
  await fetch(`/report?${{read}}`);
  await fetch("{app}runs", {{method: "POST", mode: "no-cors", credentials: "include",
                             headers: {{"Content-Type": "text/plain"}}, body: '{{"input": "from a script"}}'}});
  document.getElementById("f").submit();
}})();
</script>"""


@pytest.mark.parametrize("kind", KINDS)
def test_a_post_from_another_site_is_refused(browser: Any, kind: str) -> None:  # noqa: F811
    seen = Requests()
    with _demo(kind, seen) as served:
        page = _open(browser, served)  # the browser holds a session of the app
        _ask(page, "What is 2 + 2?")
        assert _settled(page).startswith("done")
        reports: list[str] = []
        with _other_site(HOSTILE.format(app=served.url), reports) as hostile:
            browser.get(hostile)
            page.wait.until(lambda _: len(seen.answers("POST", "/runs")) == 3, "the other site's posts never came")
        assert reports == ["unreadable"]  # the app's page, and its token, are not the other site's to read
        assert seen.answers("POST", "/runs") == [201, 403, 403]
        assert len(served.registry.list(all_owners=True)) == 1
