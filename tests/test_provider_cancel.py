"""Cancel on the wire: a read blocked on a socket returns, the connection is released.

Every scenario uses real sockets: the fake server stalls (no bytes at all,
or no more bytes) and a second thread cancels. The bounds asserted are the
contract's (returns promptly), with slack for a loaded machine; the leak
checks count the server's open connections and this process's descriptors.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable, Optional

from fakeserver import (
    FakeServer,
    Hang,
    Reply,
    Stall,
    Stream,
    anthropic_stream,
    oa_chunk,
    open_fds,
    openai_stream,
)

from loopctl import (
    BareLoop,
    Cancelled,
    CancelSignal,
    Message,
    ModelRequest,
    Observer,
    SessionConfig,
    Tool,
)
from loopctl.messages import ToolResultPart
from loopctl.providers import AnthropicClient, OpenAIClient, StreamHandler
from loopctl.providers.base import PartDelta
from loopctl.providers.stream_handler import cancellable_complete

BOUND = 1.0  # seconds; the contract is 100 ms, this leaves room for a loaded CI machine
REQ = ModelRequest([Message.user("hi")], "sys")


def oa(server: FakeServer) -> OpenAIClient:
    return OpenAIClient("gpt-test", api_key="sk-test-000000000000", base_url=server.openai_url)


class Reader(threading.Thread):
    """Runs ``fn`` on a test thread and keeps its outcome."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(name="test-reader", daemon=True)
        self.fn = fn
        self.error: Optional[BaseException] = None
        self.result: Any = None
        self.ended_at = 0.0

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            self.error = exc
        finally:
            self.ended_at = time.monotonic()


def consume(events: Any) -> list[Any]:
    return list(events)


def _in_recv(frame: Any) -> bool:
    while frame is not None:
        code = frame.f_code
        if code.co_name in ("readinto", "recv_into", "readline") and code.co_filename.endswith(("socket.py", "client.py")):
            return True
        frame = frame.f_back
    return False


def wait_blocked_in_recv(match: Callable[[threading.Thread], bool], timeout: float = 5.0) -> bool:
    """Block until a thread matching ``match`` sits in a socket read (polls its frame)."""
    deadline = time.monotonic() + timeout
    tick = threading.Event()
    while time.monotonic() < deadline:
        frames = sys._current_frames()
        for t in threading.enumerate():
            if match(t) and t.ident in frames and _in_recv(frames[t.ident]):
                return True
        tick.wait(0.002)
    return False


def start_blocked(server: FakeServer, fn: Callable[[], Any], stalls: int = 1) -> Reader:
    """Run ``fn`` on a ``Reader`` and return once it is stuck: the server has
    reached its ``stalls``-th stall and the reader sits in a socket read."""
    reader = Reader(fn)
    reader.start()
    assert server.wait_stalls(stalls), "the server never reached the stall"
    assert wait_blocked_in_recv(lambda t: t is reader), "the reader never blocked on its socket"
    return reader


def test_close_from_another_thread_unblocks_a_stalled_stream_50_times_without_leaks(server: FakeServer) -> None:
    c = oa(server)
    handler = StreamHandler(base_delay=0.01, jitter=0.0)
    # One warm-up so the baseline counts the session's pool and descriptors.
    server.push(Stream(openai_stream("warm")))
    consume(handler.stream_turn(c, REQ, CancelSignal()))
    fds_before = open_fds()
    latencies = []
    for i in range(50):
        server.push(Stream([oa_chunk({"content": f"part {i}"}), Stall()]))
        cancel = CancelSignal()
        turn = handler.stream_turn(c, REQ, cancel)
        cancel.add_listener(turn.close)
        reader = start_blocked(server, lambda turn=turn: consume(turn), stalls=i + 1)  # type: ignore[misc]
        t0 = time.monotonic()
        cancel.cancel("test")
        reader.join(BOUND)
        assert not reader.is_alive(), f"repetition {i}: the blocked read did not return"
        latencies.append(reader.ended_at - t0)
        assert isinstance(reader.error, Cancelled)
    assert max(latencies) < BOUND
    # Every cancelled connection was closed: the server sees them all go away...
    assert server.wait_open_at_most(0), f"{server.open_connections} connections still open"
    # ...and this process holds no more descriptors than before.
    assert open_fds() <= fds_before + 1
    assert server.total_connections >= 50


