"""``loopctl run`` as a person uses it: in a pseudo-terminal, and as a subprocess.

The terminal test types guidance while the agent works, sees it delivered,
types more, presses Ctrl-C, and sees ``cancelled``, the undelivered guidance
and exit code 130. Every step waits for output, never for time; the demo
tools are slowed with the hidden ``--tool-delay`` flag (a cancel-aware wait)
so there is a tool running to type into. The subprocess tests check that a
closed or empty stdin never hangs the command (the timeouts only bound a
hang; nothing is timed).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pexpect = pytest.importorskip("pexpect")

ROOT = Path(__file__).resolve().parent.parent
TASK = "What is ((1 + 2) * 3 + 4) * 5?"  # four dependent tool turns


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["NO_COLOR"] = "1"
    return env


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
def test_terminal_guidance_is_delivered_and_ctrl_c_exits_130_with_leftovers() -> None:
    child = pexpect.spawn(
        sys.executable, ["-m", "loopctl", "run", TASK, "--tool-delay", "1"],
        env=_env(), cwd=str(ROOT), encoding="utf-8", timeout=30, dimensions=(24, 200),
    )
    try:
        child.expect_exact("> add(a=1, b=2)")           # a tool is running now
        child.sendline("keep it short")
        child.expect_exact("[guidance queued: keep it short]")
        child.expect_exact("[guidance delivered: keep it short]")
        child.expect_exact("Noted: keep it short.")       # acknowledged in the next turn
        child.expect(r"> multiply\(")                     # the next tool is running
        child.sendline("one more thing")
        child.expect_exact("[guidance queued: one more thing]")
        child.sendintr()
        child.expect_exact("cancelled")
        child.expect_exact("guidance not delivered:")
        child.expect_exact("- one more thing")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 130
    assert "= 65" not in child.before


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
def test_terminal_run_streams_the_answer_and_exits_0() -> None:
    child = pexpect.spawn(
        sys.executable, ["-m", "loopctl", "run", "What is 12 + 30?"],
        env=_env(), cwd=str(ROOT), encoding="utf-8", timeout=30,
    )
    try:
        child.expect_exact("12 + 30 = 42.")
        child.expect(r"-- 2 turns, 1 tool call, \d+ tokens")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


@pytest.mark.parametrize("stdin", ["devnull", "closed"])
def test_no_hang_when_stdin_is_empty_or_closed(stdin: str) -> None:
    kwargs: dict[str, object] = {"stdin": subprocess.DEVNULL}
    if stdin == "closed":
        kwargs = {"stdin": None, "preexec_fn": lambda: os.close(0)}
    proc = subprocess.run(
        [sys.executable, "-m", "loopctl", "run", "What is 12 + 30?"],
        env=_env(), cwd=str(ROOT), capture_output=True, text=True, timeout=60, **kwargs,  # type: ignore[arg-type]
    )
    assert proc.returncode == 0, proc.stderr
    assert "12 + 30 = 42." in proc.stdout


def test_sigint_to_a_piped_run_exits_130() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "loopctl", "run", "What is 12 + 30?", "--tool-delay", "60"],
        env=_env(), cwd=str(ROOT), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("  > add("):
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "cancelled" in out
