"""Loop and convergence detection (SPEC §9, reference §12)."""

from __future__ import annotations

import queue
import threading
from typing import Any, Mapping, Optional

import pytest
from support import WAIT

from loopctl import BareLoop, LoopDetected, RunConfig, UserInputRequired, tool
from loopctl.context.memory import words
from loopctl.detection import ConvergenceDetector, LoopDetector, jaccard
from loopctl.errors import ConfigError
from loopctl.observers import (
    ApprovalRequested,
    ConvergenceDetected,
    Event,
    LoopDetectedEvent,
    Observer,
    RunEnd,
)
from loopctl.testing import ScriptedClient, call, reply
from loopctl.tools import Tool, ToolContext


def feed(d: LoopDetector, n: int, tool: str = "read", inp: Mapping[str, Any] = {"path": "a"}, out: str = "same") -> list[Any]:
    return [d.record(tool, inp, out, False) for _ in range(n)]


# -- LoopDetector ------------------------------------------------------------------


def test_warns_once_at_three_identical_operations() -> None:
    d = LoopDetector()
    got = feed(d, 6)
    assert got[:2] == [None, None]
    assert got[2] is not None and got[2][1] == 3 and got[2][0].startswith("read(")
    assert got[3:] == [None, None, None]  # one-shot per pattern
    assert d.pre_check() is None


def test_stop_armed_at_ten_returned_by_next_pre_check_then_cleared() -> None:
    d = LoopDetector()
    feed(d, 9)
    assert d.pre_check() is None and not d.has_pending_stop
    feed(d, 1)
    assert d.has_pending_stop
    err = d.pre_check()
    assert isinstance(err, LoopDetected) and "repeated 10 times" in str(err)
    assert d.pre_check() is None  # window cleared with the stop
    assert d.max_repetitions() == 0
    # counting starts over; the warning fires again for the same pattern
    assert feed(d, 3)[2] is not None


def test_consume_pending_stop_drops_it() -> None:
    d = LoopDetector()
    feed(d, 10)
    assert d.consume_pending_stop() is not None
    assert d.pre_check() is None and not d.has_pending_stop


def test_stop_at_zero_disables_stops() -> None:
    d = LoopDetector(stop_at=0)
    feed(d, 40)
    assert d.pre_check() is None


def test_differing_result_forgets_the_pattern() -> None:
    d = LoopDetector()
    feed(d, 2)
    d.record("read", {"path": "a"}, "changed", False)
    assert feed(d, 2, out="same") == [None, None]  # count restarted at the change
    assert d.record("read", {"path": "a"}, "same", False) is not None


def test_warning_rearms_after_pattern_forgotten() -> None:
    d = LoopDetector()
    assert feed(d, 3)[2] is not None
    d.record("read", {"path": "a"}, "other", False)
    assert feed(d, 3)[2] is not None


def test_input_key_order_does_not_matter() -> None:
    d = LoopDetector()
    d.record("t", {"a": 1, "b": 2}, "r", False)
    d.record("t", {"b": 2, "a": 1}, "r", False)
    assert d.record("t", {"a": 1, "b": 2}, "r", False) is not None


def test_window_bounds_what_counts() -> None:
    d = LoopDetector(warn_at=3, stop_at=0, window=5)
    d.record("t", {}, "r", False)
    d.record("t", {}, "r", False)
    for i in range(5):  # push both out of the window
        d.record("other", {"i": i}, "x", False)
    assert d.record("t", {}, "r", False) is None
    assert d.record("t", {}, "r", False) is None
    assert d.record("t", {}, "r", False) is not None


@pytest.mark.parametrize(
    "kwargs, bad",
    [
        ({"warn_at": 1}, "1"),
        ({"warn_at": 3, "stop_at": 2}, "2"),
        ({"stop_at": -1}, "-1"),
        ({"window": 5}, "5"),
        ({"warn_at": "3"}, "'3'"),
    ],
)
def test_loop_detector_thresholds_validated(kwargs: dict[str, Any], bad: str) -> None:
    with pytest.raises(ConfigError, match=bad):
        LoopDetector(**kwargs)


