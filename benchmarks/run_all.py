"""Run every benchmark in ``benchmarks/`` and print one table of their figures.

Each other ``benchmarks/*.py`` runs in its own subprocess (one at a time, so
they do not disturb each other's timings), with a timeout. A benchmark
reports its figures by printing lines of this form, anywhere in its
output::

    RESULT <figure> | <loopctl value> | <floor value> | <ratio>

for example ``RESULT cancel p99, tool phase | 0.41 ms | 0.02 ms | 20.5x``.
The figure is free text without ``|``; values carry their units; the floor
is the same work done the simplest possible way, measured in the same run;
the ratio is value / floor. ``report()`` below prints such a line (a
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
import os
import subprocess
import sys
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


def report(figure: str, value: float, floor: float, unit: str = "", ratio: Optional[float] = None) -> str:
    """Print (and return) one ``RESULT`` line; the ratio defaults to value / floor."""
    if ratio is None:
        ratio = value / floor if floor else float("inf")
    sep = " " if unit else ""
    line = f"{PREFIX}{figure} | {value:.4g}{sep}{unit} | {floor:.4g}{sep}{unit} | {ratio:.3g}x"
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


def table(outcomes: Sequence[Outcome]) -> str:
    """The combined table: one line per figure, a status line per silent or failed benchmark."""
    header = ("benchmark", "figure", "loopctl", "floor", "ratio")
    lines: list[tuple[str, ...]] = []
    for o in outcomes:
        for r in o.rows:
            lines.append((o.name, r.figure, r.value, r.floor, r.ratio))
        if not o.rows:
            lines.append((o.name, "(no RESULT lines: output below)" if o.status == "ok" else "", "", "", ""))
        if o.status != "ok":
            lines.append((o.name, o.status.upper(), "", "", ""))
    widths = [max(len(row[i]) for row in [header, *lines]) for i in range(5)]

    def fmt(row: tuple[str, ...]) -> str:
        left = [row[i].ljust(widths[i]) for i in (0, 1)]
        right = [row[i].rjust(widths[i]) for i in (2, 3, 4)]
        return "  ".join(left + right).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(header), rule, *(fmt(r) for r in lines)])


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