def test_close_while_waiting_for_response_headers(server: FakeServer) -> None:
    server.push(Hang())
    stream = oa(server).stream(REQ)
    reader = start_blocked(server, lambda: consume(stream))
    t0 = time.monotonic()
    stream.close()
    reader.join(BOUND)
    assert not reader.is_alive()
    assert reader.ended_at - t0 < BOUND
    assert reader.error is None and reader.result == []  # a closed stream just ends
    assert server.wait_open_at_most(0)


def test_close_while_the_consumer_is_between_events_releases_the_connection(server: FakeServer) -> None:
    server.push(Stream([oa_chunk({"content": "one"}), oa_chunk({"content": "two"}), Stall()]))
    stream = oa(server).stream(REQ)
    it = iter(stream)
    first = [next(it) for _ in range(3)]  # MessageStart, PartStart, PartDelta
    assert isinstance(first[-1], PartDelta)
    stream.close()  # the reader is suspended, not reading: close releases here
    assert server.wait_open_at_most(0)
    assert list(it) == []  # and the iterator ends


def test_cancel_during_backoff_wakes_the_sleep_at_once(server: FakeServer) -> None:
    server.push(Reply(502, {"error": {"message": "bad gateway"}}))
    sleeping = threading.Event()
    cancel = CancelSignal()

    class Watched:
        reason = None

        def is_cancelled(self) -> bool:
            return cancel.is_cancelled()

        def wait(self, t: Optional[float] = None) -> bool:
            sleeping.set()
            return cancel.wait(t)

        def add_listener(self, fn: Any) -> None:
            cancel.add_listener(fn)

        def remove_listener(self, fn: Any) -> None:
            cancel.remove_listener(fn)

    handler = StreamHandler(base_delay=30.0, max_delay=30.0, jitter=0.0)
    turn = handler.stream_turn(oa(server), REQ, Watched())
    reader = Reader(lambda: consume(turn))
    reader.start()
    assert sleeping.wait(5.0)
    t0 = time.monotonic()
    cancel.cancel()
    reader.join(BOUND)
    assert not reader.is_alive() and reader.ended_at - t0 < BOUND
    assert isinstance(reader.error, Cancelled)
    assert len(server.requests) == 1


def test_cancel_during_the_non_streaming_rescue(server: FakeServer) -> None:
    server.push(Stream([oa_chunk({"content": "x"}), Stall()]), Hang())
    cancel = CancelSignal()
    handler = StreamHandler(event_timeout=0.1, max_retries=0, jitter=0.0)
    turn = handler.stream_turn(oa(server), REQ, cancel)
    cancel.add_listener(turn.close)
    reader = start_blocked(server, lambda: consume(turn), stalls=2)  # stalled, timed out, the rescue hangs
    t0 = time.monotonic()
    cancel.cancel()
    reader.join(BOUND)
    assert not reader.is_alive() and reader.ended_at - t0 < BOUND
    assert isinstance(reader.error, Cancelled)
    assert server.wait_open_at_most(0)


def test_cancellable_complete_returns_cancelled_from_a_hung_call(server: FakeServer) -> None:
    server.push(Hang())
    cancel = CancelSignal()
    reader = start_blocked(server, lambda: cancellable_complete(oa(server), REQ, cancel))
    t0 = time.monotonic()
    cancel.cancel()
    reader.join(BOUND)
    assert not reader.is_alive() and reader.ended_at - t0 < BOUND
    assert isinstance(reader.error, Cancelled)


# -- end to end through BareLoop ------------------------------------------------------


class Lookup(Tool):
    name = "lookup"
    description = "Look a key up."

    def input_schema(self) -> dict[str, Any]:
        return {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}

    def call(self, input: Any, ctx: Any) -> str:
        return f"value-of-{input['key']}"


lookup = Lookup()