# -- false positives ----------------------------------------------------------------


def test_polling_a_changing_resource_is_not_flagged() -> None:
    d = LoopDetector()
    for i in range(30):
        assert d.record("status", {"job": "42"}, f"progress {i}%", False) is None
        assert d.pre_check() is None


def test_paging_through_results_is_not_flagged() -> None:
    d = LoopDetector()
    for page in range(30):
        # the same result text on every page must not matter: the input differs
        assert d.record("list", {"query": "x", "page": page}, "10 items", False) is None
        assert d.pre_check() is None


def test_retrying_after_an_error_is_not_flagged() -> None:
    d = LoopDetector()
    for i in range(15):
        # each call fails once, then the retry succeeds (a fresh page each time)
        assert d.record("fetch", {"url": f"u{i}"}, "timeout", True) is None
        assert d.record("fetch", {"url": f"u{i}"}, "page body", False) is None
        assert d.pre_check() is None
    # the same call failing twice and then succeeding is no loop either
    assert d.record("fetch", {"url": "v"}, "timeout", True) is None
    assert d.record("fetch", {"url": "v"}, "timeout", True) is None
    assert d.record("fetch", {"url": "v"}, "body", False) is None


def test_thread_safe_counting() -> None:
    d = LoopDetector(warn_at=2, stop_at=0, window=10_000)
    barrier = threading.Barrier(8)
    warnings: list[Any] = []
    lock = threading.Lock()

    def work() -> None:
        barrier.wait()
        for _ in range(500):
            w = d.record("t", {"x": 1}, "r", False)
            if w is not None:
                with lock:
                    warnings.append(w)

    ts = [threading.Thread(target=work) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(warnings) == 1 and d.max_repetitions() == 4000


# -- ConvergenceDetector -------------------------------------------------------------


def test_jaccard_basics() -> None:
    assert jaccard(words("a b c"), words("A, b. c!")) == 1.0
    assert jaccard(words("a b"), words("c d")) == 0.0
    assert jaccard(words("a b c d"), words("a b c e")) == pytest.approx(3 / 5)


def test_converges_after_three_near_identical_answers() -> None:
    c = ConvergenceDetector()
    assert c.record("The answer is 42.") is None
    assert c.record("the ANSWER is 42") is None
    found = c.record("The answer is 42!")
    assert found == (1.0, 3)
    assert c.record("The answer is 42") == (1.0, 4)


def test_different_answer_resets_and_empty_resets() -> None:
    c = ConvergenceDetector()
    c.record("same words here")
    c.record("same words here")
    assert c.record("something else entirely") is None
    assert c.streak == 1
    c.record("something else entirely")
    assert c.record("") is None and c.streak == 0
    assert c.record("something else entirely") is None  # streak restarted at 1
    assert c.streak == 1


def test_threshold_is_inclusive_and_configurable() -> None:
    c = ConvergenceDetector(threshold=0.6, count=2)
    c.record("a b c d")
    found = c.record("a b c e")  # 3/5 is at the line: counts
    assert found is not None and found[0] == pytest.approx(0.6) and found[1] == 2
    c2 = ConvergenceDetector(threshold=0.61, count=2)
    c2.record("a b c d")
    assert c2.record("a b c e") is None


@pytest.mark.parametrize(
    "kwargs, bad",
    [({"threshold": 1.5}, "1.5"), ({"threshold": -0.1}, "-0.1"), ({"count": 1}, "1"), ({"action": "explode"}, "explode")],
)
def test_convergence_config_validated(kwargs: dict[str, Any], bad: str) -> None:
    with pytest.raises(ConfigError, match=bad):
        ConvergenceDetector(**kwargs)


# -- through the loop --------------------------------------------------------------


def _observer() -> Any:
    from loopctl.observers import CallbackObserver

    events: list[Event] = []
    return CallbackObserver(events.append), events


def test_bare_loop_has_detectors_by_default() -> None:
    loop = BareLoop(ScriptedClient([]))
    assert isinstance(loop._parts.loop_detector, LoopDetector)
    assert isinstance(loop._parts.convergence, ConvergenceDetector)


def test_convergence_warn_across_runs_fires_event_and_run_succeeds() -> None:
    obs, events = _observer()
    client = ScriptedClient([reply("Paris is the capital."), reply("paris is the capital"), reply("Paris is the capital!")])
    loop = BareLoop(client).with_observer(obs)
    for q in ("a", "b", "c"):
        loop.run(q)
    conv = [e for e in events if isinstance(e, ConvergenceDetected)]
    assert len(conv) == 1 and conv[0].action == "warn" and conv[0].count == 3


@pytest.mark.parametrize("action, error", [("stop", LoopDetected), ("ask_user", UserInputRequired)])
def test_convergence_stop_and_ask_user(action: str, error: type) -> None:
    client = ScriptedClient([reply("same answer")] * 3)
    loop = BareLoop(client).with_convergence_detector(ConvergenceDetector(action=action))
    loop.run("1")
    loop.run("2")
    with pytest.raises(error):
        loop.run("3")


class Echo(Tool):
    name = "read"
    description = "returns the same text"

    def input_schema(self) -> Mapping[str, Any]:
        return {"type": "object", "properties": {"path": {"type": "string"}}}

    def call(self, input: Mapping[str, Any], ctx: ToolContext) -> Any:
        return "unchanged content"


def test_loop_detected_through_the_loop_warns_then_stops() -> None:
    obs, events = _observer()
    script = [call("read", path="a") for _ in range(11)] + [reply("never")]
    loop = BareLoop(ScriptedClient(script), [Echo()]).with_observer(obs)
    with pytest.raises(LoopDetected, match="repeated 10 times"):
        loop.run("go")
    warn = [e for e in events if isinstance(e, LoopDetectedEvent)]
    assert warn and warn[0].repetitions == 3
    assert not loop._parts.loop_detector.has_pending_stop


class Denier(Observer):
    """Denies each call as it is parked, from another thread (a person saying no every time)."""

    def __init__(self) -> None:
        self.parked: queue.Queue[Optional[str]] = queue.Queue()
        self.asked = 0

    def on_approval_requested(self, event: ApprovalRequested) -> None:
        self.asked += 1
        self.parked.put(event.call_id)

    def on_run_end(self, event: RunEnd) -> None:
        self.parked.put(None)

    def deny_all(self, handle: Any) -> None:
        while (call_id := self.parked.get(timeout=WAIT)) is not None:
            handle.deny(call_id, "no")


@pytest.mark.parametrize("answer", ["denied", "timed out"])
def test_a_call_denied_every_time_is_a_loop_and_nobody_is_asked_once_the_stop_is_armed(answer: str) -> None:
    @tool(requires_approval=True, approval_timeout=0.01 if answer == "timed out" else None)
    def pay(to: str) -> str:
        """Pay someone.

        Args:
            to: who.
        """
        return "paid"

    obs, events = _observer()
    denier = Denier()
    script = [call("pay", to="x") for _ in range(15)] + [reply("gave up")]
    loop = BareLoop(ScriptedClient(script), [pay]).with_observer(obs).with_observer(denier)
    with loop:
        h = loop.start("go", RunConfig(max_turns=50))
        if answer == "denied":
            denier.deny_all(h)
        with pytest.raises(LoopDetected, match="repeated 10 times") as info:
            h.result(WAIT)
    assert info.value.run is not None and info.value.run.turn_count == 11
    assert denier.asked == 10  # the eleventh call is stopped before anyone is asked
    warn = [e for e in events if isinstance(e, LoopDetectedEvent)]
    assert [w.repetitions for w in warn] == [3]
