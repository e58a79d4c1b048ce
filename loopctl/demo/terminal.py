"""Reading what a person types: ``StdinLines`` and the terminal's input mode.

``StdinLines`` reads lines on a daemon ``loopctl-cli-stdin`` thread that
ends at EOF or at ``stop()``. Given an ``on_edit`` callback it edits the
line itself (the terminal is in ``KeysMode``: no echo, no line buffering),
so the view draws the half-typed line where live output cannot overwrite
it. ``KeysMode`` restores the terminal on exit, and ``restore_terminal()``
restores it from a signal handler before a hard exit. Nothing here touches
a loop.
"""

from __future__ import annotations

import codecs
import os
import select
import threading
from typing import IO, Any, Callable, Optional

# Restorers of terminals in KeysMode, for a hard exit (os._exit skips finally).
_RESTORERS: list[Callable[[], None]] = []


def restore_terminal() -> None:
    """Put every terminal in ``KeysMode`` back the way it was (idempotent)."""
    for restore in list(_RESTORERS):
        restore()


class KeysMode:
    """A terminal that hands over each key, unechoed; signals (Ctrl-C) stay on.

    A no-op where the stream is not a POSIX terminal (``active`` says which).
    """

    def __init__(self, stream: Optional[IO[str]]) -> None:
        self.active = False
        self._fd: Optional[int] = None
        self._saved: Any = None
        if stream is None or os.name != "posix":
            return
        try:
            fd = stream.fileno()
            if not os.isatty(fd):
                return
            import termios

            self._saved = termios.tcgetattr(fd)
        except (AttributeError, OSError, ValueError, ImportError):
            return
        self._fd = fd

    def __enter__(self) -> KeysMode:
        if self._fd is None:
            return self
        import termios

        attrs = termios.tcgetattr(self._fd)
        attrs[3] &= ~(termios.ICANON | termios.ECHO)  # lflags
        attrs[6][termios.VMIN] = 1
        attrs[6][termios.VTIME] = 0
        try:
            termios.tcsetattr(self._fd, termios.TCSADRAIN, attrs)
        except termios.error:
            return self
        self.active = True
        _RESTORERS.append(self._restore)
        return self

    def _restore(self) -> None:
        if self.active and self._fd is not None:
            import termios

            try:
                termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)
            except (termios.error, OSError):
                pass
            self.active = False

    def __exit__(self, *exc: object) -> None:
        self._restore()
        if self._restore in _RESTORERS:
            _RESTORERS.remove(self._restore)


class LineEditor:
    """The half-typed line: keys in, finished lines out.

    Enter finishes a line; Backspace, Ctrl-U (the whole line) and Ctrl-W (a
    word) edit it; Ctrl-D on an empty line is end of input; other control
    keys and escape sequences (arrows) are ignored.
    """

    def __init__(self) -> None:
        self.text = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._escape = ""

    def feed(self, data: bytes) -> list[Optional[str]]:
        """Apply keys; returns the lines they finished (``None``: end of input)."""
        done: list[Optional[str]] = []
        for ch in self._decoder.decode(data):
            if self._escape:
                self._escape += ch
                # An escape sequence ends at a letter or ~ (CSI), or after ESC + one key.
                if len(self._escape) == 2 and ch not in "[O":
                    self._escape = ""
                elif len(self._escape) > 2 and (ch.isalpha() or ch == "~"):
                    self._escape = ""
                continue
            if ch == "\x1b":
                self._escape = ch
            elif ch in "\r\n":
                done.append(self.text)
                self.text = ""
            elif ch in "\x7f\x08":
                self.text = self.text[:-1]
            elif ch == "\x15":
                self.text = ""
            elif ch == "\x17":
                self.text = self.text.rstrip()
                self.text = self.text[: self.text.rfind(" ") + 1] if " " in self.text else ""
            elif ch == "\x04":
                if not self.text:
                    done.append(None)
            elif ch == "\t":
                self.text += " "
            elif ch >= " ":
                self.text += ch
        return done


