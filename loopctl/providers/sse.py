"""A pure Server-Sent Events decoder: bytes in, events out.

Owns the SSE framing rules (WHATWG "event stream interpretation"): lines end
with LF, CRLF or CR, even when a CRLF pair is split across two network
chunks; ``data:`` lines of one event join with ``\\n``; a line starting with
``:`` is a comment; ``event:``, ``id:`` and ``retry:`` fields; a blank line
dispatches the event. It does no IO and never waits: every complete event in
the bytes fed so far comes out of ``feed()`` at once, so nothing the server
already sent is held back. A line longer than ``max_line`` (1 MiB) raises
``ModelError``. ``[DONE]`` is just data here; clients interpret it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple, Optional

from loopctl.errors import ModelError

DONE = "[DONE]"
MAX_LINE = 1 << 20
_BOM = b"\xef\xbb\xbf"


class SSEEvent(NamedTuple):
    """One dispatched event: ``data`` (lines joined by ``\\n``), the ``event``
    name (None means the default, "message"), the last event ``id`` seen and
    a ``retry`` hint in milliseconds."""

    data: str
    event: Optional[str] = None
    id: Optional[str] = None
    retry: Optional[int] = None


_new_event = tuple.__new__


class SSEDecoder:
    """Incremental SSE decoder (mutates on ``feed``; not thread-safe).

    Args:
        max_line: the longest line accepted, in bytes.
    """

    __slots__ = ("_buf", "_data", "_event", "_retry", "_skip_lf", "_started", "last_event_id", "max_line")

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self.last_event_id: Optional[str] = None
        self._buf = b""
        self._data: Optional[list[bytes]] = None
        self._event: Optional[str] = None
        self._retry: Optional[int] = None
        self._skip_lf = False
        self._started = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Decode ``chunk`` and return every event it completes, in order.

        Raises:
            ModelError: a line grew past ``max_line`` bytes.
        """
        if not chunk:
            return []
        if not self._started:
            self._started = True
            if chunk.startswith(_BOM):
                chunk = chunk[3:]
        if self._skip_lf:
            # The previous chunk ended with CR: a LF here is that line's CRLF.
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if b"\r" in chunk:
            if chunk[-1:] == b"\r":
                self._skip_lf = True
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._buf + chunk if self._buf else chunk
        out: list[SSEEvent] = []
        blocks = buf.split(b"\n\n")
        rest = blocks.pop()
        if blocks:
            first = 0
            if self._data is not None or self._event is not None or self._retry is not None:
                # An event is in progress: its remaining lines are the first block.
                self._lines(blocks[0].split(b"\n"), out)
                self._dispatch(out)
                first = 1
            append = out.append
            last_id = self.last_event_id
            for k in range(first, len(blocks)):
                block = blocks[k]
                # Fast path: the usual one-line "data: ..." event.
                if block[:6] == b"data: " and b"\n" not in block:
                    append(_new_event(SSEEvent, (block[6:].decode("utf-8", "replace"), None, last_id, None)))
                    continue
                self._lines(block.split(b"\n"), out)
                self._dispatch(out)
                last_id = self.last_event_id
        if rest:
            lines = rest.split(b"\n")
            rest = lines.pop()
            if lines:
                self._lines(lines, out)
            if len(rest) > self.max_line:
                self._buf = b""
                raise ModelError(
                    f"SSE line longer than {self.max_line} bytes (got {len(rest)} bytes without a line end)"
                )
        self._buf = rest
        return out

    def flush(self) -> list[SSEEvent]:
        """At end of stream: the event whose lines all ended but whose blank
        line never came. A trailing partial line is dropped (it was cut)."""
        self._buf = b""
        out: list[SSEEvent] = []
        self._dispatch(out)
        return out

    def _lines(self, lines: list[bytes], out: list[SSEEvent]) -> None:
        for line in lines:
            if not line:
                self._dispatch(out)  # a blank line ends the event
                continue
            if line[:5] == b"data:":
                value = line[6:] if line[5:6] == b" " else line[5:]
                if self._data is None:
                    self._data = [value]
                else:
                    self._data.append(value)
                continue
            if line[:1] == b":":
                continue  # comment
            name, sep, value = line.partition(b":")
            if sep and value[:1] == b" ":
                value = value[1:]
            if name == b"event":
                self._event = value.decode("utf-8", "replace")
            elif name == b"data":  # "data" with no colon: an empty data line
                if self._data is None:
                    self._data = [b""]
                else:
                    self._data.append(b"")
            elif name == b"id":
                if b"\x00" not in value:
                    self.last_event_id = value.decode("utf-8", "replace")
            elif name == b"retry":
                if value.isdigit():
                    self._retry = int(value)
            # Unknown fields are ignored, as the standard says.

    def _dispatch(self, out: list[SSEEvent]) -> None:
        data = self._data
        if data is not None:
            text = (data[0] if len(data) == 1 else b"\n".join(data)).decode("utf-8", "replace")
            out.append(SSEEvent(text, self._event, self.last_event_id, self._retry))
        self._data = None
        self._event = None
        self._retry = None


def iter_events(chunks: Iterable[bytes], max_line: int = MAX_LINE) -> Iterator[SSEEvent]:
    """Decode a whole byte stream (an iterable of chunks) into events."""
    decoder = SSEDecoder(max_line)
    for chunk in chunks:
        yield from decoder.feed(chunk)
    yield from decoder.flush()


__all__ = ["DONE", "MAX_LINE", "SSEDecoder", "SSEEvent", "iter_events"]
