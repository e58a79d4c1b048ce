"""The managed temp dir ``{base}/loopctl-p{pid}-{token}/loopctl-{session_id}/`` (SPEC §6).

It is made when a tool first reads ``ctx.temp_dir`` (never before: not by
the builder, not by a run without tools, not by a tool call that never
reads it), handed to every call of the loop, and removed by ``close()``, by
leaving ``with BareLoop(...)`` and by garbage collection; the per-process
parent goes with the process's last loop dir under that base. Parents of
processes that no longer exist (killed, ``os._exit``) are swept when a
process first makes its own under the same base. When the dir cannot be
made, tools get the system temp dir (which the loop then never removes).
``with_managed_temp_disabled()`` gives ``None`` and makes nothing. The
system temp dir is pointed at a per-test directory (``tempfile.tempdir``)
so "nothing was created" can be checked exactly.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from support import join_loop_threads

from loopctl import BareLoop, ParallelDispatch, RunConfig
from loopctl.driver import tempdir
from loopctl.messages import ModelRequest, ModelResponse
from loopctl.testing import ScriptedClient, call, calls, reply
from loopctl.tools import Tool, ToolContext

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def system_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The system temp dir, for this test only: an empty directory we can list."""
    sys_tmp = tmp_path / "system-tmp"
    sys_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(sys_tmp))
    assert Path(tempfile.gettempdir()) == sys_tmp
    yield sys_tmp


class Scratch(Tool):
    """``scratch(name)``: writes ``name`` into its temp dir; records every context."""

    name = "scratch"
    description = "Write a file into the temp dir."
    concurrency_safe = True

    def __init__(self, hook: Optional[Callable[[ToolContext], None]] = None) -> None:
        self.hook = hook
        self.contexts: list[ToolContext] = []
        self.lock = threading.Lock()

    def call(self, input: Any, ctx: ToolContext) -> str:
        with self.lock:
            self.contexts.append(ctx)
        if self.hook is not None:
            self.hook(ctx)
        if ctx.temp_dir is None:
            return "no temp dir"
        (ctx.temp_dir / str(input.get("name", "f"))).write_text("x")
        return f"wrote into {ctx.temp_dir}"

    @property
    def dirs(self) -> set[Optional[Path]]:
        return {c.temp_dir for c in self.contexts}


def managed(base: Path, loop: BareLoop) -> Path:
    return base / tempdir.process_dir_name() / f"loopctl-{loop.session.id}"


# -- when it is made -------------------------------------------------------------------------


def test_made_on_the_first_read_of_ctx_temp_dir_and_not_before(tmp_path: Path, system_tmp: Path) -> None:
    base = tmp_path / "base"  # does not exist yet: made with the dir (parents=True)
    seen_at_model_call: list[bool] = []

    def ask_for_the_tool(request: ModelRequest) -> ModelResponse:
        seen_at_model_call.append(base.exists())
        return call("scratch", name="one")

    def inside(ctx: ToolContext) -> None:
        assert ctx.temp_dir is not None and ctx.temp_dir.is_dir()

    tool = Scratch(inside)
    client = ScriptedClient([reply("no tool in this run"), ask_for_the_tool, reply("done")])
    loop = BareLoop(client, [tool]).with_temp_dir(base)
    expected = managed(base, loop)
    try:
        assert loop.temp_dir == expected  # the path is known up front ...
        assert not base.exists()  # ... but the builder made nothing
        loop.run("no tools")
        assert not base.exists(), "a run without a tool dispatch made the temp dir"
        loop.run("now a tool")
        assert seen_at_model_call == [False], "made before the tool was dispatched"
        assert tool.dirs == {expected}
        assert (expected / "one").read_text() == "x"
        assert sorted(p.name for p in base.iterdir()) == [expected.parent.name]
        assert list(system_tmp.iterdir()) == []  # nothing in the system temp dir
    finally:
        loop.close()
    assert not expected.exists()
    assert base.is_dir() and list(base.iterdir()) == []  # the process's parent went with it; never the base


def test_default_base_is_the_system_temp_dir(system_tmp: Path) -> None:
    tool = Scratch()
    loop = BareLoop(ScriptedClient([call("scratch", name="a"), reply("ok")]), [tool])
    expected = managed(system_tmp, loop)
    with loop:
        loop.run("x")
        assert tool.dirs == {expected} and expected.is_dir()
    assert not expected.exists()
    assert system_tmp.is_dir() and list(system_tmp.iterdir()) == []


