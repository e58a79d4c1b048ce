"""Steering's bounds and its first moment.

Sealed guidance (the leftovers of ended runs that nobody took) counts
against the same caps as live guidance: any number of runs hold at most
``max_messages`` messages and ``max_bytes`` bytes, and accepted guidance is
never dropped: a push past a cap is refused instead. And a
run is steerable from the moment ``start()`` returns, in ``BareLoop`` and
``RunRegistry`` alike: guidance accepted then lands at the first boundary.
Windows are made exact with gates and Events; no sleeps.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import WAIT, Gate, gated

from loopctl import BareLoop, Message, Observer, RunRegistry, Steering
from loopctl.observers import RunStart
from loopctl.testing import ScriptedClient, call, reply
from loopctl.tools import Tool, ToolContext


class Work(Tool):
    """``work``: answers at once (gives the run a second boundary)."""

    name = "work"
    description = "Does some work."

    def call(self, input: Any, ctx: ToolContext) -> str:
        return "worked"


def _bytes(messages: Sequence[Message]) -> int:
    return sum(len(m.text.encode("utf-8")) for m in messages)


@pytest.fixture
def make_loop() -> Iterator[Callable[..., BareLoop]]:
    made: list[BareLoop] = []

    def make(client: ScriptedClient, tools: Sequence[Tool] = ()) -> BareLoop:
        loop = BareLoop(client, list(tools))
        made.append(loop)
        return loop

    yield make
    for loop in made:
        loop.close()


# -- sealed guidance counts against the caps ---------------------------------------------------


def _runs_leaving_leftovers(
    make_loop: Callable[..., BareLoop], batches: Sequence[Sequence[str]], caps: tuple[int, int]
) -> tuple[Steering, list[list[bool]], list[tuple[int, int]]]:
    """One run per batch; each batch is pushed during the run's final model call, so it is sealed."""
    gates = [Gate() for _ in batches]
    loop = make_loop(ScriptedClient([gated(g, reply("done")) for g in gates]))
    s = loop.steering()
    s.set_limits(*caps)
    answers: list[list[bool]] = []
    held: list[tuple[int, int]] = []
    for gate, batch in zip(gates, batches):
        handle = loop.start("hi")
        gate.wait_entered()
        answers.append([s.push(text) for text in batch])
        gate.open()
        handle.result(WAIT)
        held.append(s.held)
    return s, answers, held


def test_leftovers_nobody_took_are_kept_and_later_pushes_are_refused(
    make_loop: Callable[..., BareLoop],
) -> None:
    batches = [[f"run {r} guidance {i} " + "x" * 100 for i in range(5)] for r in range(3)]
    s, answers, held = _runs_leaving_leftovers(make_loop, batches, (5, 1000))
    assert answers == [[True] * 5, [False] * 5, [False] * 5]  # the first run's five fill the cap
    assert held == [(5, _bytes(Message.user(t) for t in batches[0]))] * 3
    # What was accepted is all there, in push order: nothing dropped to make room.
    assert [m.text for m in s.take_leftovers()] == batches[0]


def test_the_byte_cap_counts_sealed_guidance(make_loop: Callable[..., BareLoop]) -> None:
    batches = [[f"{r}a" + "a" * 398, f"{r}b" + "b" * 398, f"{r}c" + "c" * 398] for r in range(2)]
    s, answers, held = _runs_leaving_leftovers(make_loop, batches, (5, 1000))
    assert answers == [[True, True, False], [False, False, False]]
    assert held == [(2, 800)] * 2
    assert [m.text for m in s.take_leftovers()] == batches[0][:2]


def test_taking_the_leftovers_makes_room_again(make_loop: Callable[..., BareLoop]) -> None:
    first, second = Gate(), Gate()
    loop = make_loop(ScriptedClient([gated(first, reply("one")), gated(second, reply("two"))]))
    s = loop.steering()
    s.set_limits(max_messages=2, max_bytes=1000)
    handle = loop.start("hi")
    first.wait_entered()
    assert s.push("old 1") and s.push("old 2")
    assert s.push("old 3") is False  # at the cap: refused, nothing stored
    first.open()
    handle.result(WAIT)
    handle = loop.start("again")
    second.wait_entered()
    assert s.push("new 1") is False  # the sealed two still hold the cap
    assert [m.text for m in s.take_leftovers()] == ["old 1", "old 2"]
    assert s.push("new 1") and s.push("new 2")
    second.open()
    handle.result(WAIT)
    assert [m.text for m in s.take_leftovers()] == ["new 1", "new 2"]


