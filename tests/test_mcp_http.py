"""Streamable HTTP: the suite's own server under uvicorn on 127.0.0.1 (a subprocess)."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("mcp")
pytest.importorskip("uvicorn")

from mcp_servers.harness import WAIT, http_suite_server  # noqa: E402
from support import Recorder, error_chain  # noqa: E402

from loopctl import BareLoop, Cancelled  # noqa: E402
from loopctl.contrib.mcp import MCPServer, MCPServerError  # noqa: E402
from loopctl.testing import ScriptedClient, call, calls, reply  # noqa: E402


def test_http_server_tools_calls_and_cancel() -> None:
    with http_suite_server() as url, MCPServer.http(
        url, headers={"Authorization": "Bearer sk-http-secret"}, name="suite-http"
    ) as server:
        tools = server.tools(prefix="s_")
        assert "s_echo" in {t.name for t in tools}
        client = ScriptedClient([call("s_echo", text="over http"), reply("done")])
        with BareLoop(client, tools) as loop:
            assert loop.run("go").output == "done"
            [result] = [r for m in loop.conversation() for r in m.tool_results]
        assert (result.output, result.is_error) == ("over http", False)

        # Cancel a call in flight: the caller returns fast, the server sees the
        # cancellation, and the connection serves the next call.
        for i in range(3):
            tag = f"h{i}"
            client = ScriptedClient([call("s_block", tag=tag), reply("never")])
            with BareLoop(client, tools) as loop:
                handle = loop.start("block")
                assert server.call_tool("wait_block", {"tag": tag}).text == "started"
                t0 = time.monotonic()
                handle.cancel()
                with pytest.raises(Cancelled):
                    handle.result(WAIT)
                assert time.monotonic() - t0 < 1.0
            out = server.call_tool("wait_block", {"tag": tag, "cancelled": True})
            assert out.text == "cancelled", out.text
        assert server.call_tool("echo", {"text": "after"}).text == "after"


def test_http_server_that_is_not_there_fails_without_leaking_headers() -> None:
    server = MCPServer.http("http://user:pw@127.0.0.1:9/mcp?token=q-secret",
                            headers={"Authorization": "Bearer sk-http-secret"}, start_timeout=5)
    with pytest.raises(MCPServerError) as info:
        server.connect()
    server.close()
    assert "127.0.0.1:9/mcp" in str(info.value)
    text = "\n".join(f"{e!r} {e}" for e in error_chain(info.value))  # exception groups included
    for secret in ("sk-http-secret", "q-secret", "pw@"):
        assert secret not in text and secret not in repr(server) and secret not in repr(server.spec)


def test_an_http_server_that_dies_mid_call_gives_soft_errors_naming_it() -> None:
    with http_suite_server() as url, MCPServer.http(url, name="dying") as server:
        out = server.call_tool("crash", {})
        assert out.is_error and "MCP server 'dying'" in out.text and "crash" in out.text
        # The next call tries to reconnect; nobody listens any more: a soft error naming the URL.
        again = server.call_tool("echo", {"text": "x"})
        assert again.is_error and url in again.text


TEAM_TOKEN = "teamHdrValue5151"
AUTH_TOKEN = "mcpHdrTok3n4242"


def test_header_values_a_tool_returns_are_masked_in_events_and_the_run_record() -> None:
    headers = {"X-Team": TEAM_TOKEN, "Authorization": f"Token {AUTH_TOKEN}"}
    recorder = Recorder()
    with http_suite_server() as url, MCPServer.http(url, headers=headers, name="suite-http") as server:
        client = ScriptedClient([calls(("header", {"name": "x-team"}), ("header", {"name": "authorization"}),
                                       ("header", {"name": "authorization", "credentials_only": True})),
                                 reply("done")])
        with BareLoop(client, server.tools()) as loop:
            loop.register_observer(recorder)
            run = loop.run("which headers?")
        outputs = [r.output for m in loop.conversation() for r in m.tool_results]
    assert outputs == [TEAM_TOKEN, f"Token {AUTH_TOKEN}", AUTH_TOKEN]  # the server really echoed them
    shown = json.dumps(run.to_dict()) + json.dumps([e.to_dict() for e in recorder.snapshot()])
    assert TEAM_TOKEN not in shown and AUTH_TOKEN not in shown and "<redacted>" in shown