class StdinLines:
    """Reads lines from a stream on a daemon thread and hands each to ``on_line``.

    On POSIX it waits on the file descriptor together with a wake-up pipe, so
    ``stop()`` ends the thread at once; elsewhere (or for a stream without a
    descriptor) it reads lines until EOF. ``on_line(None)`` marks EOF. With
    ``on_edit`` (a terminal in ``KeysMode``) it edits the line itself and
    calls ``on_edit(text)`` with the half-typed line after every key.
    """

    def __init__(self, stream: Optional[IO[str]], on_line: Callable[[Optional[str]], None],
                 on_edit: Optional[Callable[[str], None]] = None) -> None:
        self._stream = stream
        self._on_line = on_line
        self._on_edit = on_edit
        self._editor = LineEditor() if on_edit is not None else None
        self._stopped = False
        self._started = False
        self._wake: Optional[tuple[int, int]] = None
        self._buf = b""
        self._caught_up = threading.Event()
        self._thread = threading.Thread(target=self._main, name="loopctl-cli-stdin", daemon=True)

    def start(self) -> StdinLines:
        """Start reading (a missing stream reads as EOF at once)."""
        fd = self._fd()
        if fd is not None:
            self._wake = os.pipe()
        self._started = True
        self._thread.start()
        return self

    def wait_caught_up(self, timeout: float) -> bool:
        """Wait until every line already waiting in the stream is handed on.

        True once the reader found the stream with nothing more to read (or
        at its end); False after ``timeout`` seconds.
        """
        return self._caught_up.wait(timeout)

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
            self._caught_up.set()
            if self._wake is not None:
                os.close(self._wake[0])
            if not self._stopped:
                self._on_line(None)

    def _read_fd(self, fd: int, wake: int) -> None:
        while not self._stopped:
            ready, _, _ = select.select([fd, wake], [], [], 0)
            if not ready:
                self._caught_up.set()
                ready, _, _ = select.select([fd, wake], [], [])
            if wake in ready:
                return
            try:
                chunk = os.read(fd, 4096)
            except BlockingIOError:
                continue
            if not chunk:
                break
            if self._take(chunk):
                return
        if self._buf.strip() and not self._stopped:
            self._emit(self._buf.decode("utf-8", "replace"))
            self._buf = b""

    def _take(self, chunk: bytes) -> bool:
        """Hand on the lines in ``chunk``; True at end of input (Ctrl-D)."""
        if self._editor is not None and self._on_edit is not None:
            for line in self._editor.feed(chunk):
                if line is None:
                    return True
                self._on_edit("")
                self._emit(line)
            self._on_edit(self._editor.text)
            return False
        self._buf += chunk
        while b"\n" in self._buf and not self._stopped:
            raw, self._buf = self._buf.split(b"\n", 1)
            self._emit(raw.decode("utf-8", "replace"))
        return False

    def _emit(self, line: str) -> None:
        line = line.strip()
        if line:
            self._on_line(line)

    def stop(self) -> list[str]:
        """End the thread (at once on POSIX) and wait for it.

        Returns:
            the lines that were already waiting in the stream (read without
            blocking, POSIX only) and were never handed on, so a caller can
            report them instead of losing them.
        """
        if self._stopped:
            return []
        self._stopped = True
        if self._wake is not None:
            try:
                os.write(self._wake[1], b"x")
                os.close(self._wake[1])
            except OSError:
                pass
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(1.0 if self._wake is not None else 0.05)
        if self._wake is None or self._thread.is_alive():
            return []
        return self._drain_ready()

    def _drain_ready(self) -> list[str]:
        fd = self._fd()
        data = self._buf
        self._buf = b""
        try:
            while fd is not None and select.select([fd], [], [], 0)[0]:
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                data += chunk
        except (OSError, ValueError):
            pass
        if self._editor is not None:
            lines = [x for x in self._editor.feed(data) if x is not None]
        else:
            lines = data.decode("utf-8", "replace").split("\n")
        return [x.strip() for x in lines if x.strip()]


__all__ = ["KeysMode", "LineEditor", "StdinLines", "restore_terminal"]
