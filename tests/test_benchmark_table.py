"""``benchmarks/run_all.py``'s table: readable at 100 columns.

Every figure shows its unit, every ratio says which way is better, and no
number is printed in scientific notation, whatever the benchmarks report.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
run_all = pytest.importorskip("run_all")

SCIENTIFIC = re.compile(r"\d[eE][-+]?\d")


def test_report_lines_use_plain_digits(capsys: pytest.CaptureFixture[str]) -> None:
    line = run_all.report("huge vs tiny", 123456789.0, 0.0000123, "us")
    assert not SCIENTIFIC.search(line), line
    assert line == "RESULT huge vs tiny | 123,456,789 us | 0.0000123 us | 10,037,137,317,073x"
    assert capsys.readouterr().out.strip() == line


def test_table_fits_100_columns_with_units_and_directions() -> None:
    rows = run_all.parse(
        "RESULT cancel p99, model phase vs bare Event hand-off, a figure long enough to need most of "
        "a line | 4.1e-01 ms | 2e-02 ms | 2.05e+01x\n"
        "RESULT sse full (StreamReader+accumulator) | 1.2345e+04 MB/s | 34.5 MB/s | 357.8x\n"
        "RESULT steering push(str), 8 threads | 85.25 ns/push | 40.1 ns/push | 2.13x\n"
    )
    outcomes = [run_all.Outcome("cancel_latency", "ok", 12.3, rows, ""),
                run_all.Outcome("distributed", "failed (exit 1)", 3.0, [], "boom")]
    text = run_all.table(outcomes)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100, text
    assert not SCIENTIFIC.search(text), text
    assert re.search(r"0\.410 ms +0\.0200 ms +20\.50x, lower is better", text), text
    assert re.search(r"12,345 MB/s +34\.50 MB/s +358x, higher is better", text), text
    assert re.search(r"85\.25 ns/push +40\.10 ns/push +2\.13x, lower is better", text), text
    assert "FAILED (EXIT 1)" in text and "distributed (failed (exit 1), 3.0 s)" in text


def test_a_figure_name_is_never_wrapped_inside_at_100_columns() -> None:
    names = [
        "steering push(Message), 4 threads, parked run vs locked list.append",
        "registry wall time (go -> all consumers saw run_end) vs bare BareLoop.start, N=10000",
        "per-turn measure, N=10,000 history, 2 new messages vs len() of their texts",
    ]
    rows = run_all.parse("".join(f"RESULT {n} | 1,234.5 ns/push | 0.5 ns/push | 2469x\n" for n in names))
    lines = run_all.table([run_all.Outcome("steering", "ok", 1.0, rows, "")]).splitlines()
    assert max(len(line) for line in lines) <= 100
    for name in names:
        assert f"  {name}" in lines, (name, lines)


def test_each_row_shows_its_target_and_says_met_or_missed_in_words(capsys: pytest.CaptureFixture[str]) -> None:
    run_all.report("CPU per run, user+system N=1000", 2.92, 0.41, "ms", target="<= 1 ms")
    run_all.report("cancel latency p99 N=1000", 16.29, 0.3, "ms", target="<= 10 ms")
    run_all.report("fresh loop 2-turn run wall", 2367, 300, "us", target="< 0.4 ms")
    run_all.report("wall / ideal N=1000", 1.05, 1.01, "x ideal", target="<= 1.2 x ideal")
    run_all.report("growth of cpu per turn N=10->1000", 30.0, 20.0, "us/turn", target="<= 1.3x")
    run_all.report("sse per-event path", 2e6, 1e5, "deltas/s", target=">= 100000 deltas/s")
    rows = run_all.parse(capsys.readouterr().out)
    assert [r.target for r in rows][:2] == ["<= 1 ms", "<= 10 ms"]
    text = run_all.table([run_all.Outcome("concurrency", "ok", 40.0, rows, "")])
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100, text

    def cell(figure: str) -> str:
        return lines[lines.index(f"  {figure}") + 1]

    assert cell("CPU per run, user+system N=1000").endswith("<= 1 ms: MISSED")
    assert cell("cancel latency p99 N=1000").endswith("<= 10 ms: MISSED")
    assert cell("fresh loop 2-turn run wall").endswith("< 0.4 ms: MISSED")  # us judged against ms
    assert cell("wall / ideal N=1000").endswith("<= 1.2 x ideal: met")
    assert cell("growth of cpu per turn N=10->1000").endswith("<= 1.3x: MISSED")  # 1.5x: the ratio
    assert cell("sse per-event path").endswith(">= 100000 deltas/s: met")
    assert "4 figures missed the target:" in text
    assert "  concurrency: CPU per run, user+system N=1000: 2.92 ms, target <= 1 ms" in lines


def test_every_figure_carries_a_unit_and_zero_over_zero_has_no_ratio(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(ValueError, match="unit"):
        run_all.report("peak threads N=1000", 1002, 1001, "")
    line = run_all.report("runs failed (not cancelled) N=1000", 0, 0, "runs", target="= 0 runs")
    assert line == "RESULT runs failed (not cancelled) N=1000 | 0 runs | 0 runs | - | target = 0 runs"
    rows = run_all.parse(capsys.readouterr().out)
    text = run_all.table([run_all.Outcome("concurrency", "ok", 1.0, rows, "")])
    assert "none (0/0), lower is better" in text and "= 0 runs: met" in text
    assert not re.search(r"(?<![\d.])0x", text), text
    assert "(no unit)" not in text


def test_a_long_ratio_cell_keeps_the_columns_aligned() -> None:
    rows = run_all.parse(
        "RESULT throughput, distributed vs in-process | 54.27 runs/s | 99.93 runs/s | 0.543x\n"
        "RESULT steer-to-request p50, distributed vs in-process | 2.86 ms | 2.55 ms | 1.12x\n"
        "RESULT steer-to-slot p99, distributed vs in-process | 14.25 ms | 0.0365 ms | 390x | target <= 50 ms\n"
    )
    lines = run_all.table([run_all.Outcome("distributed", "ok", 19.5, rows, "")]).splitlines()
    assert max(len(line) for line in lines) <= 100
    first = lines[lines.index("  throughput, distributed vs in-process") + 1]
    assert first.endswith("0.543x, higher is better")
    starts = {re.search(r"  ([\d.,]+x, )", line).start(1) for line in lines if "is better" in line}  # type: ignore[union-attr]
    assert len(starts) == 1, lines  # every ratio cell starts in the same column
    assert lines[-1].endswith("<= 50 ms: met")
