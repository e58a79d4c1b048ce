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

import codecs
from collections.abc import Iterable, Iterator
from typing import NamedTuple, Optional

from loopctl.errors import ModelError

DONE = "[DONE]"
MAX_LINE = 1 << 20


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

    Bytes are decoded as UTF-8 incrementally (a character split across two
    reads survives; invalid bytes become U+FFFD), then framed as text.

    Args:
        max_line: the longest line accepted (characters; 1 MiB by default).
    """

    __slots__ = ("_buf", "_data", "_event", "_retry", "_skip_lf", "_started", "_utf8", "last_event_id", "max_line")

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self.last_event_id: Optional[str] = None
        self._buf = ""
        self._data: Optional[list[str]] = None
        self._event: Optional[str] = None
        self._retry: Optional[int] = None
        self._skip_lf = False
        self._started = False
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Decode ``chunk`` and return every event it completes, in order.

        Raises:
            ModelError: a line grew past ``max_line``.
        """
        if not chunk:
            return []
        text = self._utf8.decode(chunk)
        if not self._started:
            if not text:
                return []
            self._started = True
            if text[0] == "\ufeff":
                text = text[1:]
        if self._skip_lf:
            # The previous read ended with CR: a LF here completes that CRLF.
            self._skip_lf = False
            if text[:1] == "\n":
                text = text[1:]
        if "\r" in text:
            if text[-1:] == "\r":
                self._skip_lf = True
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        buf = self._buf + text if self._buf else text
        out: list[SSEEvent] = []
        blocks = buf.split("\n\n")
        rest = blocks.pop()
        if blocks:
            first = 0
            if self._data is not None or self._event is not None or self._retry is not None:
                # An event is in progress: its remaining lines are the first block.
                self._lines(blocks[0].split("\n"), out)
                self._dispatch(out)
                first = 1
            last_id = self.last_event_id
            if not first:
                # The common case: every block is one "data: ..." line.
                fast = [
                    _new_event(SSEEvent, (b[6:], None, last_id, None))
                    for b in blocks
                    if b[:6] == "data: " and "\n" not in b
                ]
                if len(fast) == len(blocks):
                    out = fast
                    first = len(blocks)
            append = out.append
            for k in range(first, len(blocks)):
                block = blocks[k]
                # Fast paths: the usual "data: ..." and "event: x" + "data: ..." events.
                if block[:6] == "data: ":
                    if "\n" not in block:
                        append(_new_event(SSEEvent, (block[6:], None, last_id, None)))
                        continue
                elif block[:7] == "event: ":
                    nl = block.find("\n")
                    if block[nl + 1 : nl + 7] == "data: " and block.find("\n", nl + 1) < 0:
                        append(_new_event(SSEEvent, (block[nl + 7 :], block[7:nl], last_id, None)))
                        continue
                self._lines(block.split("\n"), out)
                self._dispatch(out)
                last_id = self.last_event_id
        if rest:
            lines = rest.split("\n")
            rest = lines.pop()
            if lines:
                self._lines(lines, out)
            if len(rest) > self.max_line:
                self._buf = ""
                raise ModelError(
                    f"SSE line longer than {self.max_line} bytes (got {len(rest)} characters without a line end)"
                )
        self._buf = rest
        return out

    def flush(self) -> list[SSEEvent]:
        """At end of stream: the event whose lines all ended but whose blank
        line never came. A trailing partial line is dropped (it was cut)."""
        self._buf = ""
        out: list[SSEEvent] = []
        self._dispatch(out)
        return out

    def _lines(self, lines: list[str], out: list[SSEEvent]) -> None:
        for line in lines:
            if not line:
                self._dispatch(out)  # a blank line ends the event
                continue
            if line[:5] == "data:":
                value = line[6:] if line[5:6] == " " else line[5:]
                if self._data is None:
                    self._data = [value]
                else:
                    self._data.append(value)
                continue
            if line[:1] == ":":
                continue  # comment
            name, sep, value = line.partition(":")
            if sep and value[:1] == " ":
                value = value[1:]
            if name == "event":
                self._event = value
            elif name == "data":  # "data" with no colon: an empty data line
                if self._data is None:
                    self._data = [""]
                else:
                    self._data.append("")
            elif name == "id":
                if "\x00" not in value:
                    self.last_event_id = value
            elif name == "retry":
                if value.isdigit() and value.isascii():
                    self._retry = int(value)
            # Unknown fields are ignored, as the standard says.

    def _dispatch(self, out: list[SSEEvent]) -> None:
        data = self._data
        if data is not None:
            text = data[0] if len(data) == 1 else "\n".join(data)
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
