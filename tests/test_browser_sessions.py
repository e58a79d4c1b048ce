"""The live page keeps its conversation in the session store, in headless Chromium, for Flask and Django.

A reload shows the stored conversation, a block per completed run, drawn as
it was shown live (less the timings the store does not keep). A restarted
server (a second server on the same SQLite file; the browser keeps its
cookie, which cookies share across ports) shows the conversation and
continues it: the model, a scripted one that records its requests,
receives the earlier turns. Every wait is selenium's explicit wait on the DOM.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any, Callable

import pytest
from test_browser import Page, _serve, browser  # noqa: F401
from test_browser_page import _ask, _block_lines, _ended, _open, _summaries

from loopctl import BareLoop
from loopctl.demo import OfflineModel
from loopctl.demo.tools import AddTool, LookupTool, MultiplyTool
from loopctl.testing import ScriptedClient, reply

from selenium.webdriver.common.by import By  # isort: skip
from selenium.webdriver.support import expected_conditions as ec  # isort: skip

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
