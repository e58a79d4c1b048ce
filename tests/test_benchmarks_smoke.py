"""The benchmarks still import and run against today's library.

Nothing else imports ``benchmarks/*.py``, and several reach into the
library's internals, so a rename there breaks them silently. Here every
script is imported as a module in a fresh interpreter (without running it),
and every benchmark runs end to end in its ``--smoke`` mode (a tiny run of
every path, a few seconds; its figures mean little): it must exit 0 and
print ``RESULT`` lines that ``run_all``'s parser and table read whole.

The benchmarks that start Celery workers, a kill -9 cycle or MCP servers
are marked ``slow``; those needing redis-server, Celery or the ``[mcp]``
extra are skipped where they are missing, as the suite's own tests are.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
run_all = pytest.importorskip("run_all")

from celery_support import missing_requirements  # noqa: E402

#: Every script in benchmarks/, the runner included (it is imported by the others).
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))
#: Seconds one smoke run may take on a loaded machine (each takes a few).
SMOKE_TIMEOUT = 120.0
#: Start Celery workers (and kill one), or MCP servers: seconds each even in the tiny mode.
HEAVY = {"approvals", "distributed", "mcp_overhead", "resume"}
CELERY = {"distributed", "resume"}  # no RESULT line at all without redis-server and Celery
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)

# Imports every script given on the command line under its own name (as the
# benchmarks import each other), with what it printed and how it failed.
IMPORT_ALL = """
import contextlib, importlib, io, json, sys, traceback
sys.path.insert(0, sys.argv[1])
report = {}
for name in sys.argv[2:]:
    out = io.StringIO()
    error = None
    try:
        with contextlib.redirect_stdout(out):  # a library's warning on stderr is no run
            importlib.import_module(name)
    except BaseException:
        error = traceback.format_exc()
    report[name] = {"error": error, "printed": out.getvalue()}
print(json.dumps(report))
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


@pytest.fixture(scope="module")
def imported() -> dict[str, Any]:
    """What importing each script did, in one fresh interpreter."""
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, str(BENCHMARKS), *(p.stem for p in SCRIPTS)],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=SMOKE_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


def test_every_benchmark_is_found_and_run_by_run_all() -> None:
    assert len(SCRIPTS) > 10, SCRIPTS
    assert {p.stem for p in run_all.discover()} == {p.stem for p in SCRIPTS} - {"run_all"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_benchmark_imports_cleanly_and_runs_nothing_on_import(script: Path, imported: dict[str, Any]) -> None:
    got = imported[script.stem]
    assert got["error"] is None, f"importing {script.name} failed:\n{got['error']}"
    # Anything printed (a RESULT line above all) means the import ran the benchmark.
    assert got["printed"] == "", f"importing {script.name} printed:\n{got['printed']}"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_benchmark_runs_only_under_a_main_guard(script: Path) -> None:
    tree = ast.parse(script.read_text(encoding="utf-8"), str(script))
    guards = [node for node in tree.body if isinstance(node, ast.If) and _is_main_guard(node.test)]
    assert len(guards) == 1, f"{script.name}: no `if __name__ == \"__main__\":` guard"
    # Definitions run nothing on import; any other top-level statement must not call main().
    loose = [s for s in tree.body if s not in guards and not isinstance(s, DEFINITIONS)]
    calls = [n.lineno for s in loose for n in ast.walk(s)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "main"]
    assert not calls, f"{script.name}: main() is called outside the guard, line {calls[0]}"


def _is_main_guard(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
        and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)
        and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value == "__main__"
    )


def _needs(name: str) -> Optional[str]:
    """Why benchmark ``name`` cannot run here, or None."""
    if name in CELERY:
        return missing_requirements()
    if name == "mcp_overhead" and importlib.util.find_spec("mcp") is None:
        return "needs the [mcp] extra (Python >= 3.10)"
    return None


def _smoke_params() -> list[Any]:
    return [
        pytest.param(p, id=p.stem, marks=[pytest.mark.slow] if p.stem in HEAVY else [])
        for p in run_all.discover()
    ]


@pytest.mark.parametrize("script", _smoke_params())
def test_benchmark_smoke_run_prints_well_formed_results(script: Path) -> None:
    why = _needs(script.stem)
    if why is not None:
        pytest.skip(why)
    outcome = run_all.run_one(script, SMOKE_TIMEOUT, smoke=True)
    assert outcome.status == "ok", f"{script.name} --smoke: {outcome.status}\n{outcome.output}"
    assert outcome.rows, f"{script.name} --smoke printed no RESULT line:\n{outcome.output}"
    for row in outcome.rows:
        assert row.value != "?", f"{script.name}: a RESULT line with fewer than 4 fields: {row.figure!r}"
        value, floor, ratio = run_all.cells(row)
        # cells() says which way is better only when both values read as numbers.
        assert ratio.endswith("is better"), f"{script.name}: unreadable values in {row}"
        assert "(no unit)" not in value, f"{script.name}: no unit in {row}"
        if row.target:
            assert not run_all.verdict(row).endswith("not checked"), f"{script.name}: unreadable target in {row}"
