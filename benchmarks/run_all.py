"""Run every benchmark in ``benchmarks/`` and print one table of their figures.

Each other ``benchmarks/*.py`` runs in its own subprocess (one at a time, so
they do not disturb each other's timings), with a timeout. A benchmark
reports its figures by printing lines of this form, anywhere in its
output::

    RESULT <figure> | <loopctl value> | <floor value> | <ratio>

for example ``RESULT cancel p99, tool phase | 0.41 ms | 0.02 ms | 20.5x``.
The figure is free text without ``|``; values carry their units, in plain
digits; the floor is the same work done the simplest possible way,
measured in the same run; the ratio is value / floor. The table fits 100
columns and says for each ratio which way is better: lower for times and
sizes, higher for rates (a unit ending in ``/s``). ``report()`` below prints such a line (a
benchmark run as ``python benchmarks/x.py`` can ``from run_all import
report``). A benchmark that prints no ``RESULT`` line still runs: the table
says so and its output is shown below the table.

    python benchmarks/run_all.py                   # all of them
    python benchmarks/run_all.py cancel_latency    # some of them
    python benchmarks/run_all.py --show-output     # and every benchmark's own output

Exit code 1 if any benchmark failed or timed out.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Optional, Union

import attrs

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PREFIX = "RESULT "
#: Arguments for benchmarks whose full run is too long for this table.
ARGS = {"concurrency": ("--quick",)}


def plain(x: float) -> str:
    """``x`` in plain digits, never scientific notation: about three significant digits.

    12345.6 -> "12,346"; 12.345 -> "12.35"; 0.0123456 -> "0.0123".
    """
    if math.isnan(x) or math.isinf(x):
        return str(x)
    ax = abs(x)
    if ax >= 100:
        return f"{x:,.0f}"
    if ax >= 1:
        return f"{x:.2f}"
    if ax == 0:
        return "0"
    decimals = min(12, 2 - math.floor(math.log10(ax)))
    return f"{x:.{decimals}f}"


def direction(unit: str) -> str:
    """Which way a figure in ``unit`` is better: a rate ("runs/s", "MB/s") higher, else lower."""
    return "higher is better" if unit.strip().endswith("/s") else "lower is better"


def report(figure: str, value: float, floor: float, unit: str = "", ratio: Optional[float] = None) -> str:
    """Print (and return) one ``RESULT`` line; the ratio defaults to value / floor."""
    if ratio is None:
        ratio = value / floor if floor else float("inf")
    sep = " " if unit else ""
    line = f"{PREFIX}{figure} | {plain(value)}{sep}{unit} | {plain(floor)}{sep}{unit} | {plain(ratio)}x"
    print(line, flush=True)
    return line


@attrs.frozen
class Row:
    """One reported figure."""

    figure: str
    value: str
    floor: str
    ratio: str


@attrs.define
class Outcome:
    """What one benchmark did."""

    name: str
    status: str  # "ok", "failed (exit N)", "timed out after Ns"
    seconds: float
    rows: list[Row]
    output: str


def parse(output: str) -> list[Row]:
    """The ``RESULT`` rows of a benchmark's output (malformed lines are kept whole)."""
    rows = []
    for line in output.splitlines():
        if not line.startswith(PREFIX):
            continue
        fields = [f.strip() for f in line[len(PREFIX):].split("|")]
        if len(fields) != 4:
            fields = [line[len(PREFIX):].strip(), "?", "?", "?"]
        rows.append(Row(*fields))
    return rows


def discover(names: Sequence[str] = ()) -> list[Path]:
    """The benchmark scripts: all of ``benchmarks/*.py`` but this one and private modules."""
    found = sorted(p for p in HERE.glob("*.py") if p.name != Path(__file__).name and not p.name.startswith("_"))
    if not names:
        return found
    wanted = {n.removesuffix(".py") for n in names}
    missing = wanted - {p.stem for p in found}
    if missing:
        raise SystemExit(f"no such benchmark: {', '.join(sorted(missing))}")
    return [p for p in found if p.stem in wanted]


