"""The ``loopctl`` command's terminal view: output and the live run view.

It owns what a person sees while a command runs. ``Console`` serializes
every write to stdout/stderr behind one lock (styles only when colour is
on, a closed pipe never breaks the run) and keeps the person's input apart
from the output: on a terminal the bottom line is a status line (the tool
spinner or the model's waiting line, then the half-typed guidance or the
chat prompt), cut to the terminal's width so ``\\r\\x1b[K`` always erases
it, and redrawn below each new line; status notes that arrive while a
streamed sentence is mid-line wait for its line to end, so no note splits
a word. ``LiveView`` is the observer that turns a run's events into lines;
``RunFacts`` notes what the summary needs. It never touches a loop:
``loopctl.demo.cli`` wires these pieces to one.
"""

from __future__ import annotations

import json
import os
import threading
import time
import unicodedata
from collections.abc import Mapping
from typing import IO, Any, Callable, Optional

from loopctl.demo.terminal import StdinLines
from loopctl.observers import (
    AttemptReset,
    LoopDetectedEvent,
    Observer,
    Response,
    RetryScheduled,
    RunStart,
    SteeringDelivered,
    StreamFailure,
    StreamSuccess,
    ThinkingDelta,
    ToolCallReceived,
    ToolInputDelta,
    ToolPost,
    ToolPre,
    TurnStart,
)

_STYLES = {"dim": "2", "bold": "1", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}
_FRAMES = "|/-\\"
_GUIDANCE_PREFIX = "» "


def cells(text: str) -> int:
    """Terminal columns ``text`` takes (wide East Asian characters take two)."""
    return sum(_cell(ch) for ch in text)


def _cell(ch: str) -> int:
    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in "WF" else 1


def fit(text: str, width: int, *, keep_end: bool = False) -> str:
    """``text`` cut to at most ``width`` columns ("…" marks the cut)."""
    if cells(text) <= width:
        return text
    if width <= 0:
        return ""
    chars = reversed(text) if keep_end else iter(text)
    kept: list[str] = []
    used = 1  # the ellipsis
    for ch in chars:
        if used + _cell(ch) > width:
            break
        kept.append(ch)
        used += _cell(ch)
    if keep_end:
        return "…" + "".join(reversed(kept))
    return "".join(kept) + "…"


def seconds(value: float) -> str:
    """A wait in words a person reads: "12 s", "1.5 s", "0.2 s"."""
    if value >= 10:
        return f"{value:.0f} s"
    text = f"{value:.1f}"
    return (text[:-2] if text.endswith(".0") else text) + " s"


