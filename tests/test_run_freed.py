"""A finished run is freed by reference counting, not left to the cyclic GC (issue 22).

With ten thousand runs in flight a full cyclic-GC collection holds the GIL
for seconds, so a finished run must not leave reference cycles behind: its
loop, its ``RunDriver`` and its ``RunContext`` go the moment the last
outside reference does. Each test disables the cyclic GC while it runs, so
only reference counting can free anything.
"""

from __future__ import annotations

import gc
import logging
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from loopctl import BareLoop, Cancelled, ModelError, ModelRequest, ModelResponse
from loopctl.hosting.registry import RunRegistry
from loopctl.testing import ScriptedClient, call, calls, reply
from loopctl.tools import tool


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@pytest.fixture
def gc_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _held_loop(entered: threading.Event, go: threading.Event) -> BareLoop:
    """A loop whose first model call waits for ``go`` (so the test can look at the live run)."""

    def held(request: ModelRequest) -> ModelResponse:
        entered.set()
        go.wait(10)
        return call("add", a=1, b=2)

    return BareLoop(ScriptedClient([held, reply("3")]), [add])


def _refs(handle: Any) -> dict[str, weakref.ref[Any]]:
    rc = handle._rc
    return {"context": weakref.ref(rc), "driver": weakref.ref(rc.driver)}


def test_a_finished_run_and_its_loop_are_freed_without_the_cyclic_gc(gc_off: None) -> None:
    for _ in range(20):
        entered, go = threading.Event(), threading.Event()
        loop = _held_loop(entered, go)
        handle = loop.start("1 + 2?")
        entered.wait(10)
        refs = {"loop": weakref.ref(loop), **_refs(handle)}
        go.set()
        assert handle.result(timeout=10).output == "3"
        handle._rc.thread.join(10)
        loop.close()
        del loop, handle
        assert {k: r() is None for k, r in refs.items()} == {"loop": True, "context": True, "driver": True}


def test_a_blocking_run_leaves_no_cycle_behind(gc_off: None) -> None:
    for _ in range(20):
        loop = BareLoop(ScriptedClient([call("add", a=1, b=2), reply("3")]), [add])
        ref = weakref.ref(loop)
        assert loop.run("1 + 2?").output == "3"
        loop.close()
        del loop
        assert ref() is None


def test_a_registry_run_is_freed_once_the_registry_forgets_it(gc_off: None) -> None:
    entered, go = threading.Event(), threading.Event()
    loop = _held_loop(entered, go)
    runs = RunRegistry(keep_finished_s=0)
    rid = runs.start(loop, "1 + 2?", run_id="r1")
    entered.wait(10)
    ref = weakref.ref(loop)
    del loop
    go.set()
    assert runs.result(rid, timeout=10).output == "3"
    runs.close()  # joins the run's thread
    with pytest.raises(KeyError):  # the next access forgets the finished run
        runs.status(rid)
    assert ref() is None


def test_a_cancelled_run_is_freed_once_its_thread_ends(gc_off: None) -> None:
    for _ in range(20):
        entered, go = threading.Event(), threading.Event()
        loop = _held_loop(entered, go)
        handle = loop.start("1 + 2?")
        entered.wait(10)
        refs = {"loop": weakref.ref(loop), **_refs(handle)}
        assert handle.cancel("stop") is True
        with pytest.raises(Cancelled):
            handle.result(timeout=10)
        go.set()  # the abandoned body wakes, sees the takeover, and leaves
        handle._rc.thread.join(10)
        loop.close()
        del loop, handle
        assert {k: r() is None for k, r in refs.items()} == {"loop": True, "context": True, "driver": True}


def test_a_cancelled_run_whose_takeover_thread_cannot_start_is_still_freed(
    gc_off: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_start = threading.Thread.start

    def refuse_takeovers(thread: threading.Thread) -> None:
        if thread.name.endswith("-cancel"):
            raise RuntimeError("can't start new thread")
        real_start(thread)

    entered, go = threading.Event(), threading.Event()
    loop = _held_loop(entered, go)
    handle = loop.start("1 + 2?")
    entered.wait(10)
    refs = {"loop": weakref.ref(loop), **_refs(handle)}
    # The failure is logged with its traceback; a kept log record would keep the run's frames.
    monkeypatch.setattr(logging.getLogger("loopctl"), "disabled", True)
    monkeypatch.setattr(threading.Thread, "start", refuse_takeovers)
    handle.cancel("stop")  # the takeover fails to start (logged); the body ends the run itself
    monkeypatch.setattr(threading.Thread, "start", real_start)
    go.set()
    with pytest.raises(Cancelled):
        handle.result(timeout=10)
    handle._rc.thread.join(10)
    loop.close()
    del loop, handle
    assert {k: r() is None for k, r in refs.items()} == {"loop": True, "context": True, "driver": True}


def test_a_failed_run_is_freed_though_its_error_is_kept(gc_off: None) -> None:
    for _ in range(20):
        loop = BareLoop(ScriptedClient([call("add", a=1, b=2), ModelError("model down")]), [add])
        handle = loop.start("1 + 2?")
        with pytest.raises(ModelError) as caught:
            handle.result(timeout=10)
        handle._rc.thread.join(10)
        refs = {"loop": weakref.ref(loop), "context": weakref.ref(handle._rc)}
        loop.close()
        del loop, handle
        assert {k: r() is None for k, r in refs.items()} == {"loop": True, "context": True}
        assert "model down" in str(caught.value)  # the error itself outlives its run


def test_a_cancelled_runs_state_is_freed_while_its_abandoned_tools_still_run(gc_off: None) -> None:
    """A parallel wave's stuck calls hold only the run's tool tally, never the run's state and its collaborators."""
    from loopctl import ParallelDispatch, RunConfig
    from loopctl.tools import Tool, ToolContext

    class Stuck(Tool):
        name = "stuck"
        description = "Ignores cancel until released."
        concurrency_safe = True

        def __init__(self) -> None:
            self.release = threading.Event()
            self.entered = threading.Semaphore(0)

        def call(self, input: Any, ctx: ToolContext) -> str:
            self.entered.release()
            self.release.wait(10)
            return "late"

    for _ in range(10):
        stuck = Stuck()
        wave = calls(("stuck", {}), ("stuck", {}))
        loop = BareLoop(ScriptedClient([wave, reply("never")]), [stuck])
        try:
            handle = loop.start("go", RunConfig(parallel=ParallelDispatch(max_concurrency=2)))
            for _ in range(2):
                assert stuck.entered.acquire(timeout=10)  # both calls run on the pool, stuck
            driver = weakref.ref(handle._rc.driver)
            assert handle.cancel("stop") is True
            with pytest.raises(Cancelled):
                handle.result(timeout=10)
            handle._rc.thread.join(10)
            assert loop.abandoned_tool_threads == 2
            del handle
            assert driver() is None  # freed now, while both calls are still stuck
        finally:
            stuck.release.set()  # a failed check never leaves the pool threads waiting
            loop.close()