def run_one(script: Path, timeout: float) -> Outcome:
    """Run one benchmark script in a subprocess from the repo root."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, str(script), *ARGS.get(script.stem, ())], cwd=ROOT, env=env, capture_output=True, text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        out = _text(exc.stdout) + _text(exc.stderr)
        return Outcome(script.stem, f"timed out after {timeout:g}s", timeout, parse(out), out)
    seconds = time.perf_counter() - t0
    out = proc.stdout + (("\n" + proc.stderr) if proc.stderr.strip() else "")
    status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
    return Outcome(script.stem, status, seconds, parse(proc.stdout), out)


def _text(data: Union[str, bytes, None]) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


WIDTH = 100  # the table fits this many columns
_VALUE = re.compile(r"^([-+]?(?:[\d,]*\.?\d+(?:[eE][-+]?\d+)?|inf|nan))\s*(.*)$")


def _split(cell: str) -> tuple[Optional[float], str]:
    """A value cell ("0.41 ms", "1.2e+04 us") as its number and unit."""
    m = _VALUE.match(cell.strip())
    if m is None:
        return None, cell.strip()
    return float(m.group(1).replace(",", "")), m.group(2).strip()


def cells(row: Row) -> tuple[str, str, str]:
    """A row's value, floor and ratio as the table shows them: plain digits,
    each value with its unit, the ratio with the way it is better."""
    value, unit = _split(row.value)
    floor, floor_unit = _split(row.floor)
    ratio, _ = _split(row.ratio.rstrip("xX"))
    if value is None or floor is None:
        return row.value, row.floor, row.ratio
    unit = unit or floor_unit or "(no unit)"
    if ratio is None:
        ratio = value / floor if floor else float("inf")
    return (f"{plain(value)} {unit}", f"{plain(floor)} {floor_unit or unit}",
            f"{plain(ratio)}x, {direction(unit)}")


def table(outcomes: Sequence[Outcome], width: int = WIDTH) -> str:
    """The combined table, at most ``width`` columns: per benchmark a heading,
    then one line per figure (long figure names wrap in their column)."""
    shown = [(r.figure, *cells(r)) for o in outcomes for r in o.rows]
    value_w = max([len("loopctl")] + [len(row[1]) for row in shown])
    floor_w = max([len("floor")] + [len(row[2]) for row in shown])
    ratio_w = max([len("ratio")] + [len(row[3]) for row in shown])
    # The figure column takes what the numbers leave (long names wrap in it).
    figure_w = max(20, width - 2 - value_w - floor_w - ratio_w - 6)
    header = ("figure (ratio = loopctl / floor)", "loopctl", "floor", "ratio")

    def fmt(figure: str, value: str, floor: str, ratio: str) -> list[str]:
        names = textwrap.wrap(figure, figure_w) or [""]
        first = (f"  {names[0]:<{figure_w}}  {value:>{value_w}}  {floor:>{floor_w}}  "
                 f"{ratio:<{ratio_w}}").rstrip()
        return [first] + [f"  {n}" for n in names[1:]]

    lines = [f"  {header[0]:<{figure_w}}  {header[1]:>{value_w}}  {header[2]:>{floor_w}}  {header[3]}",
             "  " + "-" * (figure_w + value_w + floor_w + ratio_w + 6)]
    for o in outcomes:
        lines.append(f"{o.name} ({o.status}, {o.seconds:.1f} s)")
        for r in o.rows:
            lines += fmt(r.figure, *cells(r))
        if not o.rows:
            lines.append("  (no RESULT lines: output below)" if o.status == "ok" else f"  {o.status.upper()}")
        elif o.status != "ok":
            lines.append(f"  {o.status.upper()}")
    # Only a cell wider than the whole table could overflow: cut it, keeping the spacing.
    return "\n".join(line if len(line) <= width else line[: width - 1] + "…" for line in lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the benchmarks and print the table; 1 if any failed or timed out."""
    parser = argparse.ArgumentParser(description="Run loopctl's benchmarks and print one table.")
    parser.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per benchmark (default 120)")
    parser.add_argument("--show-output", action="store_true", help="print every benchmark's own output")
    args = parser.parse_args(argv)
    outcomes = []
    for script in discover(args.names):
        print(f"running {script.name} ...", file=sys.stderr, flush=True)
        outcome = run_one(script, args.timeout)
        print(f"  {outcome.status} in {outcome.seconds:.1f}s", file=sys.stderr, flush=True)
        outcomes.append(outcome)
    print(f"python {sys.version.split()[0]} on {sys.platform}, {os.cpu_count()} CPUs")
    print(table(outcomes))
    for o in outcomes:
        if args.show_output or not o.rows or o.status != "ok":
            print(f"\n== {o.name} ({o.status}, {o.seconds:.1f}s) ==\n{o.output.rstrip()}")
    return 0 if all(o.status == "ok" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
