"""``examples/celery_worker.py`` is a complete worker module: a real Celery
worker imports it, and a run started from this process is executed there,
steered by run id, and answered (skips where redis-server/celery are absent)."""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery_support import CeleryWorker, RedisServer, missing_requirements, stop_all

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(missing_requirements() is not None, reason=str(missing_requirements()))


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    started: list[Any] = []
    try:
        server = RedisServer()
        started.append(server)
        monkeypatch.setenv("LOOPCTL_REDIS_URL", server.url())
        monkeypatch.syspath_prepend(str(REPO))
        sys.modules.pop("examples.celery_worker", None)
        module = importlib.import_module("examples.celery_worker")
        worker = CeleryWorker(server.url(), "example", queues="agents", concurrency=2,
                              app="examples.celery_worker")
        started.append(worker)
        module.test_worker = worker
        yield module
    finally:
        mod = sys.modules.pop("examples.celery_worker", None)
        if mod is not None:
            mod.registry.close()
        stop_all(started)


def test_the_example_worker_module_runs_a_steered_run(example: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert example.main(["What is (2 + 3) * 4?"]) == 0
    out = capsys.readouterr().out
    assert "  > add(a=2, b=3)" in out
    assert "[guidance delivered: show each step]" in out
    assert out.rstrip().endswith("= 20.")


def test_the_worker_logs_one_line_per_run_with_its_id_outcome_and_duration(
    example: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert example.main(["What is (2 + 3) * 4?"]) == 0
    run_id = capsys.readouterr().out.split()[1]  # "run <id> queued on 'agents'"
    worker = example.test_worker
    worker.stop()  # a warm shutdown: the task has ended and its output is all read
    lines = [line for line in worker.tail(200).splitlines() if "loopctl.celery" in line]
    assert len(lines) == 1, worker.tail(200)
    assert re.search(rf"loopctl\.celery: run {run_id} completed in \d+\.\d\d s$", lines[0]), lines
    assert "(2 + 3)" not in lines[0] and "show each step" not in lines[0]  # no input, no guidance
