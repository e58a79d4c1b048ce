"""The ``loopctl`` command, driven in-process through ``main()``.

Output streams are in-memory; stdin is a real pipe (the POSIX reader path)
or a ``StringIO`` (the plain readline path). Tests that need something to
happen mid-run hook the output: when a given text is written, the hook acts
(types a line into stdin, raises SIGINT, opens a gate). No sleeps.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import threading
from collections.abc import Iterator
from typing import Any, Callable, Optional

import pytest

from loopctl.demo.cli import Command, StdinLines, build_parser, main
from loopctl.demo.tools import AddTool
from loopctl.tools.base import ToolContext

ANSI = re.compile(r"\x1b\[")


class Out(io.StringIO):
    """A text stream that can pose as a terminal and fire hooks on what it shows."""

    def __init__(self, tty: bool = False) -> None:
        super().__init__()
        self._tty = tty
        self._hooks: list[tuple[Any, Callable[[], None]]] = []
        self._lock = threading.Lock()

    def isatty(self) -> bool:
        return self._tty

    def when(self, pattern: str, action: Callable[[], None]) -> Out:
        """Run ``action`` once, the first time ``pattern`` (a regex) appears."""
        self._hooks.append((re.compile(pattern), action))
        return self

    def write(self, s: str) -> int:
        n = super().write(s)
        with self._lock:
            text = self.getvalue()
            due = [h for h in self._hooks if h[0].search(text)]
            for h in due:
                self._hooks.remove(h)
        for _, action in due:
            action()
        return n


@pytest.fixture
def pipe() -> Iterator[tuple[io.TextIOWrapper, int]]:
    r, w = os.pipe()
    reader = os.fdopen(r, "r")
    yield reader, w
    reader.close()
    try:
        os.close(w)
    except OSError:
        pass


def _main(argv: list[str], stdin: Any = None, out: Optional[Out] = None,
          env: Optional[dict[str, str]] = None) -> tuple[int, str, str]:
    out = out if out is not None else Out()
    err = Out()
    code = main(argv, stdin=stdin if stdin is not None else io.StringIO(""), stdout=out,
                stderr=err, env=env if env is not None else {})
    return code, out.getvalue(), err.getvalue()


def test_run_streams_the_answer_shows_the_tool_and_a_summary() -> None:
    code, out, err = _main(["run", "What is 12 + 30?"])
    assert code == 0, err
    assert "  > add(a=12, b=30)\n" in out
    assert re.search(r"  < add: 42 \(\d+ ms\)\n", out)
    assert "12 + 30 = 42." in out
    assert re.search(r"-- 2 turns, 1 tool call, \d+ tokens, \d+\.\d\ds\n$", out)
    assert not ANSI.search(out), "no colours when stdout is not a terminal"


def test_run_with_stdin_at_eof_or_missing_does_not_hang() -> None:
    for stdin in (io.StringIO(""), None):
        code, out, _ = _main(["run", "multiply 6 by 7"], stdin=stdin)
        assert code == 0 and "6 * 7 = 42." in out


def test_piped_guidance_is_pushed_and_shown_as_queued(pipe: Any) -> None:
    rfile, w = pipe
    out = Out().when(r"> add\(", lambda: os.write(w, b"be brief\n"))
    code, text, _ = _main(["run", "What is 12 + 30?", "--tool-delay", "60"], stdin=rfile,
                          out=out.when(r"guidance queued: be brief", lambda: os.kill(os.getpid(), signal.SIGINT)))
    assert code == 130
    assert "[guidance queued: be brief]" in text


def test_ctrl_c_cancels_prints_cancelled_and_leftovers_exit_130(pipe: Any) -> None:
    rfile, w = pipe
    out = Out()
    out.when(r"> add\(a=12", lambda: os.write(w, b"second thought\n"))
    out.when(r"guidance queued: second thought", lambda: os.kill(os.getpid(), signal.SIGINT))
    code, text, _ = _main(["run", "What is 12 + 30?", "--tool-delay", "60"], stdin=rfile, out=out)
    assert code == 130
    assert "\ncancelled\n" in text
    assert "guidance not delivered:\n  - second thought\n" in text
    assert "= 42" not in text, "the cancelled run never answered"


def test_typed_guidance_is_delivered_at_the_next_turn(pipe: Any) -> None:
    rfile, w = pipe
    out, err = Out(), Out()
    args = build_parser().parse_args(["run", "(2+3)*4"])
    cmd = Command(args, rfile, out, err, {})
    pushed = threading.Event()  # set once the CLI has shown the line as queued

    class GatedAdd(AddTool):
        def call(self, input: Any, ctx: ToolContext) -> str:
            assert pushed.wait(10)  # the tool holds turn 0 until the line is in
            return super().call(input, ctx)

    cmd.loop.tools.register(GatedAdd())
    out.when(r"> add\(a=2", lambda: os.write(w, b"use small steps\n"))
    out.when(r"guidance queued", pushed.set)
    reader = StdinLines(rfile, cmd.on_line).start()
    try:
        code = cmd.run_once("(2+3)*4")
    finally:
        reader.stop()
        cmd.close()
    text = out.getvalue()
    assert code == 0, err.getvalue()
    assert text.index("[guidance queued: use small steps]") < text.index(
        "[guidance delivered: use small steps]") < text.index("Noted: use small steps.")
    assert "(2 + 3) * 4 = 20." in text


def test_json_mode_prints_one_event_object_per_line() -> None:
    code, out, err = _main(["run", "What is 12 + 30?", "--json"])
    assert code == 0
    events = [json.loads(line) for line in out.splitlines()]
    types = [e["type"] for e in events]
    assert types[0] == "run_start" and types[-1] == "run_end"
    assert {"turn_start", "text_delta", "tool_call_received", "tool_pre", "tool_post"} <= set(types)
    text = "".join(e["delta"] for e in events if e["type"] == "text_delta")
    assert "12 + 30 = 42." in text
    assert events[-1]["success"] is True
    assert "-- 2 turns" in err, "the summary goes to stderr in JSON mode"


def test_no_stream_prints_whole_replies() -> None:
    code, out, _ = _main(["run", "What is 12 + 30?", "--no-stream", "--json"])
    assert code == 0
    types = {json.loads(line)["type"] for line in out.splitlines()}
    assert "text_delta" not in types and "response" in types
    code, out, _ = _main(["run", "What is 12 + 30?", "--no-stream"])
    assert code == 0 and "12 + 30 = 42.\n" in out


def test_a_loop_error_exits_1_with_its_message() -> None:
    code, out, err = _main(["run", "What is (2+3)*4?", "--max-turns", "1"])
    assert code == 1
    assert "error: the run stopped after 1 model call without a final answer.\n" in err
    assert "  Give it more with --max-turns N" in err


def test_colours_only_on_a_terminal_and_never_with_no_color() -> None:
    code, out, _ = _main(["run", "What is 12 + 30?", "--delay", "0"], out=Out(tty=True))
    assert code == 0 and ANSI.search(out)
    code, out, _ = _main(["run", "What is 12 + 30?", "--delay", "0"], out=Out(tty=True),
                         env={"NO_COLOR": "1"})
    assert code == 0 and not ANSI.search(out)


def test_spinner_shows_the_running_tool_on_a_terminal_only(pipe: Any) -> None:
    rfile, _ = pipe
    out = Out(tty=True)
    args = build_parser().parse_args(["run", "What is 12 + 30?", "--delay", "0"])
    cmd = Command(args, rfile, out, Out(), {"NO_COLOR": "1"})
    spun = threading.Event()

    class HeldAdd(AddTool):
        def call(self, input: Any, ctx: ToolContext) -> str:
            assert spun.wait(10)
            return super().call(input, ctx)

    cmd.loop.tools.register(HeldAdd())
    out.when(r"\r\x1b\[K[|/\\-] add\(a=12, b=30\) \d+\.\ds", spun.set)
    try:
        assert cmd.run_once("What is 12 + 30?") == 0
    finally:
        cmd.close()
    assert "12 + 30 = 42." in out.getvalue()
    code, plain, _ = _main(["run", "What is 12 + 30?"])
    assert code == 0 and "\r" not in plain


def test_chat_keeps_one_session_and_answers_each_prompt() -> None:
    stdin = io.StringIO("What is 12 + 30?\nmultiply 6 by 7\n/quit\nWhat is 1 + 1?\n")
    code, out, _ = _main(["chat", "--json"], stdin=stdin)
    assert code == 0
    events = [json.loads(line) for line in out.splitlines()]
    starts = [e for e in events if e["type"] == "run_start"]
    assert [e["input"] for e in starts] == ["What is 12 + 30?", "multiply 6 by 7"]
    assert len({e["session_id"] for e in starts}) == 1, "one loop, history kept"
    text = "".join(e["delta"] for e in events if e["type"] == "text_delta")
    assert "12 + 30 = 42." in text and "6 * 7 = 42." in text


def test_chat_ends_at_eof_after_its_runs() -> None:
    code, out, _ = _main(["chat"], stdin=io.StringIO("What is 2 + 2?\n"))
    assert code == 0 and "2 + 2 = 4." in out


def test_usage_errors() -> None:
    code, out, _ = _main([])
    assert code == 2 and "usage: loopctl" in out
    code, out, err = _main(["run", "x", "--base-url", "http://127.0.0.1:1/v1"])
    assert code == 2 and out == "" and "--base-url applies to --provider openai or anthropic" in err


def test_openai_provider_talks_to_a_local_server(monkeypatch: pytest.MonkeyPatch) -> None:
    providers = pytest.importorskip("loopctl.providers")
    if not hasattr(providers, "OpenAIClient"):
        pytest.skip("loopctl.providers.OpenAIClient is not exported yet")
    from fakeserver import FakeServer, Stream, openai_stream

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    with FakeServer() as server:
        server.push(Stream(openai_stream("Hello from the server: 42.")))
        code, out, err = _main(["run", "hi", "--provider", "openai", "--model", "gpt-test",
                                "--base-url", server.openai_url, "--system", "be terse"])
    assert code == 0, err
    assert "Hello from the server: 42." in out
    assert "sk-test-not-a-real-key" not in out + err


def test_first_ctrl_c_cancels_the_run_a_second_exits_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from loopctl.demo import cli

    exits: list[int] = []
    monkeypatch.setattr(cli.os, "_exit", exits.append)
    cancels: list[Optional[str]] = []

    class Handle:
        def cancel(self, reason: Optional[str] = None) -> None:
            cancels.append(reason)

    before = signal.getsignal(signal.SIGINT)
    with cli.Interrupts() as interrupts:
        assert signal.getsignal(signal.SIGINT) == interrupts._on_sigint
        interrupts._on_sigint(signal.SIGINT, None)        # before the run has a handle
        interrupts.attach(Handle())                        # applied as soon as it does
        assert cancels == ["interrupted (Ctrl-C)"] and exits == []
        interrupts.poll()                                  # once
        assert cancels == ["interrupted (Ctrl-C)"]
        interrupts._on_sigint(signal.SIGINT, None)
        assert exits == [130]
    assert signal.getsignal(signal.SIGINT) == before


def test_ctrl_c_during_a_run_only_counts_in_the_handler_and_poll_cancels(monkeypatch: pytest.MonkeyPatch) -> None:
    # The handler runs between any two steps of the main thread, maybe inside
    # the lock a cancel takes: it must not cancel there itself.
    from loopctl.demo import cli

    cancels: list[Optional[str]] = []

    class Handle:
        def cancel(self, reason: Optional[str] = None) -> None:
            cancels.append(reason)

    with cli.Interrupts() as interrupts:
        interrupts.attach(Handle())
        interrupts.poll()
        assert cancels == []
        interrupts._on_sigint(signal.SIGINT, None)
        assert cancels == []
        interrupts.poll()
        interrupts.poll()
        assert cancels == ["interrupted (Ctrl-C)"]


# -- piped guidance is never lost -------------------------------------------------


def _report(text: str, line: str) -> str:
    """How the command reported a guidance line: delivered, not delivered, or lost."""
    delivered = f"[guidance delivered: {line}]" in text
    listed = f"\n  - {line}\n" in text and "guidance not delivered" in text
    assert not (delivered and listed), text
    return "delivered" if delivered else "not delivered" if listed else "lost"


def test_a_hundred_piped_runs_all_report_their_guidance() -> None:
    outcomes: dict[str, int] = {}
    for i in range(100):
        r, w = os.pipe()
        out = Out()
        if i % 2 == 0:  # `echo "show each step" | loopctl run ...`: the line is there first
            os.write(w, b"show each step\n")
            os.close(w)
        else:  # the line comes while the final answer streams: the run may finish first
            out.when(r"= 20", lambda w=w: (os.write(w, b"show each step\n"), os.close(w)))
        with os.fdopen(r, "r") as rfile:
            code, text, err = _main(["run", "What is (2 + 3) * 4?"], stdin=rfile, out=out)
        assert code == 0, err
        outcome = _report(text, "show each step")
        assert outcome != "lost", f"run {i}: the guidance line vanished:\n{text}"
        if i % 2 == 0:
            assert "[guidance queued: show each step]" in text
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert outcomes.get("delivered", 0) >= 50, outcomes  # a line that is there first always lands


def test_a_line_read_before_the_first_turn_is_delivered(pipe: Any) -> None:
    rfile, w = pipe
    os.write(w, b"show each step\nand be brief\n")
    code, text, _ = _main(["run", "What is (2 + 3) * 4?", "--tool-delay", "0.05"], stdin=rfile)
    assert code == 0
    for line in ("show each step", "and be brief"):
        assert text.index(f"[guidance queued: {line}]") < text.index(f"[guidance delivered: {line}]")


def test_piped_output_never_splits_a_word_with_a_status_line(pipe: Any) -> None:
    rfile, w = pipe
    out = Out().when(r"To w", lambda: os.write(w, b"use fewer words\n"))
    code, text, _ = _main(["run", "What is (2 + 3) * 4?", "--delay", "0.01"], stdin=rfile, out=out)
    assert code == 0
    assert "To work out (2 + 3) * 4" in text
    lines = text.splitlines()
    assert "  [guidance queued: use fewer words]" in lines
    assert all(not line.startswith("  [") or line.endswith("]") for line in lines), lines


def test_a_note_waits_for_the_streamed_line_to_end() -> None:
    from loopctl.demo.view import Console

    out = Out()
    c = Console(out, out, color=False, tty=False)
    c.text("To w")
    c.note("  [guidance queued: x]")
    c.text("ork it out")
    c.text(" now.\nNext")
    c.note("  [second]")
    c.end_text()
    assert out.getvalue() == "To work it out now.\n  [guidance queued: x]\nNext\n  [second]\n"


# -- the status line ----------------------------------------------------------------


def test_status_line_is_cut_to_the_width_and_keeps_the_clock_and_typed_text() -> None:
    from loopctl.demo.view import Console, cells, fit

    assert fit("abcdef", 4) == "abc…" and fit("abcdef", 4, keep_end=True) == "…def"
    assert cells("日本") == 4 and cells(fit("日本語テキスト", 5)) <= 5
    for cols in (80, 40, 20, 10):
        c = Console(Out(), Out(), color=False, tty=True, columns=cols)
        c.tool_started("1", 'lookup(name="France", field="population")')
        c.tool_started("2", 'lookup(name="Spain", field="population")')
        text = c.status_text()
        assert cells(text) < cols and re.search(r"\d\.\ds$", text), (cols, text)
        c.edit("keep it short")
        text = c.status_text()
        assert cells(text) < cols and text.endswith("short"), (cols, text)
        c.close()


def test_waiting_line_names_the_model_until_the_first_token() -> None:
    from loopctl.demo.view import Console, LiveView
    from loopctl.observers import TurnStart

    c = Console(Out(), Out(), color=False, tty=True, columns=80)
    view = LiveView(c, streaming=True, model="gpt-test")
    view.on_turn_start(TurnStart("s", "r", 0, "hi"))
    assert re.fullmatch(r"[|/\\-] waiting for gpt-test \d\.\ds", c.status_text())
    c.text("Hel")
    assert c.status_text() == ""
    c.close()


def test_each_retry_is_shown_with_its_cause_and_wait() -> None:
    from loopctl.demo.view import Console, LiveView
    from loopctl.observers import RetryScheduled

    out = Out()
    c = Console(out, out, color=False, tty=True, columns=80)
    view = LiveView(c, streaming=True, model="gpt-test")
    view.on_retry_scheduled(RetryScheduled("s", "r", 0, "gpt-test", "rate limited (429)", 12.0, 2, 6))
    view.on_retry_scheduled(RetryScheduled("s", "r", 0, "gpt-test",
                                           "connection refused at http://127.0.0.1:1/v1", 1.5, 3, 6))
    text = out.getvalue()
    assert "  [rate limited (429): retrying in 12 s, attempt 2/6]\n" in text
    assert "  [connection refused at http://127.0.0.1:1/v1: retrying in 1.5 s, attempt 3/6]\n" in text
    assert "retrying gpt-test (attempt 3/6)" in c.status_text()
    c.close()


def test_line_editor_edits_and_ends_lines() -> None:
    from loopctl.demo.terminal import LineEditor

    ed = LineEditor()
    assert ed.feed(b"keep it shrt\x7f\x7frt") == [] and ed.text == "keep it shrt"
    assert ed.feed(b"\x17short\x1b[D\r") == ["keep it short"] and ed.text == ""
    assert ed.feed("caf\u00e9".encode()[:4]) == [] and ed.feed("caf\u00e9".encode()[4:] + b"\n") == ["caf\u00e9"]
    assert ed.feed(b"abc\x15\x04") == [None]


# -- arguments and the summary --------------------------------------------------------


def test_version_and_help_list_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    import loopctl

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"loopctl {loopctl.__version__}"
    assert main(["run", "--help"]) == 0
    assert "--tool-delay SECONDS" in capsys.readouterr().out
    code, out, _ = _main(["chat", "--help"])  # in-process: to the streams given, never exiting the process
    assert code == 0 and "--session NAME" in out


@pytest.mark.parametrize("argv, message", [
    (["run", "x", "--max-turns", "0"], "--max-turns: must be >= 1"),
    (["run", "x", "--max-turns", "two"], "--max-turns: must be a whole number"),
    (["run", "x", "--provider", "openai", "--base-url", "localhost:8000/v1"], "--base-url: must start with http"),
    (["run", "x", "--tool-delay", "-1"], "--tool-delay: must be a finite number of seconds >= 0, got '-1'"),
    (["run", "x", "--tool-delay", "inf"], "--tool-delay: must be a finite number of seconds >= 0, got 'inf'"),
    (["run", "x", "--tool-delay", "1e400"], "--tool-delay: must be a finite number of seconds >= 0, got '1e400'"),
    (["run", "x", "--tool-delay", "nan"], "--tool-delay: must be a finite number of seconds >= 0, got 'nan'"),
    (["run", "x", "--tool-delay", "soon"], "--tool-delay: must be a finite number of seconds >= 0, got 'soon'"),
    (["chat", "--session", ""], "argument --session: must be a non-empty name"),
    (["run", "--ask", "mulitply", "What is 6 * 7?"],
     "--ask: no tool named 'mulitply' (the tools are add, lookup, multiply; 'all' asks before every tool)"),
    (["run", "--subagent", "--ask", "multiply", "--ask", "calculatr", "What is 6 * 7?"],
     "--ask: no tool named 'calculatr' (the tools are add, calculator, lookup, multiply;"),
    (["run", "x", "--provider", "openai", "--base-url", "me:sk-secret@host/v1"], "'<credentials>@host/v1'"),
    (["run", "x", "--bogus"], "unrecognized arguments: --bogus"),
    (["chat", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_argument_errors_exit_2_at_parse_time_with_the_subcommand_usage(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _main(argv)
    assert code == 2 and out == ""
    assert f"usage: loopctl {argv[0]} " in err and message in err, err
    assert capsys.readouterr() == ("", "")  # nothing went to the process's own streams
    assert "sk-secret" not in err


def test_model_with_the_offline_provider_warns() -> None:
    code, out, err = _main(["run", "What is 12 + 30?", "--model", "gpt-4o"])
    assert code == 0 and "12 + 30 = 42." in out
    assert "warning: --model 'gpt-4o' only renames the offline demo model" in err


def test_tokens_unknown_when_the_server_sends_no_usage_and_empty_reply_flagged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from fakeserver import FakeServer, Stream, openai_stream

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    with FakeServer() as server:
        server.push(Stream(openai_stream("", usage=None)))
        code, out, err = _main(["run", "hi", "--provider", "openai", "--model", "gpt-test",
                                "--base-url", server.openai_url])
    assert code == 0, err
    assert "(the model's final reply was empty)" in out
    assert re.search(r"-- 1 turn, 0 tool calls, tokens unknown \(the server sent no usage\), ", out), out


def test_a_waiting_line_names_the_model_until_its_first_token(monkeypatch: pytest.MonkeyPatch) -> None:
    from fakeserver import FakeServer, Gate, Stream, openai_stream

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    first_token = threading.Event()
    out = Out(tty=True).when(r"\r\x1b\[K[|/\\-] waiting for gpt-slow \d+\.\ds", first_token.set)
    with FakeServer() as server:
        server.push(Stream([Gate(first_token, timeout=30), *openai_stream("Here it is.")]))
        code, text, err = _main(["run", "hi", "--provider", "openai", "--model", "gpt-slow",
                                 "--base-url", server.openai_url], out=out, env={"NO_COLOR": "1"})
    assert code == 0, err
    assert first_token.is_set(), "the waiting line was drawn while the server held the reply"
    assert text.index("waiting for gpt-slow") < text.index("Here it is.")
    assert "sk-test-not-a-real-key" not in text + err


def test_control_characters_from_untrusted_text_are_shown_escaped() -> None:
    from loopctl.demo.view import Console, LiveView
    from loopctl.observers import ToolCallReceived, ToolPost

    out = Out()
    c = Console(out, out, color=False, tty=False)
    view = LiveView(c, streaming=True)
    c.text("fine\n\x1b[2Jcleared?\r\x07\n")
    view.on_tool_call_received(ToolCallReceived("s", "r", 0, "c1", "add\x1b[31m", {"a": "\x9b2J"}))
    view.on_tool_post(ToolPost("s", "r", 0, "c1", "add", 1, False, 1.0, "\x1b]0;title\x07ok", "h"))
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text and "\r" not in text
    assert "fine\n\\x1b[2Jcleared?\\x0d\\x07\n" in text
    assert '  > add\\x1b[31m(a="\\x9b2J")' in text
    assert "  < add: \\x1b]0;title\\x07ok (1 ms)" in text


def test_rows_break_between_words_and_only_a_too_long_word_is_cut() -> None:
    from loopctl.demo.wrap import break_row, visible_cells

    rows, rest = break_row("add(2, 3) returned 5, so the sum is plus five.", 12)
    assert rows == ["add(2, 3)", "returned 5,", "so the sum", "is plus"] and rest == "five."
    assert break_row("  [x] abcdefghijklmnop", 10) == (["  [x]", "abcdefghij"], "klmnop")
    assert visible_cells("\x1b[33mhi\x1b[0m 日本") == 7
