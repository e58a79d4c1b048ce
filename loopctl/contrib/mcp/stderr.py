"""A stdio server's stderr: into a logger, line by line, with a tail kept for errors.

The SDK hands the server process whatever file it is given as ``errlog``;
by default that is the user's terminal. ``StderrSink`` gives it the write
end of a pipe instead and reads the other end on the connection's own
event loop (``add_reader``: no extra thread). Each line is logged at INFO
on ``loopctl.mcp.<server>`` (so nothing reaches a terminal unless the app
configured logging to show it) and the last lines are kept for the error
a failed start raises. Everything but ``__init__`` and ``tail`` runs on the
loop thread.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
from typing import Optional, TextIO

from loopctl.text import masked_head

#: Lines kept for error messages, and the length each is cut to.
TAIL_LINES = 20
LINE_CHARS = 500


class StderrSink:
    """A pipe whose read end feeds ``logger``; ``errlog`` is the end the server writes."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        self._read_fd: Optional[int] = read_fd
        self.errlog: TextIO = os.fdopen(write_fd, "w")
        self._partial = b""
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._eof: Optional[asyncio.Event] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def attach(self) -> None:
        """Start reading on the running loop (call on the loop thread)."""
        self._loop = asyncio.get_running_loop()
        self._eof = asyncio.Event()
        if self._read_fd is not None:
            self._loop.add_reader(self._read_fd, self._on_readable)

    def release_write_end(self) -> None:
        """Close our copy of the write end (the server process holds its own)."""
        if not self.errlog.closed:
            self.errlog.close()

    def _on_readable(self) -> None:
        fd = self._read_fd
        if fd is None:
            return
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._finish()
            return
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > 64 * 1024:  # a server that never ends its line
            lines.append(self._partial)
            self._partial = b""
        for raw in lines:
            self._line(raw)

    def _line(self, raw: bytes) -> None:
        text = raw.decode("utf-8", errors="replace").rstrip("\r")
        if not text.strip():
            return
        self._tail.append(masked_head(text, LINE_CHARS))  # masked, then cut: a key at the cut stays whole
        self._logger.info("%s", text)

    def _finish(self) -> None:
        if self._partial:
            self._line(self._partial)
            self._partial = b""
        fd, self._read_fd = self._read_fd, None
        if fd is not None:
            if self._loop is not None:
                self._loop.remove_reader(fd)
            os.close(fd)
        if self._eof is not None:
            self._eof.set()

    async def drain(self, timeout: float) -> None:
        """Wait (bounded) for the server's end to close, then stop reading."""
        if self._eof is not None and self._read_fd is not None:
            try:
                await asyncio.wait_for(self._eof.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        self.close()

    def close(self) -> None:
        """Stop reading and close both ends (idempotent)."""
        self.release_write_end()
        self._finish()

    def tail(self) -> str:
        """The last lines the server wrote, oldest first."""
        return "\n".join(self._tail)


__all__ = ["StderrSink"]
