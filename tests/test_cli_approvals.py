"""The ``loopctl`` command asks before ``--ask`` tools: typed, piped or ``--yes`` answers.

Driven in-process through ``main()`` with in-memory output (``Out`` from
test_cli fires a hook when a text appears) and a real pipe or a
``StringIO`` for stdin. No sleeps: an answer is typed when the question
has been shown.
"""

from __future__ import annotations

import io
import json
import os
from typing import Any

from test_cli import Out, _main, pipe  # noqa: F401  (pipe is a fixture)

from loopctl.demo.approval_prompt import call_label, parse_answer


def test_piped_lines_answer_the_questions_in_order() -> None:
    stdin = io.StringIO("y\nnot now\n")
    code, out, _ = _main(["run", "--ask", "add", "What is (1 + 2) * (3 + 4)?"], stdin=stdin)
    assert code == 0
    assert "add(a=1, b=2) needs approval [y/n/reason]" in out
    assert "add(a=3, b=4) needs approval [y/n/reason]" in out
    assert "[approved: add(a=1, b=2)]" in out
    assert "[denied: add(a=3, b=4): not now]" in out
    assert "add(3, 4) failed with the user denied this call: not now" in out
    assert "answers not used" not in out


def test_piped_answers_left_over_are_reported() -> None:
    code, out, _ = _main(["run", "--ask", "add", "What is 12 + 30?"], stdin=io.StringIO("yes\nextra\n"))
    assert code == 0
    assert "[approved: add(a=12, b=30)]" in out and "= 42" in out
    assert "answers not used (no call was waiting):\n  - extra\n" in out


def test_yes_approves_every_call_without_asking() -> None:
    code, out, _ = _main(["run", "--ask", "all", "--yes", "What is (1 + 2) * (3 + 4)?"])
    assert code == 0
    assert "add(a=1, b=2) needs approval: yes (--yes)" in out
    assert "multiply(a=3, b=7) needs approval: yes (--yes)" in out
    assert "= 21" in out and "[denied" not in out


def test_a_line_typed_while_a_call_waits_answers_it_and_others_steer(pipe: Any) -> None:  # noqa: F811
    rfile, w = pipe
    rfile.isatty = lambda: True  # a person at a terminal: lines steer unless a call waits
    out = Out()
    out.when(r"needs approval \[y/n/reason\]", lambda: os.write(w, b"too much\n"))
    out.when(r"\[denied", lambda: os.write(w, b"be brief\n"))  # nothing waits now: guidance
    code, text, _ = _main(["run", "--ask", "add", "What is 12 + 30?"], stdin=rfile, out=out)
    assert code == 0
    assert "[denied: add(a=12, b=30): too much]" in text
    assert "add(12, 30) failed with the user denied this call: too much" in text
    assert "be brief" in text and "[denied: add(a=12, b=30): be brief]" not in text  # guidance, not an answer


def test_json_mode_keeps_stdout_json_and_asks_on_stderr() -> None:
    code, out, err = _main(["run", "--json", "--ask", "add", "What is 12 + 30?"], stdin=io.StringIO("n\n"))
    assert code == 0
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    kinds = [e["type"] for e in events]
    assert kinds.index("approval_requested") < kinds.index("approval_resolved")
    resolved = next(e for e in events if e["type"] == "approval_resolved")
    assert (resolved["approved"], resolved["by"], resolved["reason"]) == (False, "terminal", "denied at the terminal")
    assert "add(a=12, b=30) needs approval [y/n/reason]" in err
    assert "needs approval" not in out


def test_without_ask_nothing_waits_and_piped_lines_stay_guidance() -> None:
    code, out, _ = _main(["run", "What is 12 + 30?"], stdin=io.StringIO("be brief\n"))
    assert code == 0
    assert "needs approval" not in out and "= 42" in out


def test_answers_and_labels() -> None:
    assert parse_answer("Y") == (True, "")
    assert parse_answer(" yes ") == (True, "")
    assert parse_answer("") == (False, "denied at the terminal")
    assert parse_answer("no") == (False, "denied at the terminal")
    assert parse_answer("use the sandbox") == (False, "use the sandbox")
    assert call_label("add", {"a": 1, "b": "x"}) == 'add(a=1, b="x")'
    assert "\x1b" not in call_label("t", {"s": "\x1b[31mred"})  # terminal escapes never reach the screen


def test_calls_still_waiting_when_input_ends_are_denied_never_hang() -> None:
    code, out, _ = _main(["run", "--ask", "add", "What is (1 + 2) * (3 + 4)?"], stdin=io.StringIO("y\n"))
    assert code == 0
    assert "[approved: add(a=1, b=2)]" in out
    assert "[denied: add(a=3, b=4): no answer (input ended)]" in out
    code, out, _ = _main(["run", "--ask", "all", "What is 12 + 30?"], stdin=io.StringIO(""))
    assert code == 0 and "[denied: add(a=12, b=30): no answer (input ended)]" in out
