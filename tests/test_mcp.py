"""MCP servers as tools, against the suite's own server (tests/mcp_servers/suite_server.py).

The server runs as a real subprocess speaking MCP over stdio; loopctl's
side is ``loopctl.contrib.mcp`` on its ``loopctl-mcp-...`` thread. The
synchronisation points are lines the server writes to stderr, read through
the server's logger (``StderrLines``), never sleeps.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from mcp_servers.harness import SUITE, WAIT, StderrLines, suite_stdio  # noqa: E402
from support import Recorder  # noqa: E402

from loopctl import BareLoop, Cancelled, LoopError, ToolContext  # noqa: E402
from loopctl.cancel import CancelSignal  # noqa: E402
from loopctl.contrib.mcp import MCPServer, MCPServerError, MCPTool  # noqa: E402
from loopctl.demo.tools import AddTool  # noqa: E402
from loopctl.testing import ScriptedClient, call, calls, reply  # noqa: E402
from loopctl.text import redact  # noqa: E402

BOUND = 1.0  # every single cancel, generous under load; the median must meet the SPEC's 100 ms


@pytest.fixture(scope="module")
def suite() -> MCPServer:
    with suite_stdio() as server:
        yield server


def _ctx(cancel: CancelSignal, temp_dir: Path | None = None) -> ToolContext:
    return ToolContext("session", "run", 0, "call-1", temp_dir, cancel)


def _results(loop: BareLoop) -> list[tuple[str, str, bool]]:
    return [(r.tool_name, r.output, r.is_error) for m in loop.conversation() for r in m.tool_results]


def test_tools_carry_the_servers_names_descriptions_and_schemas(suite: MCPServer) -> None:
    tools = suite.tools()
    by_name = {t.name: t for t in tools}
    assert {"echo", "block", "crash", "fail", "image", "grow"} <= set(by_name)
    echo = by_name["echo"]
    assert isinstance(echo, MCPTool)
    schema = echo.schema()
    assert schema.description == "Echo the text back."
    assert schema.input_schema["type"] == "object"
    assert schema.input_schema["properties"]["text"]["type"] == "string"
    assert schema.input_schema["required"] == ["text"]


def test_a_prefix_renames_the_tools_but_calls_use_the_servers_names(suite: MCPServer) -> None:
    tools = {t.name: t for t in suite.tools(prefix="suite.")}
    assert "suite_echo" in tools  # "." is refused by model APIs: replaced by "_"
    assert tools["suite_echo"].remote_name == "echo"
    out = tools["suite_echo"].invoke({"text": "hi"}, _ctx(CancelSignal()))
    assert (out.text, out.is_error) == ("hi", False)


def test_bare_loop_runs_mcp_tools_next_to_local_ones(suite: MCPServer) -> None:
    client = ScriptedClient([calls(("echo", {"text": "from mcp"}), ("add", {"a": 2, "b": 3})), reply("done")])
    with BareLoop(client, [*suite.tools(), AddTool()]) as loop:
        run = loop.run("go")
        assert run.output == "done"
        assert _results(loop) == [("echo", "from mcp", False), ("add", "5", False)]
    advertised = {t.name for t in client.requests[0].tools}
    assert {"echo", "block", "add"} <= advertised


def test_invalid_input_is_a_soft_error_naming_the_field_before_any_call(suite: MCPServer) -> None:
    echo = next(t for t in suite.tools() if t.name == "echo")
    out = echo.invoke({"text": 5}, _ctx(CancelSignal()))
    assert out.is_error and "text" in out.text


def test_cancelling_a_run_cancels_the_mcp_call_fast_and_the_server_sees_it(suite: MCPServer) -> None:
    elapsed: list[float] = []
    with StderrLines(suite) as stderr:
        for i in range(5):
            tag = f"run{i}"
            client = ScriptedClient([call("block", tag=tag), reply("never")])
            with BareLoop(client, suite.tools()) as loop:
                handle = loop.start("block")
                stderr.wait_for(f"block started {tag}")
                t0 = time.monotonic()
                handle.cancel()
                with pytest.raises(Cancelled):
                    handle.result(WAIT)
                elapsed.append(time.monotonic() - t0)
            stderr.wait_for(f"block cancelled {tag}")  # the server got notifications/cancelled
            # The connection stays usable: the next call on it works.
            assert suite.call_tool("echo", {"text": f"after {tag}"}).text == f"after {tag}"
    assert max(elapsed) < BOUND, elapsed
    assert statistics.median(elapsed) <= 0.1, elapsed
    out = suite.call_tool("cancellations", {})
    assert all(f"run{i}" in out.text for i in range(5)), out.text


def test_a_cancel_returns_the_blocked_caller_within_100ms(suite: MCPServer) -> None:
    elapsed: list[float] = []
    with StderrLines(suite) as stderr:
        for i in range(5):
            cancel = CancelSignal()
            box: list[object] = []
            args = ("block", {"tag": f"direct{i}"}, _ctx(cancel))
            t = threading.Thread(target=lambda a=args, b=box: b.append(suite.call_tool(*a)))
            t.start()
            stderr.wait_for(f"block started direct{i}")
            t0 = time.monotonic()
            cancel.cancel("stop")
            t.join(WAIT)
            elapsed.append(time.monotonic() - t0)
            assert not t.is_alive()
            out = box[0]
            assert out.is_error and "cancelled" in out.text  # type: ignore[attr-defined]
            stderr.wait_for(f"block cancelled direct{i}")
    assert max(elapsed) < BOUND, elapsed
    assert statistics.median(elapsed) <= 0.1, elapsed


def test_a_tool_timeout_cancels_the_mcp_call_and_the_run_goes_on(suite: MCPServer) -> None:
    tools = suite.tools(timeout=0.3)
    assert all(t.timeout == 0.3 for t in tools)
    client = ScriptedClient([call("block", tag="slow"), reply("carried on")])
    with StderrLines(suite) as stderr, BareLoop(client, tools) as loop:
        run = loop.run("go")
        assert run.output == "carried on"
        [(name, output, is_error)] = _results(loop)
        assert (name, is_error) == ("block", True)
        assert "timed out after 0.3s" in output
        stderr.wait_for("block cancelled slow")
    assert suite.call_tool("echo", {"text": "still here"}).text == "still here"


def test_an_is_error_result_is_a_soft_error_and_the_run_continues(suite: MCPServer) -> None:
    client = ScriptedClient([call("fail", reason="disk full"), reply("ok")])
    with BareLoop(client, suite.tools()) as loop:
        assert loop.run("go").output == "ok"
        [(name, output, is_error)] = _results(loop)
    assert is_error and "failed on purpose: disk full" in output


def test_an_unknown_tool_name_is_a_soft_error_from_the_server(suite: MCPServer) -> None:
    out = suite.call_tool("no_such_tool", {})
    assert out.is_error and "no_such_tool" in out.text


def test_image_content_is_described_and_saved_to_the_calls_temp_dir(suite: MCPServer, tmp_path: Path) -> None:
    out = suite.call_tool("image", {}, _ctx(CancelSignal(), tmp_path))
    assert not out.is_error
    text, image = out.text.split("\n\n")
    assert text == "a red dot:"
    assert image.startswith("[image: image/png, 70 bytes, saved to ")
    saved = Path(image.split("saved to ", 1)[1].rstrip("]"))
    assert saved.parent == tmp_path and saved.read_bytes().startswith(b"\x89PNG")
    # Without a temp dir the image is only described.
    assert suite.call_tool("image", {}).text.endswith("[image: image/png, 70 bytes]")


def test_concurrent_calls_share_the_connection_and_each_gets_its_answer(suite: MCPServer) -> None:
    results: dict[int, str] = {}
    barrier = threading.Barrier(8)

    def worker(k: int) -> None:
        barrier.wait(WAIT)
        for j in range(10):
            out = suite.call_tool("echo", {"text": f"{k}-{j}"})
            results[k * 100 + j] = out.text

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert results == {k * 100 + j: f"{k}-{j}" for k in range(8) for j in range(10)}


def test_a_crash_mid_call_is_a_soft_error_and_the_next_call_restarts_the_server() -> None:
    with suite_stdio(name="crashy") as server:
        first_pid = server.call_tool("pid", {}).text
        client = ScriptedClient([call("crash"), call("pid"), reply("survived")])
        with BareLoop(client, server.tools()) as loop:
            assert loop.run("go").output == "survived"
            [(_, crashed, crash_err), (_, second_pid, pid_err)] = _results(loop)
        assert crash_err and "MCP server 'crashy'" in crashed and "crash" in crashed
        assert "'crashing'" in crashed  # its last stderr line
        assert not pid_err and second_pid.isdigit() and second_pid != first_pid


def test_restarts_are_bounded() -> None:
    with suite_stdio(name="crashy", max_restarts=1) as server:
        assert "closed the connection" in server.call_tool("crash", {}).text
        assert "closed the connection" in server.call_tool("crash", {}).text  # after restart 1
        out = server.call_tool("echo", {"text": "x"})
        assert out.is_error and "restarted 1 times" in out.text and "not restarting" in out.text


def test_a_list_change_is_picked_up_by_the_next_tools_call() -> None:
    with suite_stdio(name="growing") as server:
        before = {t.name for t in server.tools()}
        assert "late" not in before and not server.tools_changed
        assert server.call_tool("grow", {}).text == "grown"
        # The notification comes before the call's answer, on the same stream;
        # the SDK hands it to us on a task of its own, so wait for it (bounded).
        assert server.wait_tools_changed(WAIT) and server.tools_changed
        after = {t.name: t for t in server.tools()}
        assert set(after) == before | {"late"} and not server.tools_changed
        # Between runs: sync() registers what is new into a loop's registry.
        client = ScriptedClient([reply("first"), call("late"), reply("ok")])
        with BareLoop(client, [after["echo"]]) as loop:
            loop.run("go")
            assert "late" not in {t.name for t in client.requests[0].tools}
            assert server.sync(loop.tools) == [n for n in after if n != "echo"]
            assert server.sync(loop.tools) == []  # unchanged: nothing registered again
            loop.run("again")
            assert "late" in {t.name for t in client.requests[1].tools}
            assert _results(loop)[-1] == ("late", "late tool here", False)


def test_a_list_change_mid_run_is_picked_up_at_the_next_turn() -> None:
    """attach(): a tool the server adds during a run is callable at the run's next turn."""
    from loopctl.tools import ToolRegistry, tool

    with suite_stdio(name="growing-live") as server:

        @tool
        def grow_now() -> str:
            """Ask the server to add a tool, and wait until it has said so."""
            out = server.call_tool("grow", {}).text
            # The notification travels apart from the call's answer: the tool phase
            # ends only once it has landed, so the next turn sees it (no race).
            assert server.wait_tools_changed(WAIT)
            return out

        registry = ToolRegistry([grow_now])
        added = server.attach(registry)
        assert "late" not in added and "echo" in added
        client = ScriptedClient([call("grow_now"), call("late"), reply("done")])
        with BareLoop(client, registry) as loop:
            run = loop.run("grow, then use the new tool")
        assert run.output == "done"
        assert "late" not in {t.name for t in client.requests[0].tools}
        assert "late" in {t.name for t in client.requests[1].tools}
        assert _results(loop)[-1] == ("late", "late tool here", False)


