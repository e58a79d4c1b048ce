"""``loopctl run --mcp "COMMAND ARGS"``: an MCP server's tools join the demo agent."""

from __future__ import annotations

import io
import json
import shlex
import sys

import pytest

pytest.importorskip("mcp")
pytest.importorskip("mcp_server_time")

from mcp_servers.harness import SUITE  # noqa: E402

from loopctl.demo.cli import build_parser, main  # noqa: E402

TIME = f"{shlex.quote(sys.executable)} -m mcp_server_time"


def _main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdin=io.StringIO(""), stdout=out, stderr=err, env={})
    return code, out.getvalue(), err.getvalue()


def test_mcp_is_repeatable() -> None:
    args = build_parser().parse_args(["run", "--mcp", "a b", "--mcp", "c", "hi"])
    assert args.mcp == ["a b", "c"]
    assert build_parser().parse_args(["run", "hi"]).mcp == []


def test_offline_model_says_it_cannot_use_the_servers_tools() -> None:
    code, out, err = _main("run", "--json", "--mcp", TIME, "What time is it in Tokyo?")
    assert code == 0, (out, err)
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    [response] = [e for e in events if e["type"] == "response"]
    assert "I can't use the other tools I was given ('convert_time' and 'get_current_time')" in response["text"]


def test_the_servers_tools_are_offered_next_to_the_demo_tools() -> None:
    suite = f"{shlex.quote(sys.executable)} {shlex.quote(SUITE)}"
    code, out, err = _main("run", "--mcp", TIME, "--mcp", suite, "What is 2 + 3?")
    assert code == 0, (out, err)
    assert "5" in out  # the demo tools still work with MCP tools beside them


def test_ask_knows_the_servers_tools_once_they_started() -> None:
    code, out, err = _main("run", "--mcp", TIME, "--ask", "get_current_time", "--ask", "get_time", "What is 2 + 3?")
    assert code == 2 and out == "", err  # refused before any model call
    assert ("--ask: no tool named 'get_time' (the tools are add, convert_time, get_current_time, "
            "lookup, multiply; 'all' asks before every tool)") in err
    code, out, err = _main("run", "--mcp", TIME, "--ask", "get_current_time", "What is 2 + 3?")
    assert code == 0 and "5" in out, err


def test_a_server_that_fails_to_start_ends_the_command_with_its_stderr() -> None:
    bad = f"{shlex.quote(sys.executable)} {shlex.quote(SUITE)} --fail-start"
    code, out, err = _main("run", "--mcp", TIME, "--mcp", bad, "hi")
    assert code == 1
    assert "--fail-start" in err and "boom: cannot open /nonexistent/suite.toml" in err
