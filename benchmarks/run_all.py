"""Run every benchmark in ``benchmarks/`` and print one table of their figures.

Each other ``benchmarks/*.py`` runs in its own subprocess (one at a time, so
they do not disturb each other's timings), with a timeout. A benchmark
reports its figures by printing lines of this form, anywhere in its
output::

    RESULT <figure> | <loopctl value> | <floor value> | <ratio> [| target <goal>] [| better higher]

for example ``RESULT cancel p99, tool phase | 0.41 ms | 0.02 ms | 20.5x |
target <= 10 ms``. The figure is free text without ``|``; values carry
their units, in plain digits; the floor is the same work done the simplest
possible way, measured in the same run; the ratio is value / floor (``-``
when both are 0). The table fits 100 columns: each figure's name on a line
of its own, then its values, the ratio with which way is better (lower for
times and sizes, higher for rates, a unit ending in ``/s``, or when the line
says ``better higher``), and the target with "met" or "MISSED"; the misses
are listed again under the table. A target in ``x`` judges the ratio.
``report()`` below prints such a line (a benchmark run as ``python
benchmarks/x.py`` can ``from run_all import report``). A benchmark that
prints no ``RESULT`` line still runs: the table says so and its output is
shown below the table.

    python benchmarks/run_all.py                   # all of them
    python benchmarks/run_all.py cancel_latency    # some of them
    python benchmarks/run_all.py --show-output     # and every benchmark's own output
    python benchmarks/run_all.py --smoke           # each in its tiny mode: does it run?

Every benchmark takes ``--smoke``: a tiny run of every path, a few seconds
each, that checks it still runs end to end; its figures mean little
(``tests/test_benchmarks_smoke.py`` runs them so).

Exit code 1 if any benchmark failed or timed out. A missed target is not a
failure (the figures depend on the machine and its load): the table says
it in words.
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
SMOKE = "--smoke"
SMOKE_HELP = "a tiny run of every path, in seconds: checks that it runs (its figures mean little)"


def smoke_requested(description: str, argv: Optional[Sequence[str]] = None) -> bool:
    """Parse a benchmark's command line, which takes only ``--smoke``; True if it was given."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(SMOKE, action="store_true", help=SMOKE_HELP)
    return bool(parser.parse_args(argv).smoke)


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


def direction(unit: str, better: str = "") -> str:
    """Which way a figure in ``unit`` is better: a rate ("runs/s", "MB/s") higher, else lower.

    ``better`` ("higher" or "lower") overrides the rule for a count that
    should be high (pushes accepted, say).
    """
    if better in ("higher", "lower"):
        return f"{better} is better"
    return "higher is better" if unit.strip().endswith("/s") else "lower is better"


def report(
    figure: str,
    value: float,
    floor: float,
    unit: str,
    ratio: Optional[float] = None,
    *,
    target: str = "",
    better: str = "",
) -> str:
    """Print (and return) one ``RESULT`` line; the ratio defaults to value / floor.

    Args:
        figure: what was measured (no ``|``; keep it under 90 characters).
        value, floor: loopctl's figure and the simplest way's, in ``unit``.
        unit: the figures' unit, never empty ("ms", "threads", "runs").
        ratio: overrides value / floor (none is printed for 0 / 0).
        target: the goal, e.g. ``"<= 1 ms"``, ``"< 400 us"``, ``"<= 1.2x"``
            (a target in ``x`` applies to the ratio); the table marks a miss.
        better: "higher" when a bigger value is better and the unit is not a rate.
    """
    if not unit.strip():
        raise ValueError(f"report({figure!r}): every figure needs a unit, got {unit!r}")
    if ratio is None and floor:
        ratio = value / floor
    ratio_cell = "-" if ratio is None else f"{plain(ratio)}x"
    fields = [figure, f"{plain(value)} {unit}", f"{plain(floor)} {unit}", ratio_cell]
    if target:
        fields.append(f"target {target}")
    if better:
        fields.append(f"better {better}")
    line = PREFIX + " | ".join(fields)
    print(line, flush=True)
    return line


@attrs.frozen
class Row:
    """One reported figure."""

    figure: str
    value: str
    floor: str
    ratio: str
    target: str = ""
    better: str = ""


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
        if len(fields) < 4:
            rows.append(Row(line[len(PREFIX):].strip(), "?", "?", "?"))
            continue
        extra = {k: v.strip() for k, _, v in (f.partition(" ") for f in fields[4:])}
        rows.append(Row(fields[0], fields[1], fields[2], fields[3], target=extra.get("target", ""), better=extra.get("better", "")))
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


def run_one(script: Path, timeout: float, smoke: bool = False) -> Outcome:
    """Run one benchmark script in a subprocess from the repo root (``smoke``: in its tiny mode)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, str(script), *((SMOKE,) if smoke else ARGS.get(script.stem, ()))], cwd=ROOT, env=env,
            capture_output=True, text=True, timeout=timeout,
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
_TARGET = re.compile(r"^(<=|>=|<|>|=)?\s*(.+)$")
#: Seconds per unit, so a target in ms can judge a value in us.
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def _split(cell: str) -> tuple[Optional[float], str]:
    """A value cell ("0.41 ms", "1.2e+04 us") as its number and unit."""
    m = _VALUE.match(cell.strip())
    if m is None:
        return None, cell.strip()
    return float(m.group(1).replace(",", "")), m.group(2).strip()


def _ratio(row: Row) -> Optional[float]:
    """The row's ratio: as printed, else value / floor; None when there is none (0 / 0)."""
    ratio, _ = _split(row.ratio.rstrip("xX"))
    if ratio is not None:
        return ratio
    value, _ = _split(row.value)
    floor, _ = _split(row.floor)
    if row.ratio.strip() in ("-", "") and value is not None and floor:
        return value / floor
    return None


