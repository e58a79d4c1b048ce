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

import io
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

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


# -- what a person sees: a small terminal model -------------------------------

_CSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_SPINNER_LINE = re.compile(r"^[|/\\-] \S")


def screen(raw: str, cols: int) -> tuple[list[str], int]:
    """The lines a terminal ``cols`` wide shows after ``raw`` (scrollback
    included), and the cursor's column at the end. It models what the
    command relies on: ``\\r``, ``\\n``, ``ESC[K`` (erase to the end of the
    line), ``ESC[A`` (cursor up) and the automatic wrap at the right margin;
    other escape sequences (styles) take no room."""
    lines: list[list[str]] = [[]]
    row = col = 0
    i = 0
    while i < len(raw):
        ch = raw[i]
        m = _CSI.match(raw, i) if ch == "\x1b" else None
        if m is not None:
            if m.group(0).endswith("K"):
                del lines[row][col:]
            elif m.group(0).endswith("A"):
                row = max(row - int(m.group(0)[2:-1] or 1), 0)
            i = m.end()
            continue
        if ch == "\r":
            col = 0
        elif ch == "\n":
            row += 1
        elif ch == "\b":
            col = max(col - 1, 0)
        elif ch >= " ":
            if col >= cols:  # the wrap happens when the next character comes
                row, col = row + 1, 0
            while len(lines) <= row:
                lines.append([])
            line = lines[row]
            line.extend(" " * (col + 1 - len(line)))
            line[col] = ch
            col += 1
        while len(lines) <= row:
            lines.append([])
        i += 1
    return ["".join(x).rstrip() for x in lines], col


def status_frames(raw: str) -> list[str]:
    """Each status line drawn: the text after ``\\r ESC[K`` up to the next ``\\r`` or ``\\n``."""
    return [m for m in re.findall(r"\r\x1b\[K([^\r\n]*)", raw) if m]


def _spawn(args: list[str], cols: int, log: io.StringIO) -> Any:
    child = pexpect.spawn(sys.executable, ["-m", "loopctl", *args], env=_env(), cwd=str(ROOT),
                          encoding="utf-8", timeout=30, dimensions=(24, cols))
    child.logfile_read = log
    return child