def test_a_server_that_fails_to_start_raises_naming_the_command_and_stderr_tail() -> None:
    server = suite_stdio("--fail-start", env={"SUITE_API_KEY": "sk-very-secret"})
    with pytest.raises(MCPServerError) as info:
        with server:
            pass  # pragma: no cover
    err = info.value
    assert isinstance(err, LoopError)
    assert SUITE in str(err) and "--fail-start" in str(err)
    assert "boom: cannot open /nonexistent/suite.toml" in err.stderr_tail
    assert "boom: cannot open /nonexistent/suite.toml" in str(err)
    assert "sk-very-secret" not in str(err) and "sk-very-secret" not in repr(server.spec)
    assert server.is_closed  # __enter__ failed: nothing left running


ENV_SECRET = "suiteEnvTok3n9876"


def test_env_values_are_masked_in_the_start_error_its_stderr_tail_and_the_log() -> None:
    server = suite_stdio("--say-env", "SUITE_TOKEN", "--fail-start", env={"SUITE_TOKEN": ENV_SECRET})
    with StderrLines(server) as lines:
        with pytest.raises(MCPServerError) as info:
            with server:
                pass  # pragma: no cover
        logged = lines.wait_for("SUITE_TOKEN=")
    err = info.value
    assert "SUITE_TOKEN=<redacted>" in err.stderr_tail and "SUITE_TOKEN=<redacted>" in str(err)
    assert logged == "SUITE_TOKEN=<redacted>"
    for text in (str(err), repr(err), err.stderr_tail, *lines.lines):
        assert ENV_SECRET not in text


