"""What ``RunRegistry`` keeps of a finished run (issue 22).

Once a run has ended and its thread is done, the next registry call
compacts its entry: the loop, its thread state and the handle are dropped
(a per-run loop becomes garbage), the events are kept as a tuple, and
``status``, ``result``, ``leftovers`` and ``events`` answer exactly as
before.
"""

from __future__ import annotations

import gc
import threading
import tracemalloc
import weakref
from typing import Any

import pytest

from loopctl import BareLoop, Cancelled, ModelError, ModelRequest, ModelResponse
from loopctl.hosting.registry import RunRegistry
from loopctl.testing import ScriptedClient, call, reply
from loopctl.tools import tool


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _fresh(i: int) -> BareLoop:
    return BareLoop(ScriptedClient([call("add", a=i, b=1), reply(f"{i} + 1 = {i + 1}")]), [add])


def _snapshot(runs: RunRegistry, rid: str) -> tuple[Any, ...]:
    try:
        outcome: Any = runs.result(rid).output
    except Exception as exc:  # the run's error: same object before and after
        outcome = exc
    return (runs.status(rid), outcome, runs.leftovers(rid), list(runs.events(rid)), list(runs.events(rid, after=3)))


def test_a_finished_runs_loop_is_released_and_its_answers_do_not_change() -> None:
    gate = threading.Event()

    def held(request: ModelRequest) -> ModelResponse:
        gate.wait(10)
        return reply("late")

    loops = {
        "ok": _fresh(1),
        "failed": BareLoop(ScriptedClient([call("add", a=1, b=2), ModelError("model down")]), [add]),
        "cancelled": BareLoop(ScriptedClient([held]), [add]),
    }
    refs = {k: weakref.ref(v) for k, v in loops.items()}
    with RunRegistry() as runs:
        ids = {k: runs.start(v, "go", run_id=k) for k, v in loops.items()}
        del loops
        assert runs.steer("cancelled", "more detail") is True
        runs.cancel("cancelled")
        gate.set()
        before = {}
        for k, rid in ids.items():
            runs.status(rid)
            before[k] = _snapshot(runs, rid)
        assert before["ok"][0].state == "completed" and before["ok"][1] == "1 + 1 = 2"
        assert before["failed"][0].state == "failed" and isinstance(before["failed"][1], ModelError)
        assert before["cancelled"][0].state == "cancelled" and isinstance(before["cancelled"][1], Cancelled)
        assert [m.text for m in before["cancelled"][2]] == ["more detail"]
        runs.list()  # any access compacts every run whose thread is done
        for k in ids:
            for t in threading.enumerate():
                if t.name.startswith(f"loopctl-run-{k}"):
                    t.join(10)
        runs.list()
        gc.collect()
        alive = [k for k, r in refs.items() if r() is not None]
        assert alive == [], f"finished runs still hold their loops: {alive}"
        for k, rid in ids.items():
            after = _snapshot(runs, rid)
            assert after[0] == before[k][0]
            assert after[1] is before[k][1] or after[1] == before[k][1]
            assert after[2] == before[k][2]
            assert after[3] == before[k][3] and after[3][-1][1]["type"] == "run_end"
            assert after[4] == before[k][4] and after[4][0][0] == 4
        assert runs.steer("ok", "too late") is False and runs.cancel("ok") is False
        with pytest.raises(ModelError, match="model down"):
            runs.result("failed")


def test_finished_runs_keep_a_few_kib_each() -> None:
    n = 300
    with RunRegistry(max_active=n) as runs:
        for i in range(20):  # warm-up: first-use allocations are not per run
            runs.result(runs.start(_fresh(i), "go"))
        runs.list()
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            ids = [runs.start(_fresh(i), "go") for i in range(n)]
            for rid in ids:
                runs.result(rid)
            for t in threading.enumerate():
                if t.name.startswith("loopctl-run-"):
                    t.join(10)
            runs.list()
            gc.collect()
            per_run = (tracemalloc.get_traced_memory()[0] - base) / n
        finally:
            tracemalloc.stop()
        assert all(runs.status(rid).state == "completed" for rid in ids)
    # Before compaction a finished run kept its loop: ~26 KiB each.
    assert per_run < 8 * 1024, f"{per_run / 1024:.1f} KiB per finished run"