def test_lowering_the_caps_keeps_what_is_held_and_refuses_pushes(make_loop: Callable[..., BareLoop]) -> None:
    first, second = Gate(), Gate()
    loop = make_loop(ScriptedClient([gated(first, reply("one")), gated(second, reply("two"))]))
    s = loop.steering()
    handle = loop.start("hi")
    first.wait_entered()
    assert all(s.push(f"g{i}") for i in range(4))
    first.open()
    handle.result(WAIT)
    s.set_limits(max_messages=2, max_bytes=1000)
    handle = loop.start("again")
    second.wait_entered()
    assert s.push("late") is False
    second.open()
    handle.result(WAIT)
    assert [m.text for m in s.take_leftovers()] == ["g0", "g1", "g2", "g3"]


# -- steerable from the moment start() returns ----------------------------------------------


class HoldRunStart(Observer):
    """Holds ``on_run_start`` (on the run's thread) until the test has steered."""

    def __init__(self) -> None:
        self.steered = threading.Event()

    def on_run_start(self, event: RunStart) -> None:
        assert self.steered.wait(WAIT), "the test never steered"


def _delivered(client: ScriptedClient, text: str) -> bool:
    return any(m.text == text for m in client.requests[-1].messages)


def test_a_push_while_the_run_thread_has_not_reached_its_first_step_is_accepted_and_delivered(
    make_loop: Callable[..., BareLoop],
) -> None:
    client = ScriptedClient([reply("done")])
    loop = make_loop(client)
    hold = HoldRunStart()
    loop.register_observer(hold)
    handle = loop.start("hi")
    accepted = loop.steering().push("right away")
    hold.steered.set()
    handle.result(WAIT)
    assert accepted
    assert [m.text for m in client.requests[0].messages] == ["hi", "right away"]
    assert loop.steering().take_all() == []


def test_200_pushes_right_after_start_are_all_accepted_and_delivered(
    make_loop: Callable[..., BareLoop],
) -> None:
    for i in range(200):
        gate = Gate()  # the run is still in flight when the push comes, wherever its thread is
        client = ScriptedClient([gated(gate, call("work")), reply("done")])
        loop = make_loop(client, [Work()])
        handle = loop.start("hi")
        assert loop.steering().push(f"guidance {i}"), f"iteration {i}: refused"
        gate.open()
        handle.result(WAIT)
        assert _delivered(client, f"guidance {i}"), f"iteration {i}: not delivered"
        assert loop.steering().take_all() == []
        loop.close()


def test_registry_steer_while_the_run_thread_has_not_reached_its_first_step_is_delivered() -> None:
    client = ScriptedClient([reply("done")])
    hold = HoldRunStart()
    with RunRegistry() as registry, BareLoop(client) as loop:
        loop.register_observer(hold)
        rid = registry.start(loop, "hi")
        accepted = registry.steer(rid, "right away")
        hold.steered.set()
        registry.result(rid, WAIT)
        assert accepted
        assert [m.text for m in client.requests[0].messages] == ["hi", "right away"]
        assert registry.leftovers(rid) == []


def test_200_registry_steers_right_after_start_are_all_accepted_and_delivered() -> None:
    with RunRegistry() as registry:
        for i in range(200):
            gate = Gate()
            client = ScriptedClient([gated(gate, call("work")), reply("done")])
            with BareLoop(client, [Work()]) as loop:
                rid = registry.start(loop, "hi")
                assert registry.steer(rid, f"guidance {i}"), f"iteration {i}: refused"
                gate.open()
                registry.result(rid, WAIT)
                assert _delivered(client, f"guidance {i}"), f"iteration {i}: not delivered"
                assert registry.leftovers(rid) == []


# -- the invariant, over any sequence of runs --------------------------------------------------


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(min_value=0, max_value=400)),
        st.tuples(st.sampled_from(["open", "drain", "close", "take"]), st.just(0)),
    ),
    max_size=120,
)


@settings(max_examples=200, deadline=None)
@given(OPS, st.integers(min_value=1, max_value=6), st.integers(min_value=1, max_value=1200))
def test_held_guidance_never_passes_the_caps_and_every_accepted_push_is_accounted_for(
    ops: list[tuple[str, int]], max_messages: int, max_bytes: int
) -> None:
    # The loop's side driven by hand, as a run's thread drives it: open at
    # launch, drain at boundaries, close and seal at the end.
    s = Steering(max_messages, max_bytes)
    accepted: list[str] = []
    delivered: list[str] = []
    taken: list[str] = []
    for n, (op, size) in enumerate(ops):
        if op == "push":
            text = f"{n:04d}" + "x" * size
            if s.push(text):
                accepted.append(text)
        elif op == "open":
            s._open_slot()
        elif op == "drain":
            delivered += [m.text for m in s._drain()]
        elif op == "close":
            s._close_and_seal()
        else:
            taken += [m.text for m in s.take_leftovers()]
        count, size_held = s.held
        assert count <= max_messages and size_held <= max_bytes
    rest = [m.text for m in s.take_all()]
    # Each accepted push was delivered, taken, or is still held: exactly once.
    outcomes = delivered + taken + rest
    assert sorted(outcomes) == sorted(accepted)
