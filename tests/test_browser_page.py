"""The live page keeps its place, in headless Chromium, for Flask and Django alike.

Guidance sent while the model is mid-line waits for the line to end; after
many runs the log scrolls inside its panel and the controls stay in the
viewport; a reload shows the stored conversation (a block per completed
run; a cancelled run is not part of it) and reattaches to the run in
flight; each run's block carries its summary; "New conversation" starts
over. The model and the tools are held by
Events, so a run is really mid-line, or really in flight, while the page
is looked at; every wait is selenium's explicit wait on the DOM.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import Any, Callable

import pytest
from test_browser import WAIT_S, HeldAdd, Page, Served, _serve, browser  # noqa: F401

from loopctl import BareLoop
from loopctl.demo import OfflineModel
from loopctl.demo.tools import AddTool, LookupTool, MultiplyTool
from loopctl.messages import ModelRequest
from loopctl.providers.base import IteratorStream, PartDelta
from loopctl.testing import ScriptedClient, reply

from selenium.webdriver.common.by import By  # isort: skip
from selenium.webdriver.support import expected_conditions as ec  # isort: skip

KINDS = ["flask", "django"]

# The model's first reply streams FIRST, then holds until the test opens the
# gate: the page is mid-line while the guidance is sent.
FIRST = "Working it out: this first line is still being"
REST = " written.\nThis is the second line."


class HeldMidLine(ScriptedClient):
    """Streams FIRST as one delta, then holds the rest of its first reply until ``gate`` opens."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__([reply(FIRST + REST), reply("Noted.")], chunk=len(FIRST))
        self.gate = gate
        self.held = False

    def stream(self, request: ModelRequest) -> IteratorStream:
        inner = super().stream(request)

        def events() -> Iterator[Any]:
            for event in inner:
                yield event
                if isinstance(event, PartDelta) and not self.held:
                    self.held = True
                    assert self.gate.wait(3 * WAIT_S), "the test never released the model"

        return IteratorStream(events(), on_close=inner.close)


def _open(driver: Any, served: Served) -> Page:
    page = Page(driver)
    driver.delete_all_cookies()
    driver.get(served.url)
    page.wait.until(ec.element_to_be_clickable((By.ID, "run")))
    return page


def _ask(page: Page, question: str) -> None:
    page.wait.until(ec.element_to_be_clickable((By.ID, "run")))
    page.type_into("question", question)
    page.el("run").click()


def _summaries(page: Page) -> list[str]:
    return [s.text for s in page.el("log").find_elements(By.CSS_SELECTOR, ".run > .summary")]


def _ended(page: Page, count: int) -> None:
    page.wait.until(
        lambda _: len([s for s in _summaries(page) if not s.startswith("running")]) == count,
        f"{count} runs never showed their summaries",
    )


def _block_lines(page: Page) -> list[list[str]]:
    blocks = page.el("log").find_elements(By.CSS_SELECTOR, ".run")
    return [[d.text for d in b.find_elements(By.CSS_SELECTOR, ".lines > div")] for b in blocks]


UNTIMED = re.compile(r" \(\d+ ms\)$")  # a tool result's duration, which the store does not keep

SESSION_RUNS = """
const done = arguments[0];
fetch("/runs", {credentials: "same-origin"}).then((r) => r.json()).then(done, (err) => done({error: String(err)}));
"""


@pytest.mark.parametrize("kind", KINDS)
def test_guidance_sent_mid_line_lands_after_the_line(browser: Any, kind: str) -> None:  # noqa: F811
    gate = threading.Event()
    with _serve(kind, lambda: BareLoop(HeldMidLine(gate), []), gate) as served:
        page = _open(browser, served)
        _ask(page, "think out loud")
        page.log_shows(FIRST)  # the model is mid-line, and held there

        page.type_into("guidance", "mind the units")
        page.wait.until(ec.element_to_be_clickable((By.ID, "send")))
        page.el("send").click()
        # Accepted, and shown under the log until the line ends: not in it.
        page.wait.until(
            lambda _: "[guidance queued: mind the units]" in page.el("pending").text,
            "the queued guidance was never shown as waiting",
        )
        assert "guidance queued" not in page.el("log").text

        gate.set()
        page.log_shows("[guidance queued: mind the units]")
        _ended(page, 1)
        lines = page.log_lines()
        first = lines.index("Working it out: this first line is still being written.")
        assert lines[first + 1] == "[guidance queued: mind the units]"
        assert lines[first + 2].startswith("This is the second line.")
        assert not page.el("pending").is_displayed()


