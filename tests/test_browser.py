"""The web examples in a real browser: headless Chromium driven by selenium.

Each app runs behind a real HTTP server on 127.0.0.1 (werkzeug's threaded
server on a thread of the test) with its sessions and CSRF check on, and
the page is used as a person would: type a question, click Run, send
guidance, click Stop, read the log. The demo ``add`` tool holds turn 0
until the test has seen the guidance queued; ``multiply`` waits on the
run's cancel signal, so Stop always lands while a tool works. Every wait
is selenium's explicit wait on a DOM condition.

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs
them); the test skips, saying so, only where they are absent.
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Optional

import pytest
from support import GatedAdd
from web_support import StoredRegistry

from loopctl import BareLoop
from loopctl.demo import OfflineModel
from loopctl.demo.tools import AddTool, LookupTool, MultiplyTool
from loopctl.hosting.registry import RunRegistry
from loopctl.messages import ModelRequest, ModelResponse
from loopctl.testing import ScriptedClient, reply
from loopctl.tools import ToolContext

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the test extra has it)")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as ec  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402
from werkzeug.serving import make_server  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
WAIT_S = 20.0

if not (CHROMIUM and CHROMEDRIVER):
    pytest.skip(
        "no browser: install Debian's chromium and chromium-driver (apt-get install chromium "
        "chromium-driver, as .ci/run does) to run the browser tests",
        allow_module_level=True,
    )

# The machine's network is closed and the profile must start clean.
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1000,900",
)


def _load(name: str) -> ModuleType:
    module = sys.modules.get(f"examples_{name}")
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


class HeldAdd(GatedAdd):
    """``add`` held until the test opens the gate: a browser under load may take a while."""

    def call(self, input: Any, ctx: ToolContext) -> str:
        assert self.gate.wait(3 * WAIT_S), "the test never opened the gate"
        return AddTool.call(self, input, ctx)


def _factory(gate: threading.Event) -> Callable[[], BareLoop]:
    # Slowed a little so text visibly streams, as the examples' default loop is.
    return lambda: BareLoop(
        OfflineModel(delay=0.005), [HeldAdd(gate), MultiplyTool(delay=60), LookupTool()]
    )


def _flask_app(registry: RunRegistry, factory: Callable[[], BareLoop]) -> Any:
    pytest.importorskip("flask")
    return _load("flask_app").create_app(registry, factory, secret_key="browser-test-secret")


def _django_app(registry: RunRegistry, factory: Callable[[], BareLoop]) -> Any:
    pytest.importorskip("django")
    view = _load("django_view")
    from django.core.wsgi import get_wsgi_application

    view.REGISTRY, view.LOOP_FACTORY = registry, factory
    return get_wsgi_application()


class Served:
    """An app behind a real threaded HTTP server on 127.0.0.1, and its registry."""

    def __init__(self, url: str, registry: RunRegistry, gate: threading.Event) -> None:
        self.url, self.registry, self.gate = url, registry, gate


@contextlib.contextmanager
def _serve(
    kind: str,
    factory: Callable[[], BareLoop],
    gate: threading.Event,
    db: Optional[Path] = None,
    wrap: Callable[[Any], Any] = lambda app: app,
) -> Iterator[Served]:
    """The app on a real server; its conversations in the SQLite file ``db`` (default: a temporary one).

    ``wrap`` puts WSGI middleware of the test's around the app (to hold or record requests).
    """
    registry = StoredRegistry(db)
    saved = None
    if kind == "django":
        view = _load("django_view")
        saved = view.REGISTRY, view.LOOP_FACTORY
    try:
        app = (_flask_app if kind == "flask" else _django_app)(registry, factory)
        server = make_server("127.0.0.1", 0, wrap(app), threaded=True)
        thread = threading.Thread(target=server.serve_forever, name="browser-test-http", daemon=True)
        thread.start()
        try:
            yield Served(f"http://127.0.0.1:{server.server_port}/", registry, gate)
        finally:
            gate.set()
            registry.close()  # ends every run, so every event stream closes
            server.shutdown()
            thread.join(WAIT_S)
            server.server_close()
    finally:
        if saved is not None:
            view.REGISTRY, view.LOOP_FACTORY = saved


@pytest.fixture(params=["flask", "django"])
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    gate = threading.Event()
    with _serve(request.param, _factory(gate), gate) as app:
        yield app


class Page:
    """The live page in the browser: its controls and explicit waits on what it shows."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self.wait = WebDriverWait(driver, WAIT_S)

    def el(self, element_id: str) -> Any:
        return self.driver.find_element(By.ID, element_id)

    def type_into(self, element_id: str, text: str) -> None:
        field = self.el(element_id)
        field.clear()
        field.send_keys(text)

    def log_shows(self, text: str) -> None:
        self.wait.until(ec.text_to_be_present_in_element((By.ID, "log"), text), f"log never showed {text!r}")

    def activity_shows(self, text: str) -> None:
        self.wait.until(ec.visibility_of_element_located((By.ID, "activity")))
        self.wait.until(
            ec.text_to_be_present_in_element((By.ID, "activity-text"), text),
            f"activity line never showed {text!r}",
        )

    def status_is(self, text: str) -> None:
        self.wait.until(lambda _: self.el("status").text == text, f"status never was {text!r}")

    def enabled(self) -> dict[str, bool]:
        return {name: self.el(name).is_enabled() for name in ("run", "send", "stop")}

    def log_lines(self) -> list[str]:
        return [div.text for div in self.el("log").find_elements(By.CSS_SELECTOR, ".lines > div")]