def test_one_dir_for_every_call_and_run_until_close(tmp_path: Path) -> None:
    tool = Scratch()
    client = ScriptedClient(
        [
            calls(("scratch", {"name": "a"}), ("scratch", {"name": "b"})),  # a parallel wave
            reply("first"),
            call("scratch", name="c"),
            reply("second"),
        ]
    )
    loop = BareLoop(client, [tool]).with_temp_dir(tmp_path)
    expected = managed(tmp_path, loop)
    loop.run("one")
    (expected / "nested" / "deeper").mkdir(parents=True)
    (expected / "nested" / "deeper" / "file").write_text("kept between runs")
    loop.run("two")
    assert len(tool.contexts) == 3 and tool.dirs == {expected}
    assert sorted(p.name for p in expected.iterdir()) == ["a", "b", "c", "nested"]
    loop.close()
    assert not expected.exists()  # removed with everything in it
    loop.close()  # idempotent
    assert not expected.exists()


def test_two_loops_get_two_dirs_and_close_only_their_own(tmp_path: Path) -> None:
    t1, t2 = Scratch(), Scratch()
    l1 = BareLoop(ScriptedClient([call("scratch"), reply("ok")]), [t1]).with_temp_dir(tmp_path)
    l2 = BareLoop(ScriptedClient([call("scratch"), reply("ok")]), [t2]).with_temp_dir(tmp_path)
    with l2:
        with l1:
            l1.run("x")
            l2.run("y")
            assert t1.dirs == {managed(tmp_path, l1)} and t2.dirs == {managed(tmp_path, l2)}
            assert t1.dirs != t2.dirs
        assert not managed(tmp_path, l1).exists()
        assert managed(tmp_path, l2).is_dir()
    assert list(tmp_path.iterdir()) == []


# -- when it is removed ----------------------------------------------------------------------


def test_leaving_the_with_block_removes_it(tmp_path: Path) -> None:
    tool = Scratch()
    with BareLoop(ScriptedClient([call("scratch"), reply("ok")]), [tool]).with_temp_dir(tmp_path) as loop:
        loop.run("x")
        expected = managed(tmp_path, loop)
        assert expected.is_dir()
    assert not expected.exists()


def test_leaving_the_with_block_by_an_exception_removes_it(tmp_path: Path) -> None:
    tool = Scratch()
    expected: Optional[Path] = None
    with pytest.raises(RuntimeError, match="host code failed"):
        with BareLoop(ScriptedClient([call("scratch"), reply("ok")]), [tool]).with_temp_dir(tmp_path) as loop:
            loop.run("x")
            expected = managed(tmp_path, loop)
            raise RuntimeError("host code failed")
    assert expected is not None and not expected.exists()


@pytest.mark.parametrize("wave", ["one_call", "parallel_wave"])
def test_garbage_collection_removes_it(tmp_path: Path, wave: str) -> None:
    tool = Scratch()
    first = call("scratch") if wave == "one_call" else calls(("scratch", {"name": "a"}), ("scratch", {"name": "b"}))
    loop = BareLoop(ScriptedClient([first, reply("ok")]), [tool]).with_temp_dir(tmp_path)
    expected = managed(tmp_path, loop)
    run = loop.run("x", RunConfig())
    assert run.output == "ok" and expected.is_dir()
    join_loop_threads(loop)  # the body's frame must not keep the loop alive
    alive = weakref.ref(loop)
    del loop
    gc.collect()
    assert alive() is None, "the loop was not collected: something still references it"
    assert not expected.exists(), "garbage collection left the temp dir behind"


def test_closing_or_collecting_a_loop_that_never_dispatched_makes_nothing(tmp_path: Path) -> None:
    closed = BareLoop(ScriptedClient([reply("ok")])).with_temp_dir(tmp_path)
    closed.run("x")
    closed.close()
    collected = BareLoop(ScriptedClient([reply("ok")])).with_temp_dir(tmp_path)
    collected.run("x")
    join_loop_threads(collected)
    del collected
    gc.collect()
    assert list(tmp_path.iterdir()) == []


# -- when it cannot be made ------------------------------------------------------------------


