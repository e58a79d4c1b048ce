"""``loopctl.testing``: ScriptedClient, reply, call, calls (SPEC §8).

Used directly (``complete``/``stream``) and through a loop: every item kind,
``client.requests``, small streamed deltas that reassemble exactly, running
past the script, callables that block, and thread safety.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from support import Echo, Gate, gated

from loopctl import (
    BareLoop,
    Message,
    ModelError,
    ModelRequest,
    ModelResponse,
    Role,
    SessionConfig,
    StopReason,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    Usage,
)
from loopctl.providers.base import (
    MessageStart,
    MessageStop,
    PartDelta,
    StreamAccumulator,
)
from loopctl.testing import ScriptedClient, call, calls, reply

WAIT = 10.0


def req(text: str = "hi") -> ModelRequest:
    return ModelRequest((Message.user(text),))


def drain(stream: Any) -> list[Any]:
    return list(stream)


def assemble(events: list[Any]) -> ModelResponse:
    acc = StreamAccumulator()
    for ev in events:
        acc.feed(ev)
    return acc.build()


# -- the helpers -----------------------------------------------------------------------------


def test_reply_shapes() -> None:
    r = reply("hello")
    assert r.message.role == Role.ASSISTANT
    assert r.message.parts == (TextPart("hello"),)
    assert r.stop_reason is StopReason.END_TURN and r.usage is None
    t = reply("answer", thinking="reasoning", usage=Usage(10, 2))
    assert t.message.parts == (ThinkingPart("reasoning"), TextPart("answer"))
    assert t.message.text == "answer"  # thinking stays out of the text
    assert t.usage == Usage(10, 2)
    assert reply("").message.text == "" and reply("").message.tool_calls == []


def test_call_and_calls_shapes() -> None:
    one = call("search", query="tea", limit=3)
    assert one.stop_reason is StopReason.TOOL_CALL
    (c,) = one.message.tool_calls
    assert (c.name, dict(c.input)) == ("search", {"query": "tea", "limit": 3})
    many = calls(("a", {"x": 1}), ("b", {}), text="two at once")
    assert [(c.name, dict(c.input)) for c in many.message.tool_calls] == [("a", {"x": 1}), ("b", {})]
    assert many.message.text == "two at once"
    assert many.stop_reason is StopReason.TOOL_CALL
    ids = [c.id for c in many.message.tool_calls] + [c.id for c in call("z").message.tool_calls]
    ids += [c.id for c in call("z").message.tool_calls]
    assert len(set(ids)) == len(ids) and all(ids)


# -- complete() ----------------------------------------------------------------------------------


def test_complete_plays_items_in_order_and_records_requests() -> None:
    explicit = ModelResponse(Message.assistant("explicit"), StopReason.END_TURN, Usage(1, 1))
    seen: list[ModelRequest] = []

    def dynamic(request: ModelRequest) -> ModelResponse:
        seen.append(request)
        return reply(f"you said {request.messages[-1].text}")

    client = ScriptedClient([reply("first"), explicit, dynamic, call("tool", a=1)])
    requests = [req(f"r{i}") for i in range(4)]
    out = [client.complete(r) for r in requests]
    assert [o.message.text for o in out[:3]] == ["first", "explicit", "you said r2"]
    assert out[3].message.tool_calls[0].name == "tool"
    assert out[1].usage == Usage(1, 1)
    assert seen == [requests[2]]
    assert client.requests == requests
    assert client.remaining == 0
    assert all(o.model == "scripted" for o in out)


def test_exception_items_raise_and_are_recorded() -> None:
    boom = ModelError("rate limited", status=429, retryable=True)
    client = ScriptedClient([boom, ValueError("weird"), reply("after")])
    with pytest.raises(ModelError) as info:
        client.complete(req("a"))
    assert info.value is boom
    with pytest.raises(ValueError):
        client.complete(req("b"))
    assert client.complete(req("c")).message.text == "after"
    assert [r.messages[0].text for r in client.requests] == ["a", "b", "c"]


def test_running_past_the_script_names_the_request_count() -> None:
    client = ScriptedClient([reply("only one")])
    client.complete(req())
    with pytest.raises(ModelError) as info:
        client.complete(req())
    assert "request 2" in str(info.value) and "1 item" in str(info.value)
    with pytest.raises(ModelError) as again:
        drain(client.stream(req()))
    assert "request 3" in str(again.value)
    assert len(client.requests) == 3


def test_callable_returning_a_non_response_is_a_clear_error() -> None:
    client = ScriptedClient([lambda r: "just a string"])  # type: ignore[list-item,return-value]
    with pytest.raises(ModelError) as info:
        client.complete(req())
    msg = str(info.value)
    assert "item 1" in msg and "str" in msg


def test_model_name_and_set_model_and_explicit_response_model_kept() -> None:
    client = ScriptedClient(
        [reply("a"), ModelResponse(Message.assistant("b"), model="served-by-b")], model="tiny-1"
    )
    assert client.model == "tiny-1"
    assert client.complete(req()).model == "tiny-1"
    assert client.set_model("tiny-2") is True and client.model == "tiny-2"
    assert client.complete(req()).model == "served-by-b"


def test_extend_and_remaining() -> None:
    client = ScriptedClient()
    assert client.remaining == 0
    client.extend([reply("x"), reply("y")])
    assert client.remaining == 2
    client.complete(req())
    assert client.remaining == 1


# -- stream() ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "item",
    [
        reply("A fairly long answer that must arrive in several small pieces."),
        reply("with thoughts", thinking="first think, then answer", usage=Usage(30, 4)),
        calls(("search", {"q": "tea", "n": 2}), ("fetch", {}), text="looking"),
    ],
    ids=["text", "thinking", "tool_calls"],
)
def test_stream_reassembles_exactly_in_small_deltas(item: ModelResponse) -> None:
    client = ScriptedClient([item])
    events = drain(client.stream(req()))
    assert isinstance(events[0], MessageStart) and isinstance(events[-1], MessageStop)
    text_deltas = [e for e in events if isinstance(e, PartDelta) and e.kind == "text"]
    assert all(0 < len(d.text) <= 8 for d in text_deltas)
    if len(item.message.text) > 8:
        assert len(text_deltas) > 1
    got = assemble(events)
    assert got.message == item.message
    assert got.stop_reason == item.stop_reason
    assert got.usage == item.usage
    assert got.model == "scripted"


def test_stream_records_request_and_raises_scripted_exception_on_read() -> None:
    client = ScriptedClient([ModelError("stream refused", status=503)])
    stream = client.stream(req("s"))
    with pytest.raises(ModelError, match="stream refused"):
        drain(stream)
    assert [r.messages[0].text for r in client.requests] == ["s"]


def test_stream_close_stops_iteration() -> None:
    client = ScriptedClient([reply("x" * 200)])
    stream = client.stream(req())
    it = iter(stream)
    first = [next(it) for _ in range(3)]
    stream.close()
    rest = list(it)
    assert len(first) == 3 and rest == []


def test_a_callable_may_block_on_an_event_until_released() -> None:
    gate = Gate()
    client = ScriptedClient([gated(gate, reply("released"))])
    box: dict[str, Any] = {}
    t = threading.Thread(target=lambda: box.setdefault("r", client.complete(req())), name="test-caller")
    t.start()
    gate.wait_entered()
    assert "r" not in box and len(client.requests) == 1
    gate.open()
    t.join(WAIT)
    assert box["r"].message.text == "released"


def test_concurrent_callers_each_take_a_distinct_item() -> None:
    n = 200
    client = ScriptedClient([reply(f"item-{i}") for i in range(n)])
    barrier = threading.Barrier(8)
    got: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        barrier.wait(WAIT)
        for _ in range(n // 8):
            text = client.complete(req()).message.text
            with lock:
                got.append(text)

    threads = [threading.Thread(target=worker, name=f"test-w{i}") for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert sorted(got) == sorted(f"item-{i}" for i in range(n))
    assert len(client.requests) == n


# -- through a loop ---------------------------------------------------------------------------------


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "non_streaming"])
def test_through_a_loop_requests_carry_messages_system_and_tools(streaming: bool) -> None:
    client = ScriptedClient([call("echo", x=1), reply("done", thinking="hmm")])
    with BareLoop(client, [Echo()], SessionConfig(system_prompt="sys")) as loop:
        if not streaming:
            loop.set_turn_mode("non_streaming")
        run = loop.run("go")
    assert run.output == "done"
    assert [len(r.messages) for r in client.requests] == [1, 3]
    assert all(r.system == "sys" for r in client.requests)
    assert all([s.name for s in r.tools] == ["echo"] for r in client.requests)
    last = loop.conversation()[-1]
    assert last.parts == (ThinkingPart("hmm"), TextPart("done"))  # thinking kept in history
    assert isinstance(loop.conversation()[1].parts[0], ToolCallPart)


def test_through_a_loop_past_the_script_is_a_model_error() -> None:
    client = ScriptedClient([call("echo", x=1)])
    with BareLoop(client, [Echo()]) as loop:
        with pytest.raises(ModelError) as info:
            loop.run("needs two replies")
    assert "request 2" in str(info.value)
    assert info.value.run is not None


def test_scripted_errors_go_through_the_retry_rules() -> None:
    """Streaming through the default StreamHandler: retryable errors retry, others do not."""
    from loopctl.observers import AttemptReset, CallbackObserver

    seen: list[Any] = []
    retry = ScriptedClient([ModelError("flaky upstream", status=500, retryable=True), reply("after retry")])
    with BareLoop(retry).with_observer(CallbackObserver(seen.append)) as loop:
        assert loop.run("x").output == "after retry"
    assert len(retry.requests) == 2
    assert [e.attempt for e in seen if isinstance(e, AttemptReset)] == [1]

    final = ScriptedClient([ModelError("bad request", status=400, retryable=False), reply("never")])
    with BareLoop(final) as loop:
        with pytest.raises(ModelError, match="bad request"):
            loop.run("x")
    assert len(final.requests) == 1
