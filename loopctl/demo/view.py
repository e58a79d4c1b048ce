"""The ``loopctl`` command's terminal view: output, the live run view, stdin.

It owns what a person sees and types while a command runs: ``Console``
serializes every write to stdout/stderr behind one lock (a newline first
when the cursor is mid-line, styles only when colour is on, a closed pipe
never breaks the run) and draws the tool spinner on a terminal from its
``loopctl-cli-spinner`` thread; ``LiveView`` is the observer that turns a
run's events into lines; ``StdinLines`` reads typed lines on a daemon
``loopctl-cli-stdin`` thread that ends at EOF or at ``stop()``. It never
touches a loop: ``loopctl.demo.cli`` wires these pieces to one.
"""

from __future__ import annotations

import json
import os
import select
import threading
import time
from collections.abc import Mapping
from typing import IO, Any, Callable, Optional

from loopctl.observers import (
    AttemptReset,
    LoopDetectedEvent,
    Observer,
    Response,
    RetryScheduled,
    SteeringDelivered,
    ToolCallReceived,
    ToolPost,
    ToolPre,
    TurnStart,
)

_STYLES = {"dim": "2", "bold": "1", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}
_FRAMES = "|/-\\"


class Console:
    """Serialized terminal output: streamed text, notes, the tool spinner."""

    def __init__(self, out: IO[str], err: IO[str], *, color: bool, tty: bool) -> None:
        self.out, self.err = out, err
        self.color, self.tty = color, tty
        self.lock = threading.RLock()
        self._at_bol = {id(out): True, id(err): True}
        self._spinner_shown = False
        self._running: dict[str, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def style(self, text: str, *names: str) -> str:
        """``text`` wrapped in ANSI styles when colour is on."""
        if not self.color or not names:
            return text
        return f"\x1b[{';'.join(_STYLES[n] for n in names)}m{text}\x1b[0m"

    def _write(self, stream: IO[str], text: str) -> None:
        if not text:
            return
        if self._spinner_shown:
            self._raw(self.out, "\r\x1b[K")
            self._spinner_shown = False
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

    def text(self, delta: str) -> None:
        """Streamed reply text, as it arrives."""
        with self.lock:
            self._write(self.out, delta)

    def line(self, text: str, *styles: str, err: bool = False) -> None:
        """One full line (a newline first if the cursor is mid-line)."""
        stream = self.err if err else self.out
        with self.lock:
            if not self._at_bol[id(stream)]:
                self._write(stream, "\n")
            self._write(stream, self.style(text, *styles) + "\n")

    def end_text(self) -> None:
        """Finish a line of streamed text."""
        with self.lock:
            if not self._at_bol[id(self.out)]:
                self._write(self.out, "\n")

    def prompt(self, text: str, *styles: str, err: bool = False) -> None:
        """``text`` with no newline after it (the chat prompt)."""
        with self.lock:
            self._write(self.err if err else self.out, self.style(text, *styles))

    # -- the spinner (terminal only) --------------------------------------------

    def tool_started(self, call_id: str, label: str) -> None:
        """A tool call began running; the spinner shows it until it ends."""
        with self.lock:
            self._running[call_id] = (label, time.monotonic())
        if self.tty and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._spin, name="loopctl-cli-spinner", daemon=True)
            self._thread.start()

    def tool_finished(self, call_id: str) -> None:
        """A tool call ended."""
        with self.lock:
            self._running.pop(call_id, None)

    def _spin(self) -> None:
        frame = 0
        while not self._stop.wait(0.1):
            with self.lock:
                if not self._running or not self._at_bol[id(self.out)]:
                    continue
                labels = ", ".join(label for label, _ in self._running.values())
                started = min(t for _, t in self._running.values())
                text = f"{_FRAMES[frame % 4]} {labels} {time.monotonic() - started:.1f}s"
                self._raw(self.out, "\r\x1b[K" + self.style(text, "dim"))
                self._spinner_shown = True
                frame += 1

    def close(self) -> None:
        """Stop the spinner thread and clear its line."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self.lock:
            self._running.clear()
            if self._spinner_shown:
                self._raw(self.out, "\r\x1b[K")
                self._spinner_shown = False


def _args_text(input: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in input.items())


def _one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class LiveView(Observer):
    """Shows a run as it happens: tool calls, results, guidance, retries."""

    def __init__(self, console: Console, *, streaming: bool) -> None:
        self.console = console
        self.streaming = streaming
        self.started = threading.Event()
        self._labels: dict[str, str] = {}
        self._retry_shown = False

    def on_turn_start(self, event: TurnStart) -> None:
        """The slot is open by now: typed guidance may be pushed."""
        self.started.set()

    def on_response(self, event: Response) -> None:
        """Without streaming, a turn's text is shown whole."""
        if self.streaming:
            self.console.end_text()
        elif event.text:
            self.console.line(event.text)

    def on_tool_call_received(self, event: ToolCallReceived) -> None:
        """The call and its arguments, as soon as the model asks."""
        c = self.console
        label = f"{event.tool}({_args_text(event.input)})"
        self._labels[event.call_id] = label
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

    def on_retry_scheduled(self, event: RetryScheduled) -> None:
        """A failed model call will be retried: say why, when, and which try."""
        self._retry_shown = True
        self.console.line(
            f"  [{event.cause}; retry {event.attempt}/{event.max_attempts} in {event.wait_s:.1f}s]", "yellow"
        )

    def on_attempt_reset(self, event: AttemptReset) -> None:
        """The reply starts again (after a retry already shown, or for the rescue)."""
        if self._retry_shown:
            self._retry_shown = False
            return
        self.console.line(f"  [stream interrupted; asking again without streaming (try {event.attempt + 1})]",
                          "yellow")

    def on_loop_detected(self, event: LoopDetectedEvent) -> None:
        """A repeating tool pattern."""
        self.console.line(f"  [repeating tool calls: {event.pattern} x{event.repetitions}]", "yellow")


