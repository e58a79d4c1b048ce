"""``.ci/run`` picks its Pythons and says plainly when the floor (3.9) goes untested.

Its Pythons block runs by itself here, against fake pyenv trees and a fake
``python3`` (shell scripts that answer ``-V`` and the version probe), so
nothing is installed and no suite runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

CI_RUN = Path(__file__).resolve().parent.parent / ".ci" / "run"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _fake_python(path: Path, version: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    minor = ".".join(version.split(".")[:2])
    path.write_text(f'#!/bin/sh\ncase "$1" in -V) echo "Python {version}";; -c) echo "{minor}";; esac\n')
    path.chmod(0o755)


def _pythons_block(tmp_path: Path, pyenv_versions: list[str]) -> str:
    text = CI_RUN.read_text()
    block = text[text.index("# --- Pythons"):text.index("# --- end Pythons")]
    root = tmp_path / "pyenv"
    for version in pyenv_versions:
        _fake_python(root / "versions" / version / "bin" / "python", version)
    _fake_python(tmp_path / "bin" / "python3", "3.11.2")  # Debian 12's
    env = {**os.environ, "PYENV_ROOT": str(root), "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    script = f"set -euo pipefail\n{block}\necho \"chosen: $ci_python_newest $ci_python_oldest\"\n"
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_without_pyenv_the_floor_is_said_not_to_be_tested_first_and_last(tmp_path: Path) -> None:
    out = _pythons_block(tmp_path, []).splitlines()
    assert out[0] == "CI: main run on Python 3.11.2, no second run (one Python found)"
    note = "CI: Python 3.9 NOT TESTED: it is the oldest Python loopctl supports (python_requires)"
    assert out[1].startswith(note) and out[-1].startswith(note)  # again at the end, after the suite's output
    assert out[2] == "chosen: python3 python3"


def test_with_a_newer_pyenv_python_but_no_3_9_the_second_run_says_the_floor_is_untested(tmp_path: Path) -> None:
    out = _pythons_block(tmp_path, ["3.12.1", "3.13.0"]).splitlines()
    assert out[0] == "CI: main run on Python 3.13.0, second run on Python 3.11.2"
    assert out[1].startswith("CI: Python 3.9 NOT TESTED")


def test_with_pyenv_3_9_and_a_newer_one_both_run_and_nothing_is_untested(tmp_path: Path) -> None:
    out = _pythons_block(tmp_path, ["3.9.18", "3.13.0"])
    root = tmp_path / "pyenv" / "versions"
    assert out.splitlines() == [
        "CI: main run on Python 3.13.0, second run on Python 3.9.18",
        f"chosen: {root}/3.13.0/bin/python {root}/3.9.18/bin/python",
    ]


def test_debians_python3_venv_is_installed_when_python3_cannot_make_a_venv() -> None:
    text = CI_RUN.read_text()
    guard = "if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then"
    assert guard in text
    assert "apt-get install -y -qq python3 python3-venv" in text.split(guard, 1)[1].split("fi\n", 1)[0]
    assert text.index(guard) < text.index('-m venv .ci-venv\n')