class Console:
    """Serialized terminal output: streamed text, lines, notes and the status line.

    Args:
        out, err: the output streams.
        color: use ANSI styles.
        tty: ``out`` is a terminal (the status line is drawn).
        columns: the terminal width; asked from ``out`` at each draw when None.
    """

    def __init__(self, out: IO[str], err: IO[str], *, color: bool, tty: bool,
                 columns: Optional[int] = None) -> None:
        self.out, self.err = out, err
        self.color, self.tty = color, tty
        self.editing = False  # the input line is drawn here (stdin in KeysMode)
        self.lock = threading.RLock()
        self._columns = columns
        self._at_bol = {id(out): True, id(err): True}
        self._mid_text = False  # out is mid-line in streamed text
        self._pending: list[tuple[str, tuple[str, ...], bool]] = []
        self._status_shown = False
        self._frame = 0
        self._running: dict[str, tuple[str, float]] = {}
        self._waiting: Optional[tuple[str, float]] = None
        self._input = ""
        self._prompt: Optional[str] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def style(self, text: str, *names: str) -> str:
        """``text`` wrapped in ANSI styles when colour is on."""
        if not self.color or not names:
            return text
        return f"\x1b[{';'.join(_STYLES[n] for n in names)}m{text}\x1b[0m"

    def columns(self) -> int:
        """The terminal's width (80 when it cannot be asked)."""
        if self._columns is not None:
            return self._columns
        try:
            return os.get_terminal_size(self.out.fileno()).columns or 80
        except (AttributeError, OSError, ValueError):
            return 80

    # -- writing (the lock is held) ----------------------------------------------

    def _write(self, stream: IO[str], text: str) -> None:
        if not text:
            return
        self._erase_status()
        self._raw(stream, text)
        self._at_bol[id(stream)] = text.endswith("\n")

    def _raw(self, stream: IO[str], text: str) -> None:
        try:
            try:
                stream.write(text)
            except UnicodeEncodeError:
                enc = getattr(stream, "encoding", None) or "ascii"
                stream.write(text.encode(enc, "replace").decode(enc))
            stream.flush()
        except (OSError, ValueError):  # a closed pipe must not break the run
            pass

    def _erase_status(self) -> None:
        if self._status_shown:
            self._raw(self.out, "\r\x1b[K")
            self._status_shown = False

    def _flush_pending(self) -> None:
        pending, self._pending = self._pending, []
        for text, styles, err in pending:
            self._line(text, styles, err)

    def _line(self, text: str, styles: tuple[str, ...], err: bool) -> None:
        stream = self.err if err else self.out
        if not self._at_bol[id(stream)]:
            self._write(stream, "\n")
        self._write(stream, self.style(text, *styles) + "\n")
        if not err:
            self._mid_text = False

    def _after_write(self) -> None:
        if self._pending and self._at_bol[id(self.out)]:
            self._flush_pending()
        if self._input or self._prompt is not None:
            self._draw_status()

    # -- output --------------------------------------------------------------------

    def text(self, delta: str) -> None:
        """Streamed reply text, as it arrives (it ends the model's waiting line)."""
        with self.lock:
            self._waiting = None
            if self._pending and "\n" in delta:
                head, tail = delta.rsplit("\n", 1)
                self._write(self.out, head + "\n")
                self._flush_pending()
                delta = tail
            self._write(self.out, delta)
            self._mid_text = not self._at_bol[id(self.out)]
            self._after_write()

    def line(self, text: str, *styles: str, err: bool = False) -> None:
        """One full line (a newline first if the cursor is mid-line)."""
        with self.lock:
            self._line(text, styles, err)
            self._after_write()

    def note(self, text: str, *styles: str, err: bool = False) -> None:
        """A status line from outside the run: shown at the next line start.

        While streamed text is mid-line the note waits for the line to end,
        so it never splits the model's words.
        """
        with self.lock:
            if self._mid_text and not self._at_bol[id(self.out)]:
                self._pending.append((text, styles, err))
                return
            self._line(text, styles, err)
            self._after_write()

    def end_text(self) -> None:
        """Finish a line of streamed text (and show the notes that waited for it)."""
        with self.lock:
            if not self._at_bol[id(self.out)]:
                self._write(self.out, "\n")
            self._mid_text = False
            self._after_write()

    def end_lines(self) -> None:
        """Leave both streams at a line start with no status line (before exiting)."""
        with self.lock:
            self._prompt, self._input = None, ""
            self._erase_status()
            for stream in (self.out, self.err):
                if not self._at_bol[id(stream)]:
                    self._write(stream, "\n")
            self._mid_text = False
            self._flush_pending()

    def prompt(self, text: str, *styles: str, err: bool = False) -> None:
        """The chat prompt: on the status line when editing, else ``text`` with no newline."""
        with self.lock:
            if self.editing and not err:
                self._prompt = text
                self._draw_status()
            else:
                self._write(self.err if err else self.out, self.style(text, *styles))

    def submit(self, line: str) -> None:
        """A typed line was entered at the chat prompt: it stays in the scrollback."""
        with self.lock:
            if self._prompt is not None:
                prompt, self._prompt = self._prompt, None
                self._line(prompt + line, (), False)

    def edit(self, text: str) -> None:
        """The half-typed line changed (the line editor's callback)."""
        with self.lock:
            self._input = text
            self._draw_status()

    # -- the status line (terminal only) -----------------------------------------

    def waiting(self, label: Optional[str]) -> None:
        """Show ``label`` with the elapsed time until the model answers (None: stop)."""
        with self.lock:
            if label is None:
                self._waiting = None
                return
            started = self._waiting[1] if self._waiting is not None else time.monotonic()
            self._waiting = (label, started)
        self._ensure_spinner()

    def tool_started(self, call_id: str, label: str) -> None:
        """A tool call began running; the spinner shows it until it ends."""
        with self.lock:
            self._waiting = None
            self._running[call_id] = (label, time.monotonic())
        self._ensure_spinner()

    def tool_finished(self, call_id: str) -> None:
        """A tool call ended."""
        with self.lock:
            self._running.pop(call_id, None)

    def _ensure_spinner(self) -> None:
        if self.tty and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._spin, name="loopctl-cli-spinner", daemon=True)
            self._thread.start()

    def status_text(self) -> str:
        """The status line as drawn now, cut to the terminal's width (no styles)."""
        with self.lock:
            left, right = self._status_parts()
            return left + right

    def _status_parts(self) -> tuple[str, str]:
        now = time.monotonic()
        label, started = "", now
        if self._running:
            label = ", ".join(label for label, _ in self._running.values())
            started = min(t for _, t in self._running.values())
        elif self._waiting is not None:
            label, started = self._waiting
        if self._prompt is not None:
            right = self._prompt + self._input
        elif self._input:
            right = _GUIDANCE_PREFIX + self._input
        else:
            right = ""
        # The last column stays free: a line that fills it wraps on some terminals.
        avail = max(self.columns() - 1, 1)
        if right:
            if not label or cells(right) + 2 + 12 > avail:
                return "", fit(right, avail, keep_end=True)
            avail -= cells(right) + 2
        if not label:
            return "", right
        # The label gives way first: the frame and the elapsed time always show.
        frame = _FRAMES[self._frame % len(_FRAMES)]
        clock = f" {now - started:.1f}s"
        text = fit(f"{frame} {' '.join(label.split())}", max(avail - len(clock), 1)) + clock
        return fit(text, avail) + ("  " if right else ""), right

    def _draw_status(self) -> None:
        if not self.tty or not self._at_bol[id(self.out)] or not self._at_bol[id(self.err)]:
            return
        left, right = self._status_parts()
        if not left and not right:
            self._erase_status()
            return
        self._raw(self.out, "\r\x1b[K" + self.style(left, "dim") + right)
        self._status_shown = True

    def _spin(self) -> None:
        while not self._stop.wait(0.1):
            with self.lock:
                if self._running or self._waiting is not None:
                    self._frame += 1
                    self._draw_status()
                elif self._status_shown and not self._input and self._prompt is None:
                    self._erase_status()

    def close(self) -> None:
        """Stop the spinner thread, clear the status line, show waiting notes."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self.lock:
            self._running.clear()
            self._waiting = None
            self._erase_status()
            if self._pending:
                if not self._at_bol[id(self.out)]:
                    self._write(self.out, "\n")
                self._mid_text = False
                self._flush_pending()


def _args_text(input: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in input.items())


def _one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class RunFacts(Observer):
    """What the command needs to know about the run in flight.

    ``started`` is set at the first turn (the steering slot is open by
    then; ``on_first_turn`` runs just before it is set); ``usage_known``/``usage_unknown`` count served turns with and
    without token usage from the server.
    """

    def __init__(self, on_first_turn: Optional[Callable[[], None]] = None) -> None:
        self.started = threading.Event()
        self._on_first_turn = on_first_turn
        self.usage_known = 0
        self.usage_unknown = 0

    def on_run_start(self, event: RunStart) -> None:
        """A new run: the counts start again."""
        self.usage_known = self.usage_unknown = 0

    def on_turn_start(self, event: TurnStart) -> None:
        """The slot is open by now: typed guidance may be pushed."""
        if not self.started.is_set():
            if self._on_first_turn is not None:
                self._on_first_turn()
            self.started.set()

    def on_stream_success(self, event: StreamSuccess) -> None:
        """A served turn: did the server say how many tokens it took?"""
        if event.usage is None:
            self.usage_unknown += 1
        else:
            self.usage_known += 1


class LiveView(Observer):
    """Shows a run as it happens: waiting, tool calls, results, guidance, retries.

    Args:
        console: where it draws.
        streaming: reply text arrives through the text streamer (else whole).
        model: the model name the waiting line shows.
    """

    def __init__(self, console: Console, *, streaming: bool, model: str = "the model") -> None:
        self.console = console
        self.streaming = streaming
        self.model = model
        self._labels: dict[str, str] = {}

    def on_turn_start(self, event: TurnStart) -> None:
        """The model is asked: a waiting line until its first token."""
        self.console.waiting(f"waiting for {self.model}")

    def on_thinking_delta(self, event: ThinkingDelta) -> None:
        """The model is answering (reasoning)."""
        self.console.waiting(None)

    def on_tool_input_delta(self, event: ToolInputDelta) -> None:
        """The model is answering (a tool call)."""
        self.console.waiting(None)

    def on_response(self, event: Response) -> None:
        """Without streaming, a turn's text is shown whole."""
        self.console.waiting(None)
        if self.streaming:
            self.console.end_text()
        elif event.text:
            self.console.line(event.text)

    def on_stream_failure(self, event: StreamFailure) -> None:
        """The model call failed for good."""
        self.console.waiting(None)

    def on_retry_scheduled(self, event: RetryScheduled) -> None:
        """A failed model call will be tried again: its cause and the wait."""
        self.console.line(f"  [{_one_line(event.cause)}: retrying in {seconds(event.wait_s)}, "
                          f"attempt {event.attempt}/{event.max_attempts}]", "yellow")
        self.console.waiting(f"retrying {event.model or self.model} "
                             f"(attempt {event.attempt}/{event.max_attempts})")

    def on_tool_call_received(self, event: ToolCallReceived) -> None:
        """The call and its arguments, as soon as the model asks."""
        c = self.console
        c.waiting(None)
        self._labels[event.call_id] = f"{event.tool}({_args_text(event.input)})"
        c.line(f"  {c.style('>', 'cyan')} {c.style(event.tool, 'cyan', 'bold')}({_args_text(event.input)})")

    def on_tool_pre(self, event: ToolPre) -> None:
        """The spinner starts for this call."""
        self.console.tool_started(event.call_id, self._labels.get(event.call_id, event.tool))

    def on_tool_post(self, event: ToolPost) -> None:
        """The result (or soft error) and how long it took."""
        c = self.console
        c.tool_finished(event.call_id)
        mark = c.style("!", "red") if event.is_error else c.style("<", "green")
        body = c.style(_one_line(event.output), "red") if event.is_error else _one_line(event.output)
        c.line(f"  {mark} {event.tool}: {body} {c.style(f'({event.duration_ms:.0f} ms)', 'dim')}")

    def on_steering(self, event: SteeringDelivered) -> None:
        """Guidance landed in the conversation."""
        for msg in event.messages:
            self.console.line(f"  [guidance delivered: {msg.text}]", "yellow")

    def on_attempt_reset(self, event: AttemptReset) -> None:
        """A stream attempt failed; the reply starts again."""
        self.console.line(f"  [stream interrupted; retry {event.attempt}]", "yellow")

    def on_loop_detected(self, event: LoopDetectedEvent) -> None:
        """A repeating tool pattern."""
        self.console.line(f"  [repeating tool calls: {event.pattern} x{event.repetitions}]", "yellow")


__all__ = ["Console", "LiveView", "RunFacts", "StdinLines", "cells", "fit", "seconds"]
