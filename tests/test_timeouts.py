"""Every configurable timeout: refused when not finite and positive, clamped to what a wait can take."""

from __future__ import annotations

import gc
import logging
import math
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from support import WAIT

from loopctl import BareLoop, RunConfig, tool
from loopctl.context import SqliteMemoryStore
from loopctl.observers import ApprovalRequested, Observer
from loopctl.providers import AnthropicClient, OpenAIClient
from loopctl.providers.stream_handler import StreamHandler
from loopctl.sessions import SQLiteSessionStore
from loopctl.testing import ScriptedClient, call, reply
from loopctl.timeouts import TIMEOUT_MAX, clamp
from loopctl.tools import Tool, ToolRegistry

SILENT = str(Path(__file__).resolve().parent / "mcp_servers" / "silent_server.py")
try:  # the [mcp] extra needs Python >= 3.10: without it, its rows and test are skipped
    from loopctl.contrib.mcp import MCPServer
    from loopctl.contrib.mcp.errors import MCPServerError

    HAS_MCP = True
except ImportError:
    HAS_MCP = False


def make_tool(**options: Any) -> Any:
    def f(a: int = 0) -> str:
        """F."""
        return "ok"

    return tool(**options)(f)


class Custom(Tool):
    """A ``Tool`` subclass whose timeouts are plain attributes (checked when registered)."""

    name = "custom"

    def __init__(self, approval_timeout: Any) -> None:
        self.approval_timeout = approval_timeout


CONFIGURED: list[tuple[str, Callable[[Any], Any]]] = [
    ("tool 'custom': approval_timeout", lambda v: ToolRegistry([Custom(v)])),
    ("RunConfig.approval_timeout", lambda v: RunConfig(approval_timeout=v)),
    ("approval_timeout", lambda v: make_tool(requires_approval=True, approval_timeout=v)),
    ("timeout", lambda v: make_tool(timeout=v)),
    ("timeout", lambda v: OpenAIClient("m", api_key="k", base_url="http://127.0.0.1:9", timeout=v)),
    ("timeout (read)", lambda v: AnthropicClient("m", api_key="k", base_url="http://127.0.0.1:9", timeout=(5, v))),
    ("StreamHandler.max_retry_wait", lambda v: StreamHandler(max_retry_wait=v)),
    ("StreamHandler.total_timeout", lambda v: StreamHandler(total_timeout=v)),
]
if HAS_MCP:
    CONFIGURED.append(
        ("MCPServer start_timeout", lambda v: MCPServer.stdio(sys.executable, [SILENT], start_timeout=v))
    )


def test_every_configured_timeout_refuses_infinity_and_nan_naming_field_and_value() -> None:
    for field, make in CONFIGURED:
        for bad in (math.inf, -math.inf, math.nan, -1.0):
            with pytest.raises(ValueError) as info:
                make(bad)
            assert field in str(info.value) and repr(bad) in str(info.value), (field, bad)


def test_every_configured_timeout_refuses_a_negative_past_the_float_range() -> None:
    # float() overflows on it: it must not be taken for "wait for ever" like its positive twin.
    for field, make in CONFIGURED:
        with pytest.raises(ValueError) as info:
            make(-(10**5000))
        assert field in str(info.value) and "-<int of 5001 digits>" in str(info.value), field
    assert clamp(-(10**5000)) == -(10**5000) and clamp(math.nan) is math.nan and clamp(math.inf) == math.inf
    assert clamp(10**5000) == TIMEOUT_MAX


def test_a_timeout_beyond_what_a_wait_can_take_is_clamped() -> None:
    assert RunConfig(approval_timeout=1e10).approval_timeout == threading.TIMEOUT_MAX
    assert make_tool(requires_approval=True, approval_timeout=10**400).approval_timeout == threading.TIMEOUT_MAX
    assert StreamHandler(max_retry_wait=1e12).max_retry_wait == threading.TIMEOUT_MAX
    assert RunConfig.from_dict(RunConfig(approval_timeout=1e10).to_dict()).approval_timeout == threading.TIMEOUT_MAX


def busy_timeout_ms(store: Any) -> int:
    """The busy wait SQLite applies on the store's own connection."""
    con = store._con if isinstance(store, SqliteMemoryStore) else store._sqlite._con
    return int(con.execute("PRAGMA busy_timeout").fetchone()[0])


@pytest.mark.parametrize("store", [SqliteMemoryStore, SQLiteSessionStore])
def test_a_sqlite_busy_timeout_beyond_what_sqlite_counts_is_clamped_not_wrapped_to_no_wait(
    tmp_path: Path, store: Any
) -> None:
    # SQLite counts the busy wait in milliseconds in a 32-bit int: past it, the wait wrapped to none.
    for i, timeout in enumerate((2.5, 1e7, TIMEOUT_MAX, 10**5000)):
        opened = store(tmp_path / f"{i}.db", timeout=timeout)
        try:
            assert busy_timeout_ms(opened) == (2500 if timeout == 2.5 else 2**31 - 1), timeout
        finally:
            opened.close()


class Asked(Observer):
    def __init__(self) -> None:
        self.asked = threading.Event()

    def on_approval_requested(self, event: ApprovalRequested) -> None:
        self.asked.set()


@pytest.mark.parametrize("where", ["tool", "run"])
def test_a_call_parked_with_a_huge_approval_timeout_waits_and_runs_without_overflow(where: str) -> None:
    pay = make_tool(requires_approval=True, approval_timeout=1e10 if where == "tool" else None)
    loop = BareLoop(ScriptedClient([call("f", a=1), reply("done")]), [pay])
    asked = Asked()
    loop.register_observer(asked)
    with loop:
        h = loop.start("go", RunConfig(approval_timeout=1e10) if where == "run" else None)
        assert asked.asked.wait(WAIT)
        assert h.approve(h.pending_approvals()[0].call_id) is True
        run = h.result(WAIT)
    assert run.output == "done" and [d.approved for d in run.approvals] == [True]


@pytest.mark.skipif(not HAS_MCP, reason="the [mcp] extra (Python >= 3.10) is not installed")
@pytest.mark.parametrize("mode", ["--deaf", "--reading"])
def test_an_mcp_server_that_never_answers_fails_at_its_start_timeout_and_prints_nothing(
    mode: str, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    server = MCPServer.stdio(sys.executable, [SILENT, mode], start_timeout=1.0)
    t0 = time.monotonic()
    try:
        with pytest.raises(MCPServerError) as info:
            server.connect()
        elapsed = time.monotonic() - t0
    finally:
        server.close()
    assert "silent_server.py" in str(info.value) and "no answer to initialize within 1s" in str(info.value)
    # The failure comes at the start timeout, not after the server process was stopped.
    assert 1.0 <= elapsed < 1.9
    gc.collect()  # an unretrieved future's complaint comes when it is collected
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == "", captured
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
