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
        "RESULT cancel p99, model phase vs bare Event hand-off, a figure long enough to wrap twice "
        "in its column | 4.1e-01 ms | 2e-02 ms | 2.05e+01x\n"
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
    assert "twice" in text, "a long figure name wraps, it is not cut"


def test_a_long_ratio_cell_keeps_the_columns_aligned() -> None:
    rows = run_all.parse(
        "RESULT throughput, distributed vs in-process | 54.27 runs/s | 99.93 runs/s | 0.543x\n"
        "RESULT steer-to-request p50, distributed vs in-process | 2.86 ms | 2.55 ms | 1.12x\n"
        "RESULT steer-to-slot p99, distributed vs in-process | 14.25 ms | 0.0365 ms | 390x\n"
    )
    lines = run_all.table([run_all.Outcome("distributed", "ok", 19.5, rows, "")]).splitlines()
    assert max(len(line) for line in lines) <= 100
    first = next(line for line in lines if "throughput" in line)
    assert first.startswith("  throughput, distributed vs in-process  ")
    assert first.endswith("0.543x, higher is better")
    starts = {line.rindex("  ") for line in lines if "is better" in line}
    assert len(starts) == 1, lines  # every ratio cell starts in the same column