def verdict(row: Row) -> str:
    """The target cell: ``"<= 1 ms: met"``, ``"<= 1 ms: MISSED"``, or ``""`` without a target.

    A target in ``x`` judges the ratio; one in the value's unit (or another
    unit of time) judges the value. A target that cannot be read is shown
    with "not checked".
    """
    if not row.target:
        return ""
    m = _TARGET.match(row.target)
    goal, goal_unit = _split(m.group(2)) if m else (None, "")
    op = (m.group(1) if m else None) or "="
    value, unit = _split(row.value)
    if goal is not None and goal_unit == "x":
        value = _ratio(row)
    elif goal is not None and value is not None and goal_unit and goal_unit != unit:
        if goal_unit in _TIME and unit in _TIME:
            value = value * _TIME[unit] / _TIME[goal_unit]
        else:
            value = None
    if goal is None or value is None:
        return f"{row.target}: not checked"
    ok = {"<=": value <= goal, "<": value < goal, ">=": value >= goal, ">": value > goal,
          "=": value == goal}[op]
    return f"{row.target}: {'met' if ok else 'MISSED'}"


def cells(row: Row) -> tuple[str, str, str]:
    """A row's value, floor and ratio as the table shows them: plain digits,
    each value with its unit, the ratio with the way it is better ("none
    (0/0)" when both are 0)."""
    value, unit = _split(row.value)
    floor, floor_unit = _split(row.floor)
    if value is None or floor is None:
        return row.value, row.floor, row.ratio
    unit = unit or floor_unit or "(no unit)"
    ratio = _ratio(row)
    ratio_cell = "none (0/0)" if ratio is None else f"{plain(ratio)}x"
    return (f"{plain(value)} {unit}", f"{plain(floor)} {floor_unit or unit}",
            f"{ratio_cell}, {direction(unit, row.better)}")


def table(outcomes: Sequence[Outcome], width: int = WIDTH) -> str:
    """The combined table, at most ``width`` columns.

    Per benchmark a heading, then per figure two lines: its name whole on
    the first, then loopctl's value, the floor, the ratio with the way it is
    better, and the target with "met" or "MISSED", in aligned columns.
    """
    shown = [cells(r) for o in outcomes for r in o.rows]
    value_w = max([len("loopctl")] + [len(c[0]) for c in shown])
    floor_w = max([len("floor")] + [len(c[1]) for c in shown])
    ratio_w = max([len("ratio (loopctl / floor)")] + [len(c[2]) for c in shown])
    indent = "    "

    def figures(value: str, floor: str, ratio: str, target: str) -> str:
        return f"{indent}{value:>{value_w}}  {floor:>{floor_w}}  {ratio:<{ratio_w}}  {target}".rstrip()

    lines = ["  figure", figures("loopctl", "floor", "ratio (loopctl / floor)", "target"),
             "  " + "-" * (width - 2)]
    missed = []
    for o in outcomes:
        lines.append(f"{o.name} ({o.status}, {o.seconds:.1f} s)")
        for r in o.rows:
            # The name is never broken inside: it has a line of its own, and
            # only a name wider than the table is wrapped, between words.
            lines += textwrap.wrap(r.figure, width - 2, initial_indent="  ", subsequent_indent="    ") or ["  "]
            judged = verdict(r)
            lines.append(figures(*cells(r), judged))
            if judged.endswith("MISSED"):
                missed.append(f"{o.name}: {r.figure}: {cells(r)[0]}, target {r.target}")
        if not o.rows:
            lines.append("  (no RESULT lines: output below)" if o.status == "ok" else f"  {o.status.upper()}")
        elif o.status != "ok":
            lines.append(f"  {o.status.upper()}")
    if missed:
        lines += ["", f"{len(missed)} figure{'s' if len(missed) != 1 else ''} missed the target:"]
        for miss in missed:  # one a line, so no name is broken across lines
            lines += textwrap.wrap(miss, width - 2, initial_indent="  ", subsequent_indent="      ",
                                   break_on_hyphens=False)
    # Only a cell wider than the whole table could overflow: cut it, keeping the spacing.
    return "\n".join(line if len(line) <= width else line[: width - 1] + "…" for line in lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the benchmarks and print the table; 1 if any failed or timed out."""
    parser = argparse.ArgumentParser(description="Run loopctl's benchmarks and print one table.")
    parser.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per benchmark (default 120)")
    parser.add_argument("--show-output", action="store_true", help="print every benchmark's own output")
    parser.add_argument(SMOKE, action="store_true", help="run each benchmark in its tiny mode (" + SMOKE_HELP + ")")
    args = parser.parse_args(argv)
    outcomes = []
    for script in discover(args.names):
        print(f"running {script.name} ...", file=sys.stderr, flush=True)
        outcome = run_one(script, args.timeout, smoke=args.smoke)
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