def test_browser_runs_steers_and_stops_a_run(browser: Any, served: Served) -> None:
    page = Page(browser)
    browser.delete_all_cookies()
    browser.get(served.url)
    page.wait.until(ec.element_to_be_clickable((By.ID, "run")))
    assert page.enabled() == {"run": True, "send": False, "stop": False}  # nothing to send or stop
    assert not page.el("activity").is_displayed()

    page.type_into("question", "What is (2 + 3) * (4 + 5)?")
    page.el("run").click()
    # Turn 0's add calls are held by the gate: the page shows them as the CLI does.
    page.log_shows("> add(a=2, b=3)")
    page.log_shows("> add(a=4, b=5)")
    page.activity_shows("running add(a=2, b=3)")
    page.wait.until(ec.element_to_be_clickable((By.ID, "stop")))
    assert page.enabled() == {"run": False, "send": False, "stop": True}

    page.type_into("guidance", "show each step")
    page.wait.until(ec.element_to_be_clickable((By.ID, "send")))
    page.el("send").click()
    page.log_shows("[guidance queued: show each step]")
    assert not page.el("send").is_enabled()  # the box is empty again

    served.gate.set()
    page.log_shows("[guidance delivered: show each step]")
    page.log_shows("< add: 5")
    page.log_shows("> multiply(a=5, b=9)")
    page.activity_shows("running multiply(a=5, b=9)")  # waits on the cancel signal

    page.el("stop").click()
    page.log_shows("cancelled (stopped by the user)")
    page.status_is("cancelled after 2 turns")
    page.wait.until(ec.element_to_be_clickable((By.ID, "run")))
    page.type_into("guidance", "too late")
    assert page.enabled() == {"run": True, "send": False, "stop": False}
    assert not page.el("activity").is_displayed()
    lines = page.log_lines()
    assert lines[0] == "you: What is (2 + 3) * (4 + 5)?"
    assert lines[-1] == "cancelled (stopped by the user)"
    assert not any(line.startswith("< multiply") for line in lines)  # stopped mid-tool
    [status] = served.registry.list(all_owners=True)
    assert status.state == "cancelled" and status.turns == 2

    # A follow-up on the same conversation: markup in the reply stays text.
    page.type_into("question", "<script>window.pwned = 1</script><b id=bold>hi</b>")
    page.el("run").click()
    page.status_is("done in 1 turn")
    page.log_shows("'<script>window.pwned = 1</script><b id=bold>hi</b>'")
    assert browser.execute_script("return window.pwned") is None
    assert page.el("log").find_elements(By.CSS_SELECTOR, "script, b, #bold") == []
    assert page.enabled() == {"run": True, "send": False, "stop": False}