class Recorder(Observer):
    def __init__(self) -> None:
        self.text: list[str] = []
        self.resets: list[int] = []

    def on_text_delta(self, event: Any) -> None:
        self.text.append(event.delta if hasattr(event, "delta") else event.text)

    def on_attempt_reset(self, event: Any) -> None:
        self.resets.append(event.attempt)


def test_bare_loop_over_openai_runs_a_tool_turn_then_answers(server: FakeServer) -> None:
    server.push(
        Stream(openai_stream(tool_calls=[("call_7", "lookup", '{"key": "alpha"}')], piece=3)),
        Stream(openai_stream("The value is value-of-alpha.")),
    )
    rec = Recorder()
    loop = BareLoop(oa(server), [lookup], SessionConfig(system_prompt="Use tools."))
    loop.register_observer(rec)
    with loop:
        run = loop.run("What is alpha?")
    assert run.output == "The value is value-of-alpha."
    assert run.turn_count == 2
    assert "".join(rec.text) == "The value is value-of-alpha."
    second = server.requests[1].json
    assert second["messages"][0] == {"role": "system", "content": "Use tools."}
    assert {"role": "tool", "tool_call_id": "call_7", "content": "value-of-alpha"} in second["messages"]
    assert second["tools"][0]["function"]["name"] == "lookup"
    assert run.turns[0].input_tokens == 11


def test_bare_loop_over_anthropic_runs_a_tool_turn_then_answers(server: FakeServer) -> None:
    server.push(
        Stream(anthropic_stream(tool_calls=[("toolu_1", "lookup", '{"key": "beta"}')])),
        Stream(anthropic_stream("Beta is value-of-beta.")),
    )
    client = AnthropicClient("claude-test", api_key="sk-ant-x-000000000000", base_url=server.url)
    with BareLoop(client, [lookup]) as loop:
        run = loop.run("What is beta?")
    assert run.output == "Beta is value-of-beta."
    results = server.requests[1].json["messages"][-1]["content"]
    assert results == [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "value-of-beta"}]


def test_bare_loop_retries_a_502_and_observers_see_the_reset(server: FakeServer) -> None:
    server.push(Reply(502, {"error": {"message": "bad gateway"}}), Stream(openai_stream("fine")))
    rec = Recorder()
    loop = BareLoop(oa(server))
    loop.set_stream_handler(StreamHandler(base_delay=0.01, jitter=0.0))
    loop.register_observer(rec)
    with loop:
        assert loop.run("hi").output == "fine"
    assert rec.resets == [1]


def test_loop_cancel_of_a_stalled_stream_returns_cancelled_quickly(server: FakeServer) -> None:
    for n in range(1, 6):
        server.push(Stream([oa_chunk({"content": "thinking..."}), Stall()]))
        loop = BareLoop(oa(server))
        outcome: list[Any] = []

        def go(loop: BareLoop = loop, outcome: list[Any] = outcome) -> None:
            try:
                outcome.append(loop.run("hi"))
            except BaseException as exc:  # noqa: BLE001
                outcome.append(exc)

        t = threading.Thread(target=go, name="test-runner", daemon=True)
        t.start()
        assert server.wait_stalls(n)
        assert wait_blocked_in_recv(lambda th: th.name.startswith("loopctl-run-"))
        t0 = time.monotonic()
        loop.cancel("user pressed stop")
        t.join(BOUND)
        assert not t.is_alive(), "run() did not return after cancel"
        assert time.monotonic() - t0 < BOUND
        assert isinstance(outcome[0], Cancelled)
        loop.close()
    assert server.wait_open_at_most(0)


def test_tool_result_message_shape_reaches_the_wire(server: FakeServer) -> None:
    # A failed tool result travels as text for OpenAI (no is_error field there).
    server.push(Stream(openai_stream("ok")))
    msgs = [Message.user("x"), Message.assistant("", []),
            Message.from_tool_results([ToolResultPart("c1", "t", "Error: boom", True)])]
    consume(StreamHandler().stream_turn(oa(server), ModelRequest(msgs), CancelSignal()))
    assert server.requests[0].json["messages"][-1] == {"role": "tool", "tool_call_id": "c1", "content": "Error: boom"}
