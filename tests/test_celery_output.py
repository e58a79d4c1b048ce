"""Typed answers through CeleryRunRegistry: a real redis-server and one real Celery worker.

The answer type travels with the config as its import path; ``status()``
carries the answer's JSON form and ``result()`` rebuilds the type. A type
a worker could not import is refused before anything is queued.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, List

import pytest

_REPO = str(Path(__file__).resolve().parent.parent)
if _REPO not in sys.path:  # workers and this module import the test app as tests.celery_app
    sys.path.insert(0, _REPO)

from tests.celery_support import CeleryWorker, RedisServer, missing_requirements, stop_all  # noqa: E402

REASON = missing_requirements()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

if REASON is None:
    from loopctl import RunConfig
    from loopctl.contrib.celery import CeleryRunRegistry
    from loopctl.errors import ConfigError
    from tests import celery_app
    from tests.output_types import Cities, City

WAIT = 30.0
FACTORY = "tests.celery_app:make_offline_loop"


@pytest.fixture(scope="module")
def registry() -> Iterator[CeleryRunRegistry]:
    started: List[Any] = []
    try:
        server = RedisServer()
        started.append(server)
        started.append(CeleryWorker(server.url(), "typed", concurrency=2))
        app = celery_app.make_app(server.url())
        reg = celery_app.make_registry(app, server.url(), FACTORY)
        yield reg
        reg.close()
    finally:
        stop_all(started)


def test_a_typed_run_on_a_worker_comes_back_as_its_type(registry: CeleryRunRegistry) -> None:
    rid = registry.start("typed-1", "What is 12 + 30?", RunConfig(output_mode="tool"), output_type=City)
    run = registry.result(rid, timeout=WAIT)
    assert isinstance(run.output_value, City) and run.output_value.population == 42
    status = registry.status(rid)
    assert status.state == "completed"
    assert status.output_value == {"name": run.output_value.name, "population": 42}
    types = [e["type"] for _, e in registry.events(rid, timeout=WAIT)]
    assert types[0] == "run_start" and types[-1] == "run_end"


def test_a_schema_dict_travels_as_itself_and_stays_json(registry: CeleryRunRegistry) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "number"}}, "required": ["n"]}
    rid = registry.start("typed-2", "multiply 6 by 7", output_type=schema)
    assert registry.result(rid, timeout=WAIT).output_value == {"n": 42}
    assert registry.status(rid).output_value == {"n": 42}


def test_a_type_no_worker_could_import_is_refused_before_queueing(registry: CeleryRunRegistry) -> None:
    class Local:
        n: int

    before = len(registry.list())
    with pytest.raises(ConfigError, match="cannot travel"):
        registry.start("typed-3", "x", output_type=Cities)  # list[...] has no import path
    with pytest.raises(ConfigError, match="output_type"):
        registry.start("typed-3", "x", output_type=Local)
    assert len(registry.list()) == before  # nothing was queued
