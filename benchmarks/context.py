"""Context measuring and compaction speed (issue 7).

1. Per-turn cost of measuring the conversation, at N = 100, 1,000 and
   10,000 messages of history. Each simulated turn appends a model reply
   with a tool call and its tool result (2 new messages) to the machine's
   pending list, then measures exactly as the driver does:
   ``ConversationMeter.measure(history, pending, history_epoch,
   pending_epoch)``. Figure: median per-turn time over TURNS turns. Floor,
   measured in the same run on the same new messages:
   ``sum(len(m) for m in texts)`` over the 2 new messages' texts only.
   Target: flat, i.e. the figure (and its ratio to the floor) must not grow
   with N. For contrast, a naive full recount (``count_messages`` over the
   whole conversation) is shown; it grows linearly.

2. Compaction time for 10,000 messages: ``ContextManager.compact`` with
   the default ``TruncatingCompactor`` (pair-safe split, orphan sweep, and
   the manager's recount of the input and the result). Floor: the same
   ``sum(len(m) for m in texts)`` over all 10,000 texts (one pass over the
   conversation, the least any compaction must do).

Run: ``python benchmarks/context.py`` (from the repo root; < 60 s; ``--smoke``: 20 turns,
two compactions). Besides the prose it
prints ``RESULT`` lines (figure | value | floor | ratio) for ``benchmarks/run_all.py``.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loopctl.context import (  # noqa: E402
    ContextManager,
    ConversationMeter,
    HeuristicTokenCounter,
    TruncatingCompactor,
    count_messages,
)
from loopctl.machine import LoopMachine  # noqa: E402
from loopctl.messages import Message, ToolCallPart, ToolResultPart  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_all import report, smoke_requested  # noqa: E402

SIZES = (100, 1_000, 10_000)
TURNS = 400
COMPACT_REPEATS = 15
SMOKE_TURNS, SMOKE_REPEATS = 20, 2  # --smoke


def conversation(n: int) -> list[Message]:
    """A realistic mix: user text, assistant text, tool call + result pairs."""
    out: list[Message] = [Message.user("Refactor the payment module and keep the tests green.")]
    i = 0
    while len(out) < n:
        k = len(out)
        if k % 4 == 1:
            out.append(Message.assistant("", [ToolCallPart(f"c{i}", "read_file", {"path": f"src/mod{i}.py"})]))
        elif k % 4 == 2:
            out.append(Message.from_tool_results([ToolResultPart(f"c{i}", "read_file", "def f():\n    pass\n" * (20 + i % 40))]))
            i += 1
        elif k % 4 == 3:
            out.append(Message.assistant("I read the file; next I will look at its callers. " * 3))
        else:
            out.append(Message.user("Go on, and mind the edge cases in refunds."))
    return out[:n]


def turn_pair(i: int) -> tuple[Message, Message]:
    call = Message.assistant("", [ToolCallPart(f"t{i}", "grep", {"pattern": f"refund_{i}"})])
    res = Message.from_tool_results([ToolResultPart(f"t{i}", "grep", f"src/pay.py:{i}: refund_{i}()\n" * 12)])
    return call, res


def texts_of(msgs: tuple[Message, ...]) -> list[str]:
    out: list[str] = []
    for m in msgs:
        for p in m.parts:
            if type(p) is ToolResultPart:
                out.append(p.output)
            elif type(p) is ToolCallPart:
                out.append(p.name + repr(p.input))
            else:
                out.append(getattr(p, "text", ""))
    return out


def per_turn(n: int) -> tuple[float, float, float]:
    """(meter per turn, floor per turn, naive recount per turn), seconds (medians)."""
    counter = HeuristicTokenCounter()
    meter = ConversationMeter(counter)
    m = LoopMachine(conversation(n))
    m.accept_input("continue")
    meter.measure(m.history, m.pending, m.history_epoch, m.pending_epoch)  # the run's first measure
    pairs = [turn_pair(i) for i in range(TURNS)]
    new_texts = [texts_of(p) for p in pairs]
    meter_t: list[float] = []
    floor_t: list[float] = []
    pc = time.perf_counter
    gc.disable()
    try:
        for pair, texts in zip(pairs, new_texts):
            for msg in pair:
                m.inject(msg)
            t0 = pc()
            meter.measure(m.history, m.pending, m.history_epoch, m.pending_epoch)
            t1 = pc()
            sum(len(s) for s in texts)
            t2 = pc()
            meter_t.append(t1 - t0)
            floor_t.append(t2 - t1)
        naive_t: list[float] = []
        full = conversation(n)
        for _ in range(max(5, 20_000 // n)):
            t0 = pc()
            count_messages(counter, full)
            naive_t.append(pc() - t0)
    finally:
        gc.enable()
    # sanity: the incremental figure equals a full recount
    assert meter.measure(m.history, m.pending, m.history_epoch, m.pending_epoch) == count_messages(counter, m.full_history())
    return statistics.median(meter_t), statistics.median(floor_t), statistics.median(naive_t)


def best(fn: Callable[[], object], repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def compaction(n: int) -> tuple[float, float, int]:
    msgs = conversation(n)
    manager = ContextManager(TruncatingCompactor(), context_window=200_000)
    texts = texts_of(tuple(msgs))
    out = manager.compact(msgs, reason="threshold", reserved=0, instructions=None, extra_context=None, summarize=None)
    assert out is not None and out[0] is msgs[0]
    t = best(lambda: manager.compact(msgs, reason="threshold", reserved=0, instructions=None, extra_context=None, summarize=None), COMPACT_REPEATS)
    floor = best(lambda: sum(len(s) for s in texts), COMPACT_REPEATS)
    return t, floor, len(out)


def main(argv: Optional[Sequence[str]] = None) -> None:
    global TURNS, COMPACT_REPEATS
    if smoke_requested(__doc__.splitlines()[0], argv):
        TURNS, COMPACT_REPEATS = SMOKE_TURNS, SMOKE_REPEATS
    print(f"per-turn measure (2 new messages a turn; median of {TURNS} turns)")
    print(f"{'N':>7} {'meter':>10} {'floor':>10} {'ratio':>7} {'full recount of N':>18}")
    rows = []
    for n in SIZES:
        meter, floor, naive = per_turn(n)
        rows.append((n, meter, floor))
        print(f"{n:>7} {meter * 1e6:>8.2f}us {floor * 1e6:>8.2f}us {meter / floor:>6.1f}x {naive * 1e6:>16.1f}us")
    growth = rows[-1][1] / rows[0][1]
    print(f"growth of the per-turn measure from N={SIZES[0]} to N={SIZES[-1]}: {growth:.2f}x (target: flat, ~1x)")
    print()
    t, floor, kept = compaction(10_000)
    print(f"compaction of 10,000 messages (TruncatingCompactor via ContextManager; median of {COMPACT_REPEATS})")
    print(f"  compact: {t * 1e3:.2f} ms -> {kept} messages; floor (one pass over all texts): {floor * 1e3:.3f} ms; ratio {t / floor:.0f}x")
    print()
    # The table's lines: a flat per-turn figure keeps the same ratio at every N.
    for n, meter, turn_floor in rows:
        report(f"per-turn measure, N={n:,} history, 2 new messages vs len() of their texts",
               meter * 1e6, turn_floor * 1e6, "us")
    report("compaction of 10,000 messages vs one len() pass over their texts", t * 1e3, floor * 1e3, "ms")


if __name__ == "__main__":
    main()