COUNTRIES = "What is the population of France plus the population of Spain?"


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
@pytest.mark.parametrize("cols", [80, 40])
def test_spinner_for_parallel_calls_is_one_line_cut_to_the_width(cols: int) -> None:
    log = io.StringIO()
    child = _spawn(["run", COUNTRIES, "--tool-delay", "3"], cols, log)
    try:
        child.expect(r"lookup\(name=[^\r\n]* 1\.\ds")  # the spinner has redrawn ten times or more
        during, _ = screen(log.getvalue(), cols)
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    spinning = [line for line in during if _SPINNER_LINE.match(line)]
    assert len(spinning) == 1, during
    assert "lookup(name=" in spinning[0] and len(spinning[0]) < cols
    frames = status_frames(log.getvalue())
    assert frames and all(len(f) < cols for f in frames), max(frames, key=len)
    after, col = screen(log.getvalue(), cols)
    assert not [line for line in after if _SPINNER_LINE.match(line)], "no stale frame in scrollback"
    assert any(line.startswith("-- 3 turns, 3 tool calls") for line in after)
    assert col == 0


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
@pytest.mark.parametrize("cols", [80, 40])
def test_typed_guidance_stays_on_its_own_line_apart_from_the_spinner(cols: int) -> None:
    log = io.StringIO()
    child = _spawn(["run", "What is (1 + 2) * 3?", "--tool-delay", "2"], cols, log)
    try:
        child.expect_exact("> add(a=1, b=2)")
        child.send("keep it")
        # The half-typed line beside the running tool's spinner, redrawn with it.
        child.expect(r"[|/\\-] add\([^\r\n]*\d\.\ds  » keep it")
        child.sendline(" short")
        child.expect_exact("[guidance queued: keep it short]")
        child.expect_exact("Noted: keep it short.")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    lines, col = screen(log.getvalue(), cols)
    typed = [line for line in lines if "keep it" in line]
    assert typed[:2] == ["  [guidance queued: keep it short]", "  [guidance delivered: keep it short]"]
    assert len(typed) == 3 and typed[2].startswith("Noted: keep it short."), typed
    assert not [line for line in lines if _SPINNER_LINE.match(line) or "»" in line], lines
    assert col == 0


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
def test_ctrl_c_at_an_idle_chat_prompt_leaves_a_clean_line() -> None:
    log = io.StringIO()
    child = _spawn(["chat"], 80, log)
    try:
        child.expect_exact("Ctrl-D or /quit leaves.")
        child.expect_exact("> ")
        child.send("What is 2 +")
        child.expect_exact("> What is 2 +")
        child.sendintr()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 130
    lines, col = screen(log.getvalue(), 80)
    assert col == 0 and lines[-1] == "", lines
    assert not any("What is 2 +" in line for line in lines), "the half-typed line is cleared"


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX shell")
def test_echo_piped_into_loopctl_run_always_reports_the_guidance() -> None:
    # The issue's own command, as a shell runs it; 12 at once to crowd the machine.
    command = (f'echo "show each step" | {shlex.quote(sys.executable)} -m loopctl run '
               '"What is (2 + 3) * 4?"')
    procs = [subprocess.Popen(command, shell=True, env=_env(), cwd=str(ROOT), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(12)]
    try:
        results = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err
        assert "[guidance queued: show each step]" in out, out
        assert "[guidance delivered: show each step]" in out or "  - show each step\n" in out, out


# -- at 80 columns: typed text in sight, rows broken between words, plain errors -------


def _piped_lines(args: list[str]) -> list[str]:
    """The command's output lines without a terminal (nothing wrapped), up to the summary."""
    proc = subprocess.run([sys.executable, "-m", "loopctl", *args], env=_env(), cwd=str(ROOT),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [line for line in proc.stdout.splitlines() if not line.startswith("-- ")]


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
def test_text_typed_while_a_reply_streams_mid_line_shows_at_once_on_the_bottom_row() -> None:
    log = io.StringIO()
    # 0.2 s between the offline model's four-character deltas: the first
    # sentence (149 characters) takes about 7 s to stream.
    child = _spawn(["run", COUNTRIES, "--delay", "0.2"], 80, log)
    try:
        child.expect_exact("To work out the")
        child.send("abc")
        child.expect_exact("» abc")
        typed_at = len(log.getvalue())
        child.send("\x15")  # Ctrl-U: the typed text is cleared, never sent
        child.expect_exact("\r\x1b[K")  # the status line goes
        child.sendintr()  # no need to wait for the rest of the reply
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 130
    raw = log.getvalue()
    # Drawn while the model was still mid-sentence (the CLI used to wait for the line's end).
    assert "(together)." not in raw[:raw.index("» abc")]
    lines, _ = screen(raw[:typed_at], 80)
    while lines and not lines[-1]:
        lines.pop()
    assert lines[-1] == "» abc", lines
    sentence = "To work out the population of France + the population of Spain, I'll look up"
    assert lines[-2] and sentence.startswith(lines[-2]), lines  # the part-written row, intact above
    after, col = screen(raw, 80)
    assert not [line for line in after if "»" in line or "abc" in line], after
    assert "guidance queued" not in raw and "cancelled" in raw and col == 0


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
def test_long_lines_wrap_between_words_at_80_columns() -> None:
    expected = _piped_lines(["run", COUNTRIES])
    assert max(len(line) for line in expected) > 100  # the reply has lines that must wrap
    log = io.StringIO()
    child = _spawn(["run", COUNTRIES], 80, log)
    try:
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    rows, _ = screen(log.getvalue(), 80)
    rows = [r for r in rows if r and not r.startswith("-- ")]
    assert all(len(r) < 80 for r in rows), rows
    # Each line is its rows joined by the spaces they were broken at: no word
    # is cut ("plu" / "s") and no "." sits alone on a row.
    at = 0
    for line in expected:
        line = _timeless(line)  # the two runs' tools took their own time
        got = _timeless(rows[at])
        at += 1
        while len(got) < len(line):
            got += " " + _timeless(rows[at])
            at += 1
        assert got == line, (line, rows)
    assert at == len(rows)
    assert not [r for r in rows if r.strip() in (".", ",")]


def _timeless(line: str) -> str:
    """``line`` with a tool's duration ("(3 ms)") made the same for every run."""
    return re.sub(r"\(\d+ ms\)", "(N ms)", line)


def _dead_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
def test_a_dead_endpoint_is_told_in_a_persons_words() -> None:
    log = io.StringIO()
    env = _env()
    env["OPENAI_API_KEY"] = "sk-test-not-a-real-key-0123456789"
    url = f"http://127.0.0.1:{_dead_port()}/v1"
    child = pexpect.spawn(sys.executable, ["-m", "loopctl", "run", "hi", "--provider", "openai",
                                           "--base-url", url], env=env, cwd=str(ROOT),
                          encoding="utf-8", timeout=60, dimensions=(24, 80))
    child.logfile_read = log
    try:
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 1
    rows, _ = screen(log.getvalue(), 80)
    text = " ".join(r.strip() for r in rows if r)
    assert "attempt 4/4" in text
    assert "[still no reply after 4 tries: asking once more, for the whole reply at once]" in text
    assert (f"error: no reply from gpt-4o-mini: connection refused at {url} "
            "(tried 4 times, then once more without streaming).") in text
    assert "Check that the server is running and the --base-url address is right" in text
    for internal in ("stream interrupted", "rescue", "retry 4]", "0 turns", "sk-test"):
        assert internal not in text, (internal, rows)
    assert all(len(r) < 80 for r in rows), rows


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
def test_a_missing_key_says_which_variable_to_set_and_runs_nothing() -> None:
    log = io.StringIO()
    env = {k: v for k, v in _env().items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    child = pexpect.spawn(sys.executable, ["-m", "loopctl", "run", "hi", "--provider", "openai"],
                          env=env, cwd=str(ROOT), encoding="utf-8", timeout=60, dimensions=(24, 80))
    child.logfile_read = log
    try:
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 1
    rows, _ = screen(log.getvalue(), 80)
    text = " ".join(r.strip() for r in rows if r)
    assert text.startswith("error: no OpenAI API key: OPENAI_API_KEY is not set."), rows
    assert "export OPENAI_API_KEY=" in text and "leave out --provider" in text
    assert "api_key=" not in text and "turns" not in text
    assert all(len(r) < 80 for r in rows), rows


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
@pytest.mark.parametrize("where", [["run"], ["chat"]])
def test_version_works_where_the_docs_list_it(where: list[str]) -> None:
    import loopctl

    assert "| `--version` |" in (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    child = pexpect.spawn(sys.executable, ["-m", "loopctl", *where, "--version"], env=_env(),
                          cwd=str(ROOT), encoding="utf-8", timeout=60, dimensions=(24, 80))
    try:
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    assert child.before.strip() == f"loopctl {loopctl.__version__}"