def test_browser_shows_the_wait_for_the_model_and_stops_it(browser: Any) -> None:
    gate = threading.Event()

    def slow_model(request: ModelRequest) -> ModelResponse:
        assert gate.wait(3 * WAIT_S), "the test never released the model"
        return reply("hello from a slow model")

    factory = lambda: BareLoop(ScriptedClient([slow_model, slow_model]), [])  # noqa: E731
    with _serve("flask", factory, gate) as served:
        page = Page(browser)
        browser.delete_all_cookies()
        browser.get(served.url)
        page.type_into("question", "hi")
        page.el("run").click()
        page.activity_shows("waiting for the model")  # before the first token
        page.wait.until(ec.element_to_be_clickable((By.ID, "stop")))
        page.el("stop").click()
        page.log_shows("cancelled (stopped by the user)")
        page.wait.until(ec.invisibility_of_element_located((By.ID, "activity")))

        gate.set()  # the next run's model answers at once
        page.el("run").click()
        page.status_is("done in 1 turn")
        page.log_shows("hello from a slow model")
        assert page.log_lines()[-1] == "hello from a slow model"


@pytest.fixture(params=["flask", "django"])
def approving(request: pytest.FixtureRequest) -> Iterator[Served]:
    """An app whose loop asks a person before every ``add``."""
    gate = threading.Event()

    def factory() -> BareLoop:
        loop = BareLoop(OfflineModel(delay=0.005), [AddTool(), MultiplyTool(), LookupTool()])
        return loop.with_approval(lambda ctx: ctx.tool == "add")

    with _serve(request.param, factory, gate) as app:
        yield app


ANSWER_FROM_THIS_SESSION = """
const [runId, callId, done] = arguments;
fetch(`/runs/${encodeURIComponent(runId)}/approvals/${encodeURIComponent(callId)}`, {
  method: "POST", credentials: "same-origin",
  headers: {"Content-Type": "application/json",
            "X-CSRFToken": document.querySelector("[name=csrfmiddlewaretoken]").value},
  body: JSON.stringify({approve: false, reason: "from another page"}),
}).then((r) => r.json()).then(done, (err) => done({error: String(err)}));
"""


def test_browser_approves_and_denies_calls_from_this_page_and_another(browser: Any, approving: Served) -> None:
    page = Page(browser)
    browser.delete_all_cookies()
    browser.get(approving.url)

    def boxes() -> list[Any]:
        return list(page.el("approvals").find_elements(By.CSS_SELECTOR, ".approval"))

    page.type_into("question", "What is (1 + 2) * (3 + 4) * (5 + 6)?")
    page.el("run").click()
    page.wait.until(lambda _: len(boxes()) == 3, "the three add calls never asked for approval")
    assert [b.find_element(By.CLASS_NAME, "label").text for b in boxes()] == [
        "add(a=1, b=2) needs approval",
        "add(a=3, b=4) needs approval",
        "add(a=5, b=6) needs approval",
    ]
    page.activity_shows("waiting for your approval (3)")

    boxes()[0].find_element(By.CLASS_NAME, "approve").click()
    page.log_shows("[approved by web: add(a=1, b=2)]")
    page.wait.until(lambda _: len(boxes()) == 2)

    second = boxes()[0]
    second.find_element(By.CLASS_NAME, "reason").send_keys("not that one")
    second.find_element(By.CLASS_NAME, "deny").click()
    page.log_shows("[denied by web: add(a=3, b=4): not that one]")
    page.wait.until(lambda _: len(boxes()) == 1)

    # The last call is denied from another page of the same session: its
    # buttons go from this page when the run reports the answer.
    call_id = boxes()[0].get_attribute("data-call-id")
    [status] = approving.registry.list(all_owners=True)
    here = browser.current_window_handle
    browser.switch_to.new_window("tab")
    try:
        browser.get(approving.url)
        assert browser.execute_async_script(ANSWER_FROM_THIS_SESSION, status.run_id, call_id) == {"answered": True}
    finally:
        browser.close()
        browser.switch_to.window(here)
    page.log_shows("[denied by web: add(a=5, b=6): from another page]")
    page.wait.until(lambda _: len(boxes()) == 0)
    page.status_is("done in 2 turns")
    page.log_shows("add(3, 4) failed with the user denied this call: not that one")
    [status] = approving.registry.list(all_owners=True)
    assert [(d.approved, d.by, d.reason) for d in status.approvals] == [
        (True, "web", ""),
        (False, "web", "not that one"),
        (False, "web", "from another page"),
    ]


