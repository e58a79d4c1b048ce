"""Test scaffolding for the MCP tests: the suite server, its stderr lines, HTTP.

``SUITE`` is ``suite_server.py``'s path; ``suite_stdio()`` an ``MCPServer``
that runs it. ``StderrLines`` is a logging handler on a server's logger
(``loopctl.mcp.<name>``) that lets a test wait for a line the server wrote
to stderr — the synchronisation point for "the server has the call" and
"the server saw the cancellation". ``http_suite_server()`` runs the suite
server on streamable HTTP on a socket the test bound to 127.0.0.1.
Every wait is bounded by ``WAIT``; reaching it fails the test.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from loopctl.contrib.mcp import MCPServer

SUITE = str(Path(__file__).resolve().parent / "suite_server.py")
WAIT = 10.0


def suite_stdio(*args: str, **options: Any) -> MCPServer:
    """An ``MCPServer`` running the suite server over stdio (named ``suite``)."""
    options.setdefault("name", "suite")
    return MCPServer.stdio(sys.executable, [SUITE, *args], **options)


class StderrLines(logging.Handler):
    """Collects the lines a server wrote to stderr; ``wait_for(text)`` blocks until one contains it."""

    def __init__(self, server: MCPServer) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._logger = server.logger

    def __enter__(self) -> StderrLines:
        self._logger.addHandler(self)
        self._old_level = self._logger.level
        self._logger.setLevel(logging.DEBUG)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._old_level)

    def emit(self, record: logging.LogRecord) -> None:
        with self._cond:
            self.lines.append(record.getMessage())
            self._cond.notify_all()

    def wait_for(self, text: str) -> str:
        """The first line containing ``text`` (fails after ``WAIT``)."""
        with self._cond:
            found = self._cond.wait_for(lambda: next((ln for ln in self.lines if text in ln), None), WAIT)
        assert found, f"server never wrote {text!r} to stderr; it wrote {self.lines[-5:]}"
        return found


@contextmanager
def http_suite_server() -> Iterator[str]:
    """Run the suite server on streamable HTTP; yields its ``/mcp`` URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, SUITE, "--http-fd", str(sock.fileno())],
        pass_fds=[sock.fileno()],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    sock.close()  # the server holds its own copy; connections queue until it accepts
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(WAIT)
