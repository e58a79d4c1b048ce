"""Overhead of one MCP tool call through ``loopctl.contrib.mcp`` vs the SDK's async client.

The same server (the suite's ``tests/mcp_servers/suite_server.py`` over
stdio, tool ``echo``) is called N times per round:

- SDK:     ``await session.call_tool("echo", ...)`` on the SDK's own
           ``ClientSession`` inside ``asyncio.run`` (the floor: what an
           asyncio app pays);
- loopctl: ``MCPTool.invoke(input, ctx)`` from a plain thread — what the
           dispatcher does: schema validation, hand-off to the server's
           ``loopctl-mcp-...`` thread, a cancel-aware wait, the result as text.

Rounds alternate (SDK, loopctl, SDK, loopctl) so machine load falls on
both alike; the p50 of each over all rounds is reported, with the
difference (the cost of the thread hand-off) in prose. A second figure is
cancel latency: from ``ctx.cancel.cancel()`` to ``invoke`` returning on a
call the server blocks on, against the bare ``Event`` hand-off. Needs the
``mcp`` extra. Run from the repo root; < 60 s (``--smoke``: one round of 10 calls,
5 cancels).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from run_all import report as result_line  # noqa: E402
from run_all import smoke_requested  # noqa: E402

from loopctl.cancel import CancelSignal  # noqa: E402
from loopctl.tools.base import ToolContext  # noqa: E402

try:
    from loopctl.contrib.mcp import MCPServer
except ImportError:  # the [mcp] extra is missing: main() says so (importing must still work)
    MCPServer = None  # type: ignore[assignment,misc]

SERVER = str(Path(__file__).resolve().parent.parent / "tests" / "mcp_servers" / "suite_server.py")
ROUNDS, CALLS, WARMUP, CANCELS = 4, 150, 20, 40
SMOKE = (1, 10, 3, 5)  # the same with --smoke


async def sdk_round(n: int) -> list[float]:
    from mcp import ClientSession, StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable, args=[SERVER])
    out: list[float] = []
    with open(os.devnull, "w") as devnull:
        async with stdio_client(params, errlog=devnull) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            for i in range(WARMUP + n):
                t0 = time.perf_counter()
                await session.call_tool("echo", {"text": "x"})
                if i >= WARMUP:
                    out.append(time.perf_counter() - t0)
    return out


def loopctl_round(server: MCPServer, n: int) -> list[float]:
    [echo] = [t for t in server.tools() if t.name == "echo"]
    ctx = ToolContext("s", "r", 0, "c", None, CancelSignal())
    out: list[float] = []
    for i in range(WARMUP + n):
        t0 = time.perf_counter()
        result = echo.invoke({"text": "x"}, ctx)
        if i >= WARMUP:
            out.append(time.perf_counter() - t0)
        assert result.text == "x", result
    return out


def cancel_latencies(server: MCPServer) -> list[float]:
    [block] = [t for t in server.tools() if t.name == "block"]
    [wait_block] = [t for t in server.tools() if t.name == "wait_block"]
    out: list[float] = []
    for i in range(CANCELS):
        cancel = CancelSignal()
        ctx = ToolContext("s", "r", 0, f"c{i}", None, cancel)
        done = threading.Event()
        thread = threading.Thread(target=lambda c=ctx, d=done, tag=f"b{i}": (block.invoke({"tag": tag}, c), d.set()))
        thread.start()
        wait_block.invoke({"tag": f"b{i}"}, ToolContext("s", "r", 0, "w", None, CancelSignal()))
        t0 = time.perf_counter()
        cancel.cancel()
        done.wait(10)
        out.append(time.perf_counter() - t0)
        thread.join(10)
    return out


def event_handoff(n: int) -> list[float]:
    out: list[float] = []
    for _ in range(n):
        ev, back = threading.Event(), threading.Event()
        t = threading.Thread(target=lambda e=ev, b=back: (e.wait(), b.set()))
        t.start()
        t0 = time.perf_counter()
        ev.set()
        back.wait()
        out.append(time.perf_counter() - t0)
        t.join()
    return out


def main(argv: Optional[Sequence[str]] = None) -> None:
    global ROUNDS, CALLS, WARMUP, CANCELS
    if smoke_requested(__doc__.splitlines()[0], argv):
        ROUNDS, CALLS, WARMUP, CANCELS = SMOKE
    if MCPServer is None:
        print("skipped: needs the [mcp] extra (pip install 'loopctl[mcp]', Python >= 3.10)")
        return
    sdk: list[float] = []
    ours: list[float] = []
    with MCPServer.stdio(sys.executable, [SERVER], name="bench") as server:
        for _ in range(ROUNDS):
            sdk += asyncio.run(sdk_round(CALLS))
            ours += loopctl_round(server, CALLS)
        cancels = cancel_latencies(server)
    floor = event_handoff(CANCELS)
    p50_sdk, p50_ours = statistics.median(sdk), statistics.median(ours)
    print(f"one MCP call (echo over stdio), {len(sdk)} calls each, p50:")
    print(f"  SDK async client        {p50_sdk * 1e6:8.0f} us")
    print(f"  loopctl (sync, invoke)  {p50_ours * 1e6:8.0f} us   overhead {(p50_ours - p50_sdk) * 1e6:+.0f} us")
    print(f"cancel -> invoke returns, {len(cancels)} cancels: p50 {statistics.median(cancels) * 1e3:.2f} ms, "
          f"max {max(cancels) * 1e3:.2f} ms (bound 100 ms)")
    result_line("mcp call p50, loopctl sync vs SDK async client", p50_ours * 1e6, p50_sdk * 1e6, unit="us")
    result_line("mcp cancel p50, loopctl vs bare Event hand-off", statistics.median(cancels) * 1e6,
                statistics.median(floor) * 1e6, unit="us")


if __name__ == "__main__":
    main()
