"""An MCP server that never answers ``initialize``.

Run as ``python silent_server.py [--deaf]``: it reads (and ignores) every
request until stdin closes; with ``--deaf`` it never reads stdin at all and
blocks until it is killed, so stopping it takes the SDK's whole shutdown
grace. Used to check that a start that gets no answer fails after the
server's ``start_timeout`` and prints nothing to the terminal.
"""

from __future__ import annotations

import sys
import threading


def main() -> None:
    if "--deaf" in sys.argv[1:]:
        threading.Event().wait()  # never reads, never answers: killed by the client
    for _line in sys.stdin:
        pass


if __name__ == "__main__":
    main()