def test_an_env_value_the_stderr_tail_cuts_in_its_line_is_masked_whole() -> None:
    name = "SUITE_" + "T" * 488  # "NAME=value": the value straddles the tail's 500-character line
    server = suite_stdio("--say-env", name, "--fail-start", env={name: ENV_SECRET})
    with pytest.raises(MCPServerError) as info:
        with server:
            pass  # pragma: no cover
    err = info.value
    assert f"{name}=<redacted>" in err.stderr_tail
    assert ENV_SECRET[:6] not in err.stderr_tail and ENV_SECRET[:6] not in str(err)


def test_an_env_value_a_tool_returns_is_masked_in_events_and_the_run_record() -> None:
    recorder = Recorder()
    env = {"SUITE_TOKEN": ENV_SECRET, "PATH": os.environ["PATH"]}
    with suite_stdio(env=env) as server:
        client = ScriptedClient([call("env", name="SUITE_TOKEN"), reply("done")])
        with BareLoop(client, server.tools()) as loop:
            loop.register_observer(recorder)
            run = loop.run("which token?")
        assert _results(loop) == [("env", ENV_SECRET, False)]  # the model gets the tool's real answer
        shown = json.dumps(run.to_dict()) + json.dumps([e.to_dict() for e in recorder.snapshot()])
        assert ENV_SECRET not in shown and "<redacted>" in shown
        assert redact(os.environ["PATH"]) == os.environ["PATH"]  # what the SDK passes anyway: not a secret