def _approving(kind: str) -> Any:
    def factory() -> BareLoop:
        loop = BareLoop(OfflineModel(delay=0.001), [AddTool(), MultiplyTool(), LookupTool()])
        return loop.with_approval(lambda ctx: ctx.tool == "multiply")

    return _serve(kind, factory, threading.Event())


IN_VIEW = """
const ids = arguments[0];
const rect = (el) => { const r = el.getBoundingClientRect(); return {top: r.top, bottom: r.bottom}; };
const log = document.getElementById("log");
const last = log.querySelector(".run:last-child .lines > div:last-child");
return {
  height: window.innerHeight,
  pageScrolls: document.documentElement.scrollHeight > window.innerHeight,
  logOverflows: log.scrollHeight > log.clientHeight,
  log: rect(log), last: rect(last),
  controls: ids.map((sel) => [sel, rect(document.querySelector(sel))]),
};
"""


@pytest.mark.parametrize("kind", KINDS)
def test_controls_stay_in_view_after_many_runs(browser: Any, kind: str) -> None:  # noqa: F811
    browser.set_window_size(1000, 640)
    try:
        with _approving(kind) as served:
            page = _open(browser, served)
            runs = 7
            for n in range(1, runs + 1):
                _ask(page, f"What is {n} + 30?")
                _ended(page, n)
            _ask(page, "multiply 6 by 7")  # waits for a person: Approve / Deny show
            page.wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, ".approval .approve")))
            shown = browser.execute_script(
                IN_VIEW, ["#question", "#run", "#new", "#guidance", "#stop", ".approval .approve", ".approval .deny"]
            )
            assert shown["logOverflows"], "the runs never filled the log: the test shows nothing"
            assert not shown["pageScrolls"]
            for name, box in shown["controls"]:
                assert 0 <= box["top"] and box["bottom"] <= shown["height"], (name, box, shown["height"])
            # The log followed the newest line.
            assert shown["log"]["top"] <= shown["last"]["top"] and shown["last"]["bottom"] <= shown["log"]["bottom"] + 1

            # A reload rebuilds every block and brings the waiting call's buttons back.
            browser.refresh()
            page.wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, ".approval .approve")))
            _ended(page, runs)
            assert len(_summaries(page)) == runs + 1
            shown = browser.execute_script(IN_VIEW, ["#stop", ".approval .approve"])
            assert not shown["pageScrolls"]
            assert all(0 <= box["top"] and box["bottom"] <= shown["height"] for _, box in shown["controls"])
            browser.find_element(By.CSS_SELECTOR, ".approval .approve").click()
            _ended(page, runs + 1)
            assert page.log_lines()[-1].endswith("= 42.")
    finally:
        browser.set_window_size(1000, 900)


def _factory(gate: threading.Event) -> Callable[[], BareLoop]:
    return lambda: BareLoop(OfflineModel(delay=0.001), [HeldAdd(gate), MultiplyTool(delay=60), LookupTool()])


@pytest.mark.parametrize("kind", KINDS)
def test_reload_restores_the_log_and_reattaches_to_the_run_in_flight(browser: Any, kind: str) -> None:  # noqa: F811
    gate = threading.Event()
    with _serve(kind, _factory(gate), gate) as served:
        page = _open(browser, served)
        _ask(page, "What is (2 + 3) * (4 + 5)?")
        page.log_shows("> add(a=4, b=5)")
        page.activity_shows("running add(a=2, b=3)")  # held by the gate: in flight
        before = _block_lines(page)

        browser.refresh()
        page.log_shows("> add(a=4, b=5)")
        page.activity_shows("running add(a=2, b=3)")
        assert _block_lines(page)[0][: len(before[0])] == before[0]  # each event once, in order
        page.wait.until(ec.element_to_be_clickable((By.ID, "stop")))
        assert page.enabled() == {"run": False, "send": False, "stop": True}

        gate.set()  # the reattached page follows the run on
        page.log_shows("< add: 9")
        page.activity_shows("running multiply(a=5, b=9)")
        page.el("stop").click()
        page.log_shows("cancelled (stopped by the user)")
        _ended(page, 1)

        _ask(page, "What is 12 + 30?")  # a follow-up in the same conversation
        _ended(page, 2)
        blocks, summaries = _block_lines(page), _summaries(page)
        assert re.fullmatch(r"cancelled · 2 turns · 3 tool calls · (\d+ ms|\d+\.\d s)", summaries[0]), summaries
        assert re.fullmatch(r"completed · 2 turns · 1 tool call · (\d+ ms|\d+\.\d s)", summaries[1]), summaries

        assert blocks[0][0] == "you: What is (2 + 3) * (4 + 5)?" and blocks[1][0] == "you: What is 12 + 30?"

        # The stored conversation comes back: the completed run, as it was
        # shown less its timings; the cancelled run left the store unchanged.
        browser.refresh()
        _ended(page, 1)
        assert _block_lines(page) == [[UNTIMED.sub("", line) for line in blocks[1]]]
        assert _summaries(page) == ["completed · 2 turns · 1 tool call"]
        assert page.enabled() == {"run": True, "send": False, "stop": False}