@pytest.mark.parametrize("where", ["base_is_a_file", "base_parent_is_a_file"])
def test_falls_back_to_the_system_temp_dir(
    tmp_path: Path, system_tmp: Path, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    blocker = tmp_path / "a-regular-file"
    blocker.write_text("not a directory")
    base = blocker if where == "base_is_a_file" else blocker / "sub"
    sentinel = system_tmp / "someone-elses-file"
    sentinel.write_text("must survive")
    tool = Scratch()
    client = ScriptedClient([call("scratch", name="one"), reply("first"), call("scratch", name="two"), reply("second")])
    loop = BareLoop(client, [tool]).with_temp_dir(base)
    with caplog.at_level(logging.WARNING, logger="loopctl"):
        loop.run("one")
        loop.run("two")
    assert tool.dirs == {system_tmp}  # every call, every run: the system temp dir
    assert loop.temp_dir == system_tmp
    assert (system_tmp / "one").exists() and (system_tmp / "two").exists()
    warnings = [r for r in caplog.records if r.name == "loopctl" and r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]  # tried once, not per call
    assert loop.session.id in warnings[0].getMessage()
    assert blocker.read_text() == "not a directory"
    loop.close()
    join_loop_threads(loop)
    del loop
    gc.collect()
    # Neither close() nor collection removes a directory the loop does not own.
    assert system_tmp.is_dir() and sentinel.read_text() == "must survive"
    assert (system_tmp / "one").exists()


# -- disabled ------------------------------------------------------------------------------


def test_managed_temp_disabled_gives_none_and_creates_nothing(tmp_path: Path, system_tmp: Path) -> None:
    base = tmp_path / "base"
    tool = Scratch()
    client = ScriptedClient([calls(("scratch", {}), ("scratch", {})), reply("first"), call("scratch"), reply("second")])
    loop = BareLoop(client, [tool]).with_temp_dir(base).with_managed_temp_disabled()
    with loop:
        assert loop.temp_dir is None
        loop.run("one")
        loop.run("two")
        assert loop.temp_dir is None
    assert len(tool.contexts) == 3 and tool.dirs == {None}
    assert not base.exists()
    assert list(system_tmp.iterdir()) == []


# -- only when a tool asks -----------------------------------------------------------------


class Quiet(Tool):
    """``quiet()``: never reads ``ctx.temp_dir``; counts its calls."""

    name = "quiet"
    description = "Do nothing with the filesystem."
    concurrency_safe = True

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def call(self, input: Any, ctx: ToolContext) -> str:
        with self.lock:
            self.calls += 1
        return "ok"


def test_a_run_whose_tools_never_read_temp_dir_creates_no_directory(tmp_path: Path, system_tmp: Path) -> None:
    base = tmp_path / "base"
    quiet = Quiet()
    client = ScriptedClient(
        [
            call("quiet"),
            calls(("quiet", {"n": 1}), ("quiet", {"n": 2}), ("quiet", {"n": 3})),  # a parallel wave
            reply("first"),
            call("quiet"),
            reply("second"),
        ]
    )
    default_base = BareLoop(ScriptedClient([call("quiet"), reply("ok")]), [quiet])
    custom_base = BareLoop(client, [quiet]).with_temp_dir(base)
    with default_base, custom_base:
        default_base.run("x")
        custom_base.run("one")
        custom_base.run("two")
        assert quiet.calls == 6
        assert not base.exists()
        assert list(system_tmp.iterdir()) == []
    assert not base.exists() and list(system_tmp.iterdir()) == []


def test_the_dir_is_made_by_the_first_call_that_reads_it(tmp_path: Path) -> None:
    quiet, scratch = Quiet(), Scratch()
    client = ScriptedClient([call("quiet"), reply("first"), call("scratch", name="late"), reply("second")])
    with BareLoop(client, [quiet, scratch]).with_temp_dir(tmp_path) as loop:
        loop.run("one")
        assert list(tmp_path.iterdir()) == []
        loop.run("two")
        expected = managed(tmp_path, loop)
        assert (expected / "late").read_text() == "x"
    assert list(tmp_path.iterdir()) == []


def test_calls_reading_it_at_once_share_one_dir(tmp_path: Path) -> None:
    width = 6
    for _ in range(20):
        barrier = threading.Barrier(width, timeout=10)
        tool = Scratch(lambda ctx, barrier=barrier: barrier.wait())
        wave = calls(*[("scratch", {"name": f"f{i}"}) for i in range(width)])
        loop = BareLoop(ScriptedClient([wave, reply("ok")]), [tool]).with_temp_dir(tmp_path)
        with loop:
            loop.run("x", RunConfig(parallel=ParallelDispatch(max_concurrency=width)))
            expected = managed(tmp_path, loop)
            assert tool.dirs == {expected}
            assert sorted(p.name for p in expected.iterdir()) == [f"f{i}" for i in range(width)]
        assert list(tmp_path.iterdir()) == []


def test_a_context_built_by_hand_takes_a_path_none_or_a_maker(tmp_path: Path) -> None:
    assert ToolContext("s", "r", 0, "c", tmp_path, None).temp_dir == tmp_path
    assert ToolContext("s", "r", 0, "c", None, None).temp_dir is None
    made: list[Path] = []

    def maker() -> Path:
        made.append(tmp_path)
        return tmp_path

    ctx = ToolContext("s", "r", 0, "c", maker, None)
    assert made == []  # nothing until read
    assert ctx.temp_dir == tmp_path and ctx.temp_dir == tmp_path
    assert made == [tmp_path]  # called once
    ctx.temp_dir = None
    assert ctx.temp_dir is None


# -- leftovers of dead processes ---------------------------------------------------------------

_CHILD = r"""
import os, sys
from pathlib import Path
from loopctl import BareLoop
from loopctl.testing import ScriptedClient, call, reply
from loopctl.tools import tool, ToolContext

@tool
def touch(ctx: ToolContext) -> str:
    '''Write a file into the temp dir.'''
    (ctx.temp_dir / "work").write_text("x")
    return str(ctx.temp_dir)

loop = BareLoop(ScriptedClient([call("touch"), reply("ok")]), [touch]).with_temp_dir(sys.argv[1])
loop.run("x")
print(loop.temp_dir, flush=True)
if sys.argv[2] == "wait":
    sys.stdin.read()  # alive until the test closes our stdin or kills us
os._exit(0)  # no close(), no atexit: what a crash leaves behind
"""


def _child(base: Path, mode: str) -> tuple[subprocess.Popen[str], Path]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(base), mode],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line, "the child printed no temp dir"
    made = Path(line)
    assert (made / "work").read_text() == "x"
    return proc, made


