"""Real third-party MCP servers from the package registry, as subprocesses, offline.

``mcp-server-time`` (time in a zone, conversion between zones) and
``mcp-server-git`` on a temporary repository, driven through
``loopctl.contrib.mcp`` and a ``BareLoop`` with a scripted model.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp")
pytest.importorskip("mcp_server_time")

from loopctl import BareLoop  # noqa: E402
from loopctl.contrib.mcp import MCPServer  # noqa: E402
from loopctl.demo.tools import AddTool  # noqa: E402
from loopctl.testing import ScriptedClient, call, reply  # noqa: E402


def _results(loop: BareLoop) -> list[tuple[str, str, bool]]:
    return [(r.tool_name, r.output, r.is_error) for m in loop.conversation() for r in m.tool_results]


def _time_server() -> MCPServer:
    return MCPServer.stdio(sys.executable, ["-m", "mcp_server_time", "--local-timezone", "Europe/Paris"])


def test_time_server_tells_the_time_in_a_zone_through_a_loop() -> None:
    with _time_server() as server:
        tools = server.tools(prefix="time_")
        assert {t.name for t in tools} == {"time_get_current_time", "time_convert_time"}
        assert all(t.read_only and t.concurrency_safe for t in tools)  # readOnlyHint
        client = ScriptedClient([call("time_get_current_time", timezone="Asia/Tokyo"), reply("told")])
        with BareLoop(client, [*tools, AddTool()]) as loop:
            assert loop.run("What time is it in Tokyo?").output == "told"
            [(name, output, is_error)] = _results(loop)
    assert (name, is_error) == ("time_get_current_time", False)
    data = json.loads(output)
    assert data["timezone"] == "Asia/Tokyo" and data["datetime"].endswith("+09:00")


def test_time_server_converts_between_zones_and_reports_bad_zones_softly() -> None:
    with _time_server() as server:
        out = server.call_tool("convert_time", {"source_timezone": "UTC", "time": "12:00",
                                                "target_timezone": "Asia/Tokyo"})
        assert not out.is_error
        data = json.loads(out.text)
        assert data["source"]["datetime"].endswith("T12:00:00+00:00")
        assert data["target"]["datetime"].endswith("T21:00:00+09:00")
        bad = server.call_tool("get_current_time", {"timezone": "Nowhere/Atlantis"})
        assert bad.is_error and "Nowhere/Atlantis" in bad.text


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")
    root = tmp_path / "repo"
    root.mkdir()

    def run(*args: str) -> None:
        subprocess.run([git, *args], cwd=root, check=True, capture_output=True)

    run("init", "-q", "-b", "main")
    run("config", "user.email", "test@example.com")
    run("config", "user.name", "Test")
    (root / "notes.txt").write_text("first\n")
    run("add", "notes.txt")
    run("commit", "-q", "-m", "first commit")
    (root / "notes.txt").write_text("first\nsecond\n")
    return root


def test_git_server_reads_a_temporary_repository(repo: Path) -> None:
    pytest.importorskip("mcp_server_git")
    with MCPServer.stdio(sys.executable, ["-m", "mcp_server_git", "--repository", str(repo)],
                         name="git") as server:
        names = {t.name for t in server.tools()}
        assert {"git_status", "git_log", "git_diff_unstaged"} <= names
        client = ScriptedClient([
            call("git_log", repo_path=str(repo)),
            call("git_diff_unstaged", repo_path=str(repo)),
            reply("reviewed"),
        ])
        with BareLoop(client, server.tools()) as loop:
            assert loop.run("review the repo").output == "reviewed"
            [(_, log, log_err), (_, diff, diff_err)] = _results(loop)
        assert not log_err and "first commit" in log
        assert not diff_err and "+second" in diff
        outside = server.call_tool("git_status", {"repo_path": "/"})
        assert outside.is_error  # confined to --repository: a soft error, the run would go on
