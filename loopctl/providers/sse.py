"""A pure Server-Sent Events decoder: bytes in, events out.

Owns the SSE framing rules (WHATWG "event stream interpretation"): lines end
with LF, CRLF or CR, even when a CRLF pair is split across two network
chunks; ``data:`` lines of one event join with ``\\n``; a line starting with
``:`` is a comment; ``event:``, ``id:`` and ``retry:`` fields; a blank line
dispatches the event. It does no IO and never waits: every complete event in
the bytes fed so far comes out of ``feed()`` at once, so nothing the server
already sent is held back. A line longer than ``max_line`` (1 MiB, counted
in characters) raises ``ModelError``, however the stream was cut into reads.
``[DONE]`` is just data here; clients interpret it. One plain path: each
read is split into lines and each line is read by the rules.
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


class SSEDecoder:
    """Incremental SSE decoder (mutates on ``feed``; not thread-safe).

    Bytes are decoded as UTF-8 incrementally (a character split across two
    reads survives; invalid bytes become U+FFFD), then split into lines; the
    partial last line is carried to the next read.

    Args:
        max_line: the longest line accepted, in characters (1 MiB by
            default); any longer line raises, whatever the chunking.
    """

    __slots__ = ("_buf", "_data", "_event", "_retry", "_skip_lf", "_started", "_utf8", "last_event_id", "max_line")

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self.last_event_id: Optional[str] = None
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._buf = ""
        self._data: Optional[list[str]] = None
        self._event: Optional[str] = None
        self._retry: Optional[int] = None
        self._skip_lf = False  # the last read ended with CR: a LF first in the next completes it
        self._started = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Decode ``chunk`` and return every event it completes, in order.

        Raises:
            ModelError: a line grew past ``max_line``.
        """
        text = self._utf8.decode(chunk)
        if not text:
            return []
        if not self._started:
            self._started = True
            if text[0] == "\ufeff":
                text = text[1:]
        if self._skip_lf:
            self._skip_lf = False
            if text[:1] == "\n":
                text = text[1:]
        if "\r" in text:
            self._skip_lf = text[-1:] == "\r"
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        lines = (self._buf + text).split("\n") if self._buf else text.split("\n")
        self._buf = lines.pop()  # the partial last line ("" after a line end)
        limit = self.max_line
        if len(self._buf) > limit:
            self._too_long(len(self._buf))
        out: list[SSEEvent] = []
        for line in lines:
            if len(line) > limit:
                self._too_long(len(line))
            self._line(line, out)
        return out

    def flush(self) -> list[SSEEvent]:
        """At end of stream: the event whose lines all ended but whose blank
        line never came. A trailing partial line is dropped (it was cut)."""
        self._buf = ""
        out: list[SSEEvent] = []
        self._dispatch(out)
        return out

    def _too_long(self, length: int) -> None:
        self._buf = ""
        self._data = self._event = self._retry = None
        raise ModelError(f"SSE line longer than {self.max_line} characters (got {length})")

    def _line(self, line: str, out: list[SSEEvent]) -> None:
        if not line:
            self._dispatch(out)  # a blank line ends the event
            return
        if line[:5] == "data:":
            value = line[6:] if line[5:6] == " " else line[5:]
            if self._data is None:
                self._data = [value]
            else:
                self._data.append(value)
            return
        if line[:1] == ":":
            return  # comment
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
