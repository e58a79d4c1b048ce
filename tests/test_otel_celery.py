"""A Celery run's spans join the caller's trace (real redis-server, a real worker process).

The caller starts the run inside its own span (an in-memory SDK provider);
``CeleryRunRegistry.start`` carries the W3C traceparent with the run. The
worker (``tests.celery_app:make_traced_loop``) has an ``OTelObserver``
whose provider writes every finished span as a JSON line to the file named
by ``LOOPCTL_TEST_OTEL_FILE``; the test reads that file back. The run's
spans are ended before the worker records the run's end, so once
``result()`` has returned they are in the file.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Dict, List

import pytest

_REPO = str(Path(__file__).resolve().parent.parent)
if _REPO not in sys.path:  # the worker and this module import the test app as tests.celery_app
    sys.path.insert(0, _REPO)

from tests.celery_support import (  # noqa: E402
    CeleryWorker,
    RedisServer,
    missing_requirements,
    stop_all,
    wait_signal,
)

REASON = missing_requirements()
try:
    import opentelemetry.sdk  # noqa: F401
except ImportError:
    REASON = REASON or "opentelemetry-sdk is not installed (pip install 'loopctl[test]')"
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

if REASON is None:
    import redis
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    from loopctl import Cancelled
    from tests import celery_app
    from tests.celery_app import OTEL_FILE_ENV, plan_text

WAIT = 20.0
TRACED = "tests.celery_app:make_traced_loop"


class TracedCluster:
    def __init__(self, server: RedisServer, worker: CeleryWorker, span_file: Path) -> None:
        self.url = server.url()
        self.app = celery_app.make_app(self.url)
        self.registry = celery_app.make_registry(self.app, self.url, TRACED)
        self.span_file = span_file
        self.worker = worker
        self.sig = redis.Redis.from_url(self.url, decode_responses=True, socket_timeout=30)

    def spans_of(self, run_id: str) -> List[Dict[str, Any]]:
        """The worker's spans of one run: its invoke_agent span and that span's children."""
        spans = [json.loads(line) for line in self.span_file.read_text(encoding="utf-8").splitlines() if line]
        roots = [s for s in spans if s["name"] == "invoke_agent" and s["attributes"].get("loopctl.run.id") == run_id]
        assert len(roots) == 1, f"{len(roots)} run spans for {run_id}; worker:\n{self.worker.tail()}"
        root_id = roots[0]["context"]["span_id"]
        return roots + [s for s in spans if s.get("parent_id") == root_id]


@pytest.fixture(scope="module")
def cluster() -> Iterator[TracedCluster]:
    started: List[Any] = []
    fd, name = tempfile.mkstemp(prefix="loopctl-otel-spans-", suffix=".jsonl")
    os.close(fd)
    span_file = Path(name)
    previous = os.environ.get(OTEL_FILE_ENV)
    try:
        server = RedisServer()
        started.append(server)
        os.environ[OTEL_FILE_ENV] = str(span_file)  # the worker's environment is copied from ours
        try:
            worker = CeleryWorker(server.url(), "otel", concurrency=2)
        finally:
            if previous is None:
                del os.environ[OTEL_FILE_ENV]
            else:
                os.environ[OTEL_FILE_ENV] = previous
        started.append(worker)
        c = TracedCluster(server, worker, span_file)
        yield c
        c.registry.close()
        c.sig.close()
    finally:
        stop_all(started)
        span_file.unlink(missing_ok=True)


def hex_id(value: int, width: int) -> str:
    return f"0x{value:0{width}x}"


def test_the_workers_spans_join_the_callers_trace(cluster: TracedCluster) -> None:
    provider = TracerProvider()
    tracer = trace.get_tracer("web", tracer_provider=provider)
    tag = uuid.uuid4().hex[:12]
    with tracer.start_as_current_span("POST /chat") as request:
        run_id = cluster.registry.start(f"conv-{tag}", plan_text(tag, turns=2, tool="echo"))
    run = cluster.registry.result(run_id, WAIT)
    assert run.output.startswith(f"done {tag}")
    caller = request.get_span_context()
    spans = cluster.spans_of(run_id)
    root = spans[0]
    assert root["context"]["trace_id"] == hex_id(caller.trace_id, 32)
    assert root["parent_id"] == hex_id(caller.span_id, 16)
    assert root["attributes"]["loopctl.run.outcome"] == "completed"
    names = sorted(s["name"] for s in spans[1:])
    assert names == ["chat scripted", "chat scripted", "execute_tool echo"]
    assert {s["context"]["trace_id"] for s in spans} == {hex_id(caller.trace_id, 32)}
    tool = next(s for s in spans if s["name"] == "execute_tool echo")
    assert tool["attributes"]["gen_ai.tool.call.id"] == run.turns[0].tool_calls[0].id
    provider.shutdown()


def test_a_run_started_outside_any_span_is_its_own_trace_and_a_cancel_is_recorded(cluster: TracedCluster) -> None:
    tag = uuid.uuid4().hex[:12]
    run_id = cluster.registry.start(f"conv-{tag}", plan_text(tag, turns=3, tool="work", gate=[1]))
    assert cluster.sig.blpop([f"t:{tag}:entered"], timeout=WAIT) is not None
    assert cluster.registry.cancel(run_id, "stop from the web")
    with pytest.raises(Cancelled):
        cluster.registry.result(run_id, WAIT)
    cluster.sig.rpush(f"t:{tag}:release:1", "go")  # free the abandoned model call
    spans = cluster.spans_of(run_id)
    root = spans[0]
    assert root.get("parent_id") is None
    assert root["attributes"]["loopctl.run.outcome"] == "cancelled"
    cancel = [e for e in root["events"] if e["name"] == "loopctl.cancel"]
    assert len(cancel) == 1 and cancel[0]["attributes"]["loopctl.cancel.reason"] == "stop from the web"
    cut = [s for s in spans if s["name"].startswith("chat") and s["attributes"].get("loopctl.turn") == 1]
    assert len(cut) == 1 and cut[0]["attributes"]["loopctl.cancelled"] is True


def test_a_run_handed_back_on_sigterm_is_not_cancelled_and_its_resume_continues_the_trace(
    cluster: TracedCluster,
) -> None:
    queue = f"handback-{uuid.uuid4().hex[:6]}"
    env = {OTEL_FILE_ENV: str(cluster.span_file)}
    workers = [CeleryWorker(cluster.url, f"hb{i}{uuid.uuid4().hex[:4]}", queues=queue, concurrency=2, extra_env=env)
               for i in range(2)]
    registry = celery_app.make_registry(
        cluster.app, cluster.url, "tests.celery_app:make_traced_durable_loop", resume="on_worker_loss", queue=queue
    )
    provider = TracerProvider()
    tracer = trace.get_tracer("web", tracer_provider=provider)
    try:
        tag = uuid.uuid4().hex[:12]
        with tracer.start_as_current_span("POST /chat") as request:
            run_id = registry.start(f"conv-{tag}", plan_text(tag, turns=3, gate=[1], record=True))
        assert int(wait_signal(cluster.sig, f"t:{tag}:entered", WAIT)) == 1
        holder = int(cluster.sig.get(f"t:{tag}:pid") or 0)
        [leaving] = [w for w in workers if w.pid == holder]
        leaving._p.proc.terminate()  # warm shutdown: the run is handed back at its next boundary
        cluster.sig.rpush(f"t:{tag}:release:1", "go")
        run = registry.result(run_id, WAIT)
        assert run.output == f"done {tag} turn=2 steers=0"
        assert leaving._p.proc.wait(WAIT) == 0
        assert registry.status(run_id).resumes == 1
    finally:
        registry.close()
        stop_all(workers)
        provider.shutdown()
    caller = request.get_span_context()
    spans = [json.loads(line) for line in cluster.span_file.read_text(encoding="utf-8").splitlines() if line]
    runs = [s for s in spans if s["name"] == "invoke_agent" and s["attributes"].get("loopctl.run.id") == run_id]
    assert len(runs) == 2, [s["attributes"] for s in runs]
    first, resumed = sorted(runs, key=lambda s: s["start_time"])
    assert {s["context"]["trace_id"] for s in runs} == {hex_id(caller.trace_id, 32)}
    assert first["attributes"]["loopctl.run.outcome"] == "handed_back"
    assert "loopctl.cancelled" not in first["attributes"] and first["status"]["status_code"] != "ERROR"
    assert not [e for e in first["events"] if e["name"] == "loopctl.cancel"]
    assert resumed["parent_id"] == first["context"]["span_id"]  # it continues the span it resumes
    assert resumed["attributes"]["loopctl.run.resumes"] == 1
    assert resumed["attributes"]["loopctl.run.outcome"] == "completed"
    chats = [s for s in spans if s.get("parent_id") == resumed["context"]["span_id"]]
    assert chats and all(s["context"]["trace_id"] == hex_id(caller.trace_id, 32) for s in chats)