@pytest.mark.parametrize("kind", ["flask", "django"])
def test_browser_answers_a_subagents_call_that_shares_an_id_with_the_parents(browser: Any, kind: str) -> None:
    from loopctl import Message, tool
    from loopctl.messages import StopReason, ToolCallPart

    ran: list[tuple[str, str]] = []

    @tool(requires_approval=True)
    def danger(x: str) -> str:
        """Dangerous."""
        ran.append(("danger", x))
        return "boom"

    @tool(requires_approval=True)
    def read(x: str) -> str:
        """Harmless."""
        ran.append(("read", x))
        return "ok"

    def calls(*cs: tuple[str, str, dict[str, str]]) -> ModelResponse:
        return ModelResponse(Message.assistant("", [ToolCallPart(i, n, a) for i, n, a in cs]), StopReason.TOOL_CALL)

    def factory() -> BareLoop:
        # The sub-agent's call and the parent's share the id "c2": the page
        # must answer each by its run of the tree, never by the id alone.
        sub = BareLoop(ScriptedClient([calls(("c2", "read", {"x": "r"})), reply("sub done")]), tools=[read])
        return BareLoop(
            ScriptedClient([calls(("c1", "research", {"task": "t"}), ("c2", "danger", {"x": "rm"})), reply("all done")]),
            tools=[sub.as_tool("research", "Researches."), danger],
        )

    gate = threading.Event()
    with _serve(kind, factory, gate) as served:
        page = Page(browser)
        browser.delete_all_cookies()
        browser.get(served.url)

        def boxes() -> list[Any]:
            return list(page.el("approvals").find_elements(By.CSS_SELECTOR, ".approval"))

        page.type_into("question", "go")
        page.el("run").click()
        page.wait.until(lambda _: len(boxes()) == 2, "the two calls never asked for approval")
        by_label = {b.find_element(By.CLASS_NAME, "label").text: b for b in boxes()}
        assert set(by_label) == {'[research] read(x="r") needs approval', 'danger(x="rm") needs approval'}
        by_label['[research] read(x="r") needs approval'].find_element(By.CLASS_NAME, "approve").click()
        page.log_shows('[approved by web: [research] read(x="r")]')
        page.wait.until(lambda _: len(boxes()) == 1)
        [left] = boxes()
        assert left.find_element(By.CLASS_NAME, "label").text == 'danger(x="rm") needs approval'
        left.find_element(By.CLASS_NAME, "deny").click()
        page.log_shows('[denied by web: danger(x="rm"): denied from the web]')
        page.log_shows("all done")
        lines = page.log_lines()
        assert "[research] task: t" in lines and "[research finished]" in lines
        assert lines[-1] == "all done"
    assert ran == [("read", "r")]