class StdinLines:
    """Reads lines from a stream on a daemon thread and hands each to ``on_line``.

    On POSIX it waits on the file descriptor together with a wake-up pipe, so
    ``stop()`` ends the thread at once; elsewhere (or for a stream without a
    descriptor) it reads lines until EOF. ``on_line(None)`` marks EOF.
    """

    def __init__(self, stream: Optional[IO[str]], on_line: Callable[[Optional[str]], None]) -> None:
        self._stream = stream
        self._on_line = on_line
        self._stopped = False
        self._wake: Optional[tuple[int, int]] = None
        self._thread = threading.Thread(target=self._main, name="loopctl-cli-stdin", daemon=True)

    def start(self) -> StdinLines:
        """Start reading (a missing stream reads as EOF at once)."""
        fd = self._fd()
        if fd is not None:
            self._wake = os.pipe()
        self._thread.start()
        return self

    def _fd(self) -> Optional[int]:
        if self._stream is None or os.name != "posix":
            return None
        try:
            return self._stream.fileno()
        except (AttributeError, OSError, ValueError):
            return None

    def _main(self) -> None:
        try:
            if self._stream is not None:
                fd = self._fd()
                if fd is not None and self._wake is not None:
                    self._read_fd(fd, self._wake[0])
                else:
                    for line in iter(self._stream.readline, ""):
                        if self._stopped:
                            return
                        self._emit(line)
        except (OSError, ValueError):
            pass  # a closed or unreadable stdin is just EOF
        finally:
            if self._wake is not None:
                os.close(self._wake[0])
            if not self._stopped:
                self._on_line(None)

    def _read_fd(self, fd: int, wake: int) -> None:
        buf = b""
        while not self._stopped:
            ready, _, _ = select.select([fd, wake], [], [])
            if wake in ready:
                return
            try:
                chunk = os.read(fd, 4096)
            except BlockingIOError:
                continue
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf and not self._stopped:
                raw, buf = buf.split(b"\n", 1)
                self._emit(raw.decode("utf-8", "replace"))
        if buf.strip() and not self._stopped:
            self._emit(buf.decode("utf-8", "replace"))

    def _emit(self, line: str) -> None:
        line = line.strip()
        if line:
            self._on_line(line)

    def stop(self) -> None:
        """End the thread (at once on POSIX) and wait for it."""
        self._stopped = True
        if self._wake is not None:
            try:
                os.write(self._wake[1], b"x")
                os.close(self._wake[1])
            except OSError:
                pass
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(1.0 if self._wake is not None else 0.05)


__all__ = ["Console", "LiveView", "StdinLines"]
