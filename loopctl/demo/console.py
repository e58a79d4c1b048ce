"""The ``loopctl`` command's console: every write, and the bottom status line.

``Console`` serializes every write to stdout/stderr behind one lock (styles
only when colour is on, a closed pipe never breaks the run) and keeps the
person's input apart from the output: on a terminal the bottom line is a
status line (the tool spinner or the model's waiting line, then the
half-typed guidance or the chat prompt), cut to the terminal's width so
``\\r\\x1b[K`` always erases it, redrawn below each new line by its
``loopctl-cli-spinner`` thread or at once after a key. A note that arrives
while streamed text is mid-line waits for the line to end, so no note
splits a word. On a terminal the console wraps what it writes between
words (``loopctl.demo.wrap``), so it knows the row the cursor is on: while
streamed text is mid-row and a person types, the status line with the
typed text is drawn on the row below it, and taken away again (cursor up)
before the text goes on.
"""

from __future__ import annotations

import os
import re
import threading
import time
import unicodedata
from typing import IO, Optional

from loopctl.demo.wrap import break_row, visible_cells

_STYLES = {"dim": "2", "bold": "1", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}
_FRAMES = "|/-\\"
_GUIDANCE_PREFIX = "» "


# C0/C1 control characters but newline and tab: untrusted text (a model's
# reply, a tool's output, piped guidance) must not move the cursor or
# restyle the terminal, so they are shown escaped.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with control characters (but newline and tab) shown as ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


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