@pytest.mark.parametrize("kind", KINDS)
def test_new_conversation_starts_over(browser: Any, kind: str) -> None:  # noqa: F811
    gate = threading.Event()
    gate.set()
    made: list[BareLoop] = []

    def factory() -> BareLoop:
        made.append(BareLoop(OfflineModel(delay=0.001), [AddTool(), MultiplyTool(), LookupTool()]))
        return made[-1]

    with _serve(kind, factory, gate) as served:
        page = _open(browser, served)
        _ask(page, "What is 12 + 30?")
        _ended(page, 1)
        first = browser.execute_async_script(SESSION_RUNS)
        assert first["messages"][0]["parts"] == [{"type": "text", "text": "What is 12 + 30?"}]

        page.wait.until(ec.element_to_be_clickable((By.ID, "new")))
        page.el("new").click()
        page.status_is("new conversation")
        assert _block_lines(page) == []
        fresh = browser.execute_async_script(SESSION_RUNS)
        assert fresh["messages"] == [] and fresh["conversation"] != first["conversation"]

        browser.refresh()  # still the new, empty conversation
        page.wait.until(ec.element_to_be_clickable((By.ID, "run")))
        assert _block_lines(page) == []
        _ask(page, "What is 1 + 1?")
        _ended(page, 1)
        assert len(made) == 2  # a loop of its own: no history from the first conversation
        assert [len(b) > 0 for b in _block_lines(page)] == [True]
        assert browser.execute_async_script(SESSION_RUNS)["conversation"] == fresh["conversation"]


@pytest.mark.parametrize("kind", KINDS)
def test_reload_shows_queued_guidance_once_then_delivered(browser: Any, kind: str) -> None:  # noqa: F811
    gate = threading.Event()
    with _serve(kind, _factory(gate), gate) as served:
        page = _open(browser, served)
        _ask(page, "What is (2 + 3) * (4 + 5)?")
        page.activity_shows("running add(a=2, b=3)")  # held by the gate: the guidance waits
        page.type_into("guidance", "keep it short")
        page.wait.until(ec.element_to_be_clickable((By.ID, "send")))
        page.el("send").click()
        page.log_shows("[guidance queued: keep it short]")

        browser.refresh()
        page.log_shows("[guidance queued: keep it short]")  # the page keeps its place
        page.activity_shows("running add(a=2, b=3)")
        gate.set()
        page.log_shows("[guidance delivered: keep it short]")
        page.activity_shows("running multiply(a=5, b=9)")  # waits on the cancel signal
        lines = page.log_lines()
        assert lines.count("[guidance queued: keep it short]") == 1, lines
        assert lines.count("[guidance delivered: keep it short]") == 1, lines
        assert lines.index("[guidance queued: keep it short]") < lines.index("[guidance delivered: keep it short]")

        browser.refresh()  # delivered now: shown as delivered only
        page.log_shows("[guidance delivered: keep it short]")
        page.activity_shows("running multiply(a=5, b=9)")
        assert "[guidance queued: keep it short]" not in page.log_lines()
        page.wait.until(ec.element_to_be_clickable((By.ID, "stop")))
        page.el("stop").click()
        _ended(page, 1)


@pytest.mark.parametrize("kind", KINDS)
def test_reload_shows_queued_guidance_then_not_delivered_when_stopped(browser: Any, kind: str) -> None:  # noqa: F811
    with _approving(kind) as served:
        page = _open(browser, served)
        _ask(page, "multiply 6 by 7")  # waits for a person: the guidance waits too
        page.wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, ".approval .approve")))
        page.type_into("guidance", "keep it short")
        page.wait.until(ec.element_to_be_clickable((By.ID, "send")))
        page.el("send").click()
        page.log_shows("[guidance queued: keep it short]")

        browser.refresh()
        page.wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, ".approval .approve")))
        page.log_shows("[guidance queued: keep it short]")
        page.el("stop").click()
        page.log_shows("[not delivered: keep it short]")
        _ended(page, 1)
        lines = page.log_lines()
        assert lines.count("[guidance queued: keep it short]") == 1, lines
        assert not any(line.startswith("[guidance delivered") for line in lines), lines
