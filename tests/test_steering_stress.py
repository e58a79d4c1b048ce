"""Steering under contention: 4 threads x 500 pushes racing a run of many turns and its end.

Each repeat is seeded. The run has 20-60 tool turns; some repeats end it with
a cancel or a model failure at a seeded turn. Each pusher splits its 500
uniquely named messages into chunks and waits, before each chunk, for a
seeded point of the run (its start, the start of turn t, its end), so the
pushes race the slot's opening, every boundary, the final model call and
``finalize``. What must hold every time, whatever the interleaving:

- every accepted message is delivered exactly once (an ``on_steering``
  event; for a successful run also in history and the final request, in the
  same order) or handed back exactly once by ``take_leftovers``; none lost,
  none duplicated; nothing stays live after the run;
- per-thread push order is preserved across delivered-then-sealed;
- each thread's answers read refused*, accepted*, refused* (one open, one close);
- every refused push stored nothing: its text appears nowhere;
- the next run delivers none of the sealed messages.
"""

from __future__ import annotations

import random
import sys
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from loopctl import BareLoop, Cancelled, LoopError, Message, ModelError, Observer
from loopctl.observers import RunEnd, SteeringDelivered, TurnStart
from loopctl.testing import ScriptedClient, call, reply
from loopctl.tools import Tool, ToolContext

THREADS = 4
PUSHES = 500
REPEATS = 50
WAIT = 20.0


class Echo(Tool):
    """Answers at once; distinct inputs keep the loop detector quiet."""

    name = "work"
    description = "Echoes its step number."

    def call(self, input: Any, ctx: ToolContext) -> str:
        return f"step {input.get('n')}"


class Pacer(Observer):
    """Turns the run's progress into Events the pushers wait on; records deliveries."""

    def __init__(self, turns: int) -> None:
        self.turn_started = [threading.Event() for _ in range(turns + 1)]
        self.ended = threading.Event()
        self.delivered: list[str] = []
        self.delivery_turns: list[int] = []

    def on_turn_start(self, event: TurnStart) -> None:
        if event.turn < len(self.turn_started):
            self.turn_started[event.turn].set()

    def on_steering(self, event: SteeringDelivered) -> None:
        self.delivered.extend(m.text for m in event.messages)
        self.delivery_turns.append(event.turn)

    def on_run_end(self, event: RunEnd) -> None:
        self.ended.set()
        for e in self.turn_started:  # nobody waits for a turn that will never come
            e.set()

    def wait_for(self, point: int) -> None:
        """-1: no wait; 0..turns: the start of that turn; turns+1: the run's end."""
        if point < 0:
            return
        if point >= len(self.turn_started):
            assert self.ended.wait(WAIT)
        else:
            assert self.turn_started[point].wait(WAIT)


def _steering_texts(messages: Sequence[Message]) -> list[str]:
    return [m.text for m in messages if m.text.startswith("t") and "-" in m.text]


def _is_refused_accepted_refused(answers: Sequence[bool]) -> bool:
    phase = 0  # 0: before open, 1: open, 2: after close
    for ok in answers:
        if phase == 0 and ok:
            phase = 1
        elif phase == 1 and not ok:
            phase = 2
        elif phase == 2 and ok:
            return False
    return True