class _StatusLine:
    """The status line's state: what it shows and the spinner thread that redraws it."""

    def __init__(self) -> None:
        self.shown = False
        self.below = False  # drawn on the row below a part-written row
        self.frame = 0
        self.running: dict[str, tuple[str, float]] = {}
        self.waiting: Optional[tuple[str, float]] = None
        self.stop = threading.Event()
        self.thread: Optional[threading.Thread] = None


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
        self.wrap = tty  # break rows between words (off for output meant for programs)
        self.lock = threading.RLock()
        self._columns = columns
        self._at_bol = {id(out): True, id(err): True}
        self._mid_text = False  # out is mid-line in streamed text
        self._row = ""  # what out's current row shows (it ends where the cursor is)
        self._pending: list[tuple[str, tuple[str, ...], bool]] = []
        self._input = ""
        self._prompt: Optional[str] = None
        self._status = _StatusLine()

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
        if stream is self.out:
            shown = self._wrap(text) if self.wrap else text
            row = text.rsplit("\n", 1)[-1] if "\n" in text else self._row + text
            self._raw(stream, shown)
            if not self.wrap:
                self._row = row
        else:
            self._raw(stream, text)
        self._at_bol[id(stream)] = text.endswith("\n")

    def _wrap(self, text: str) -> str:
        """``text`` for the terminal, its rows broken between words; tracks the row."""
        width = max(self.columns() - 1, 8)  # the last column stays free: no margin wrap
        parts: list[str] = []
        for i, piece in enumerate(text.split("\n")):
            if i:
                parts.append("\n")
                self._row = ""
            if not piece:
                continue
            row = self._row + piece
            if visible_cells(row) <= width:
                parts.append(piece)
                self._row = row
                continue
            # Rewrite the row from its start: a word begun at its end moves down whole.
            rows, rest = break_row(row, width)
            parts.append("\r" + rows[0] + "\x1b[K" + "".join("\n" + r for r in rows[1:]) + "\n" + rest)
            self._row = rest
        return "".join(parts)

    def _needs_newline(self, stream: IO[str]) -> bool:
        """True when ``stream``'s cursor is not at the start of an empty row."""
        if self._at_bol[id(stream)]:
            return False
        return stream is not self.out or bool(self._row)

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
        if self._status.shown:
            if self._status.below:
                # Back up to the part-written row; rewriting it puts the cursor at its end.
                self._raw(self.out, "\r\x1b[K\x1b[A\r" + self._row)
                self._status.below = False
            else:
                self._raw(self.out, "\r\x1b[K")
            self._status.shown = False

    def _flush_pending(self) -> None:
        pending, self._pending = self._pending, []
        for text, styles, err in pending:
            self._line(text, styles, err)

    def _line(self, text: str, styles: tuple[str, ...], err: bool) -> None:
        stream = self.err if err else self.out
        if self._needs_newline(stream):
            self._write(stream, "\n")
        if err and self.wrap:  # out's rows are wrapped as they are written; err's here, whole
            rows, rest = break_row(text, max(self.columns() - 1, 8))
            text = "\n".join([*rows, rest])
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
        delta = printable(delta)
        with self.lock:
            self._status.waiting = None
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
            if self._needs_newline(self.out):
                self._write(self.out, "\n")
            self._at_bol[id(self.out)] = True
            self._mid_text = False
            self._after_write()

    def end_lines(self) -> None:
        """Leave both streams at a line start with no status line (before exiting)."""
        with self.lock:
            self._prompt, self._input = None, ""
            self._erase_status()
            for stream in (self.out, self.err):
                if self._needs_newline(stream):
                    self._write(stream, "\n")
                self._at_bol[id(stream)] = True
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
                self._status.waiting = None
                return
            started = self._status.waiting[1] if self._status.waiting is not None else time.monotonic()
            self._status.waiting = (label, started)
        self._ensure_spinner()

    def tool_started(self, call_id: str, label: str) -> None:
        """A tool call began running; the spinner shows it until it ends."""
        with self.lock:
            self._status.waiting = None
            self._status.running[call_id] = (label, time.monotonic())
        self._ensure_spinner()

    def tool_finished(self, call_id: str) -> None:
        """A tool call ended."""
        with self.lock:
            self._status.running.pop(call_id, None)

    def _ensure_spinner(self) -> None:
        if self.tty and self._status.thread is None:
            self._status.stop.clear()
            self._status.thread = threading.Thread(target=self._spin, name="loopctl-cli-spinner", daemon=True)
            self._status.thread.start()

    def status_text(self) -> str:
        """The status line as drawn now, cut to the terminal's width (no styles)."""
        with self.lock:
            left, right = self._status_parts()
            return left + right

    def _status_parts(self) -> tuple[str, str]:
        now = time.monotonic()
        label, started = "", now
        if self._status.running:
            label = ", ".join(label for label, _ in self._status.running.values())
            started = min(t for _, t in self._status.running.values())
        elif self._status.waiting is not None:
            label, started = self._status.waiting
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
        frame = _FRAMES[self._status.frame % len(_FRAMES)]
        clock = f" {now - started:.1f}s"
        text = fit(f"{frame} {' '.join(label.split())}", max(avail - len(clock), 1)) + clock
        return fit(text, avail) + ("  " if right else ""), right

    def _draw_status(self) -> None:
        if not self.tty or self._needs_newline(self.err):
            return
        # Mid-row in streamed text: the typed line goes on the row below, so
        # it stays visible as typed while the model's sentence goes on.
        below = self._needs_newline(self.out)
        if below and not (self.editing and self.wrap):  # only a wrapped row is one row high
            return
        left, right = self._status_parts()
        if not left and not right:
            self._erase_status()
            return
        status = self.style(left, "dim") + right
        if below and not self._status.below:
            self._erase_status()
            self._raw(self.out, "\r\n\x1b[K" + status)
            self._status.below = True
        else:
            self._raw(self.out, "\r\x1b[K" + status)
        self._status.shown = True

    def _spin(self) -> None:
        while not self._status.stop.wait(0.1):
            with self.lock:
                if self._status.running or self._status.waiting is not None:
                    self._status.frame += 1
                    self._draw_status()
                elif self._status.shown and not self._input and self._prompt is None:
                    self._erase_status()

    def close(self) -> None:
        """Stop the spinner thread, clear the status line, show waiting notes."""
        self._status.stop.set()
        if self._status.thread is not None:
            self._status.thread.join()
            self._status.thread = None
        with self.lock:
            self._status.running.clear()
            self._status.waiting = None
            self._erase_status()
            if self._pending:
                if self._needs_newline(self.out):
                    self._write(self.out, "\n")
                self._at_bol[id(self.out)] = True
                self._mid_text = False
                self._flush_pending()


__all__ = ["Console", "cells", "fit", "printable", "seconds"]