def test_tools_on_a_server_that_never_starts_raises_and_calls_are_soft_errors() -> None:
    server = MCPServer.stdio("loopctl-no-such-command-xyz")
    try:
        with pytest.raises(MCPServerError, match="loopctl-no-such-command-xyz.*not found"):
            server.tools()
        out = server.call_tool("anything", {})
        assert out.is_error and "loopctl-no-such-command-xyz" in out.text
    finally:
        server.close()


def test_a_server_that_never_answers_initialize_fails_after_start_timeout() -> None:
    # A process that never reads its stdin: the initialize request gets no answer.
    server = MCPServer.stdio(sys.executable, ["-c", "import time; time.sleep(60)"], start_timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(MCPServerError, match="no answer to initialize within 0.5s"):
        server.connect()
    assert time.monotonic() - t0 < WAIT
    server.close()


def test_server_stderr_goes_to_its_logger_not_the_terminal(capfd: pytest.CaptureFixture[str]) -> None:
    with suite_stdio(name="noisy") as server, StderrLines(server) as stderr:
        server.call_tool("fail", {"reason": "noise"})
        stderr.wait_for("failed on purpose: noise")
    captured = capfd.readouterr()
    assert "failed on purpose" not in captured.err and "failed on purpose" not in captured.out


def test_close_is_idempotent_joins_its_thread_and_later_calls_are_soft_errors() -> None:
    server = suite_stdio(name="closing")
    server.connect()
    assert any(t.name == "loopctl-mcp-closing" for t in threading.enumerate())
    server.close()
    server.close()
    assert not any(t.name == "loopctl-mcp-closing" for t in threading.enumerate())
    out = server.call_tool("echo", {"text": "x"})
    assert out.is_error and "closed" in out.text
    with pytest.raises(MCPServerError, match="closed"):
        server.tools()


def test_bad_arguments_are_refused_when_building() -> None:
    with pytest.raises(ValueError, match="command"):
        MCPServer.stdio("")
    with pytest.raises(ValueError, match="sequence"):
        MCPServer.stdio("python", "-m x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="http"):
        MCPServer.http("ftp://example.com/mcp")


def test_a_server_dropped_without_close_stops_its_thread_when_collected() -> None:
    import gc

    server = suite_stdio(name="dropped")
    server.connect()
    [thread] = [t for t in threading.enumerate() if t.name == "loopctl-mcp-dropped"]
    del server
    gc.collect()
    thread.join(WAIT)
    assert not thread.is_alive()


def test_a_server_that_exits_between_calls_is_restarted_by_the_next_call_transparently() -> None:
    with suite_stdio(name="idle-exit") as server:
        first_pid = server.call_tool("pid", {}).text
        conn = server._conn  # noqa: SLF001 - to wait for the moment the exit is noticed
        assert conn is not None
        os.kill(int(first_pid), signal.SIGKILL)  # no call in flight
        assert conn.ended.wait(WAIT), "the connection never noticed the exit"
        out = server.call_tool("pid", {})
        assert not out.is_error and out.text.isdigit() and out.text != first_pid


@pytest.mark.slow
def test_many_calls_and_cancels_interleaved_on_one_connection(suite: MCPServer) -> None:
    """Echo calls from several threads while block calls are cancelled one after another."""
    stop = threading.Event()
    wrong: list[str] = []

    def chatter(k: int) -> None:
        j = 0
        while not stop.is_set():
            out = suite.call_tool("echo", {"text": f"{k}:{j}"})
            if out.text != f"{k}:{j}" or out.is_error:
                wrong.append(out.text)
            j += 1

    threads = [threading.Thread(target=chatter, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    try:
        with StderrLines(suite) as stderr:
            for i in range(20):
                cancel = CancelSignal()
                box: list[object] = []
                args = ("block", {"tag": f"stress{i}"}, _ctx(cancel))
                t = threading.Thread(target=lambda a=args, b=box: b.append(suite.call_tool(*a)))
                t.start()
                stderr.wait_for(f"block started stress{i}")
                cancel.cancel()
                t.join(WAIT)
                assert not t.is_alive() and "cancelled" in box[0].text  # type: ignore[attr-defined]
                stderr.wait_for(f"block cancelled stress{i}")
    finally:
        stop.set()
        for t in threads:
            t.join(WAIT)
    assert wrong == []
    out = suite.call_tool("cancellations", {})
    assert all(f"stress{i}" in out.text for i in range(20))