@pytest.fixture
def fine_switching() -> Iterator[None]:
    """Switch threads often so pushes interleave with the run at fine grain."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(2e-5)
    yield
    sys.setswitchinterval(old)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(REPEATS))
def test_every_accepted_push_is_delivered_or_returned_exactly_once(
    seed: int, fine_switching: None
) -> None:
    rng = random.Random(seed)
    turns = rng.randint(20, 60)
    ending = ("success", "success", "success", "cancel", "failure")[seed % 5]
    stop_at = rng.randint(1, turns)
    script: list[Any] = [call("work", n=i) for i in range(turns)] + [reply("done")]
    if ending == "failure":
        script[stop_at] = ModelError("scripted failure", retryable=False)
    client = ScriptedClient(script)
    loop = BareLoop(client, [Echo()])
    pacer = Pacer(turns)
    loop.register_observer(pacer)
    steering = loop.steering()

    # Each thread: 500 messages in seeded chunks, each chunk after a seeded wait point.
    plans: list[list[tuple[int, list[str]]]] = []
    for t in range(THREADS):
        texts = [f"t{t}-{n:03d}" for n in range(PUSHES)]
        cuts = sorted(rng.sample(range(1, PUSHES), rng.randint(2, 9)))
        chunks = [texts[a:b] for a, b in zip([0, *cuts], [*cuts, PUSHES])]
        points = sorted(rng.choice([-1, *range(turns + 1), turns, turns + 1]) for _ in chunks)
        plans.append(list(zip(points, chunks)))
    answers: list[list[tuple[str, bool]]] = [[] for _ in range(THREADS)]
    go = threading.Barrier(THREADS + 1)

    def pusher(t: int) -> None:
        go.wait(WAIT)
        out = answers[t]
        for point, chunk in plans[t]:
            pacer.wait_for(point)
            for text in chunk:
                out.append((text, steering.push(text)))

    threads = [threading.Thread(target=pusher, args=(t,), name=f"pusher-{t}") for t in range(THREADS)]
    for th in threads:
        th.start()
    go.wait(WAIT)
    handle = loop.start("go")
    canceller = None
    if ending == "cancel":

        def cancel_at_turn() -> None:
            pacer.wait_for(stop_at)
            handle.cancel("stress")  # a no-op if the run already ended

        canceller = threading.Thread(target=cancel_at_turn, name="canceller")
        canceller.start()
    try:
        finished = handle.wait(WAIT)
        for th in threads:
            th.join(WAIT)
        if canceller is not None:
            canceller.join(WAIT)
        assert finished and not any(th.is_alive() for th in threads)
        try:
            handle.result(0)
            outcome = "success"
        except Cancelled:
            outcome = "cancel"
        except LoopError:
            outcome = "failure"
        if ending == "success":
            assert outcome == "success"
        else:
            # A cancel aimed at the final turn may lose the race with the run's end.
            assert outcome in (ending, "success")

        # The slot is closed now: refused, and nothing is live.
        assert steering.push("t9-late") is False
        history_after_run = _steering_texts(loop.machine.history)
        last_request = _steering_texts(client.requests[-1].messages)

        # The next run never delivers the sealed pocket.
        client.extend([reply("next")])
        loop.run("next")
        next_request = _steering_texts(client.requests[-1].messages)
        assert next_request == history_after_run

        leftovers = [m.text for m in steering.take_leftovers()]
        assert steering.take_all() == []
    finally:
        loop.close()

    delivered = pacer.delivered
    accepted = [[text for text, ok in answers[t] if ok] for t in range(THREADS)]
    refused = {text for t in range(THREADS) for text, ok in answers[t] if not ok}
    everything = [text for t in range(THREADS) for text in accepted[t]]

    # Exactly once: delivered or returned, never both, never twice, never lost.
    counts = Counter(delivered + leftovers)
    assert [k for k, c in counts.items() if c > 1] == []
    assert set(counts) == set(everything)
    assert len(everything) + len(refused) == THREADS * PUSHES
    # Refused pushes stored nothing.
    seen_anywhere = set(counts) | {
        text for req in client.requests for text in _steering_texts(req.messages)
    }
    assert refused.isdisjoint(seen_anywhere)
    # Per-thread order, across delivered-then-sealed; one open, one close.
    for t in range(THREADS):
        mine = [x for x in delivered + leftovers if x.startswith(f"t{t}-")]
        assert mine == accepted[t]
        assert _is_refused_accepted_refused([ok for _, ok in answers[t]])
    # Deliveries happen at boundaries, in turn order.
    assert pacer.delivery_turns == sorted(pacer.delivery_turns)
    if outcome == "success":
        # Persisted, in drain order, and carried by the final request.
        assert history_after_run == delivered
        assert last_request == delivered
    else:
        # Discarded with pending; whatever reached a request was delivered first.
        assert history_after_run == []
        assert last_request == delivered[: len(last_request)]