def test_stale_dirs_of_dead_processes_are_swept_and_live_ones_kept(tmp_path: Path) -> None:
    # The live ones first: each process sweeps when it first makes its dir.
    killed, killed_dir = _child(tmp_path, "wait")
    alive, alive_dir = _child(tmp_path, "wait")
    try:
        exited, exited_dir = _child(tmp_path, "exit")
        assert exited.wait(30) == 0
        if exited.stdout is not None:
            exited.stdout.close()
        killed.send_signal(signal.SIGKILL)
        killed.wait(30)
        for d, proc in ((exited_dir, exited), (killed_dir, killed), (alive_dir, alive)):
            assert d.parent.name.startswith(f"{tempdir.PREFIX}{proc.pid}-")
            assert (d.parent / tempdir.LOCK_NAME).exists() and (d / "work").exists()
        legacy = tmp_path / "loopctl-0123456789abcdef0123456789abcdef"  # an older version's, owner unknown
        legacy.mkdir()
        (tmp_path / "someone-elses-file").write_text("kept")
        tool = Scratch()
        with BareLoop(ScriptedClient([call("scratch"), reply("ok")]), [tool]).with_temp_dir(tmp_path) as loop:
            loop.run("x")  # the first read of ctx.temp_dir under tmp_path in this process sweeps it
            assert not exited_dir.parent.exists(), "a process that exited left its dir behind"
            assert not killed_dir.parent.exists(), "a process killed with SIGKILL left its dir behind"
            assert (alive_dir / "work").read_text() == "x", "a live process's dir was swept"
            assert legacy.is_dir() and (tmp_path / "someone-elses-file").read_text() == "kept"
            assert tool.dirs == {managed(tmp_path, loop)}
    finally:
        assert alive.stdin is not None
        alive.stdin.close()
        alive.wait(30)
        killed.kill()
        if killed.stdin is not None:
            killed.stdin.close()
        if killed.stdout is not None:
            killed.stdout.close()
        if alive.stdout is not None:
            alive.stdout.close()
    assert alive_dir.exists()  # it died by os._exit: the next process to look sweeps it


def test_a_parent_without_its_lock_is_swept_only_once_old(tmp_path: Path) -> None:
    young = tmp_path / f"{tempdir.PREFIX}1-aaaaaaaa"
    old = tmp_path / f"{tempdir.PREFIX}2-bbbbbbbb"
    for d in (young, old):
        (d / "session").mkdir(parents=True)
    stale = time.time() - tempdir.UNLOCKED_GRACE_S - 5
    os.utime(old, (stale, stale))
    base_key = tmp_path
    tempdir._swept.discard(base_key)
    with BareLoop(ScriptedClient([call("scratch"), reply("ok")]), [Scratch()]).with_temp_dir(tmp_path) as loop:
        loop.run("x")
    assert young.is_dir(), "a parent still being made (no lock yet) was swept"
    assert not old.exists()
