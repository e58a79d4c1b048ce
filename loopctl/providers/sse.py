"""A pure Server-Sent Events decoder: bytes in, events out.

Owns the SSE framing rules (WHATWG "event stream interpretation"): lines end
with LF, CRLF or CR, even when a CRLF pair is split across two network
chunks; ``data:`` lines of one event join with ``\\n``; a line starting with
``:`` is a comment; ``event:``, ``id:`` and ``retry:`` fields; a blank line
dispatches the event. It does no IO and never waits: every complete event in
the bytes fed so far comes out of ``feed()`` at once, so nothing the server
already sent is held back. A line longer than ``max_line`` (1 MiB, counted
in characters) raises ``ModelError``, however the stream was cut into reads.
``[DONE]`` is just data here; clients interpret it.

Speed: a read is framed with a few bulk string operations, not a Python step
per line, when its events have one of the shapes providers send (see
``SSEDecoder``); the line-by-line rules are the fallback and the reference.
"""

from __future__ import annotations

import operator
from codecs import utf_8_decode as _utf8_decode
from collections.abc import Iterable, Iterator
from itertools import repeat
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
_strip_data = str.removeprefix
_is = operator.is_
_NAMES_KEPT = 64  # distinct event names remembered for the fast path


class SSEDecoder:
    """Incremental SSE decoder (mutates on ``feed``; not thread-safe).

    Bytes are decoded as UTF-8 incrementally (a character split across two
    reads survives; invalid bytes become U+FFFD), then framed as text.

    Each read is framed in bulk: the partial last line is carried to the
    next read; the lines of an event still open from the previous read are
    finished first; then the run of whole events is split at once, with
    fast paths for the two shapes real providers send (every event
    ``data: ...`` alone, or ``event: name`` + ``data: ...``), checked for the
    whole run before they are trusted; anything else (comments, ``id:``,
    multi-line data, missing spaces, extra blank lines) goes through the
    line-by-line rules. The lines of an event not yet ended are kept as
    state, never re-read. Before all that, a read holding exactly one event
    while nothing is carried over (a server flushing each event) is framed
    with a few checks.

    Args:
        max_line: the longest line accepted, in characters (1 MiB by
            default); any longer line raises, whatever the chunking.
    """

    __slots__ = (
        "_buf",
        "_cut_char",
        "_data",
        "_event",
        "_idle",
        "_names",
        "_retry",
        "_skip_lf",
        "_started",
        "last_event_id",
        "max_line",
    )

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self.last_event_id: Optional[str] = None
        self._buf = ""
        self._data: Optional[list[str]] = None
        self._event: Optional[str] = None
        self._retry: Optional[int] = None
        self._skip_lf = False
        self._started = False
        self._idle = False  # started, and nothing carried over: the one-event path may run
        self._cut_char = b""
        self._names: dict[str, str] = {}  # "event: x" line -> "x", for the fast path

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Decode ``chunk`` and return every event it completes, in order.

        Raises:
            ModelError: a line grew past ``max_line``.
        """
        if not chunk:
            return []
        if self._idle:
            # Nothing carried over: a read holding exactly one event (what a
            # server flushing per event sends) is framed right here.
            text, used = _utf8_decode(chunk, "replace", False)
            if used == len(chunk) and text[-2:] == "\n\n" and "\r" not in text and len(text) <= self.max_line:
                last = len(text) - 2
                nl = text.find("\n")
                if nl == last:
                    if text[:6] == "data: ":
                        return [_new_event(SSEEvent, (text[6:nl], None, self.last_event_id, None))]
                elif text[:7] == "event: " and text.startswith("data: ", nl + 1) and text.find("\n", nl + 1) == last:
                    return [_new_event(SSEEvent, (text[nl + 7 : last], text[7:nl], self.last_event_id, None))]
            return self._frame(text, chunk[used:])
        if self._cut_char:  # the start of a character cut off by the last read
            chunk = self._cut_char + chunk
        text, used = _utf8_decode(chunk, "replace", False)
        return self._frame(text, chunk[used:])

    def _frame(self, text: str, cut_char: bytes) -> list[SSEEvent]:
        # The general path: any text, any state; leaves ``_idle`` up to date.
        self._cut_char = cut_char
        out: list[SSEEvent] = []
        if not self._started:
            if not text:
                return out
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
        cut = buf.rfind("\n") + 1  # the complete lines end here
        if len(buf) > self.max_line:
            self._check_lines(buf, cut)
        self._buf = buf[cut:] if cut < len(buf) else ""
        if cut:
            pos = 0
            if self._data is not None or self._event is not None or self._retry is not None:
                pos = self._finish_open(buf, cut, out)
            if pos < cut:
                end = buf.rfind("\n\n", pos, cut)
                if end >= 0:
                    self._whole_events(buf, pos, end, out)
                    pos = end + 2
                if pos < cut:
                    # Lines of an event whose blank line has not come yet.
                    self._lines(buf[pos : cut - 1].split("\n"), out)
        self._idle = not (
            self._buf or cut_char or self._skip_lf
            or self._data is not None or self._event is not None or self._retry is not None
        )
        return out

    def _check_lines(self, buf: str, cut: int) -> None:
        # Only for a buffer past the limit: complete lines and the carried
        # partial line alike may not exceed it, whatever the chunking was.
        longest = max(len(buf) - cut, max(map(len, buf[:cut].split("\n"))))
        if longest > self.max_line:
            self._too_long(longest)

    def _too_long(self, length: int) -> None:
        self._idle = False
        self._buf = ""
        self._data = self._event = self._retry = None
        raise ModelError(f"SSE line longer than {self.max_line} characters (got {length})")

    def _finish_open(self, buf: str, cut: int, out: list[SSEEvent]) -> int:
        # An event is open from the previous read: its lines run to the
        # first blank line. Returns where the text after it starts.
        blank = buf.find("\n\n", 0, cut)
        if blank < 0:
            self._lines(buf[: cut - 1].split("\n"), out)
            return cut
        self._lines(buf[:blank].split("\n"), out)
        self._dispatch(out)
        return blank + 2

    def _whole_events(self, buf: str, start: int, end: int, out: list[SSEEvent]) -> None:
        # buf[start:end] holds lines of whole events, no event open before
        # them; buf[end] ends the last line and buf[end + 1] is the blank
        # line that dispatches the last event.
        last_id = self.last_event_id
        if buf.startswith("data: ", start):
            # Shape 1: "data: x" + blank line, every event. Split at the
            # event boundaries; the shape holds iff no piece has a line end.
            pieces = buf[start + 6 : end].split("\n\ndata: ")
            if "\n" not in "".join(pieces):
                out += map(_new_event, repeat(SSEEvent), zip(pieces, repeat(None), repeat(last_id), repeat(None)))
                return
        elif buf.startswith("event: ", start):
            # Shape 2: "event: name" + "data: x" + blank line, every event.
            lines = buf[start:end].split("\n")
            if len(lines) % 3 == 2 and not any(lines[2::3]):
                heads = lines[0::3]
                known = list(map(self._names.get, heads))
                # all(): the usual case; an empty name is falsy but known.
                names = known if all(known) or None not in known else self._learn_names(heads)
                if names is not None:
                    raw = lines[1::3]
                    datas = list(map(_strip_data, raw, repeat("data: ")))
                    if not any(map(_is, raw, datas)):  # every line had the prefix
                        out += map(_new_event, repeat(SSEEvent), zip(datas, names, repeat(last_id), repeat(None)))
                        return
        for block in buf[start:end].split("\n\n"):
            if block[:6] == "data: " and "\n" not in block:
                out.append(_new_event(SSEEvent, (block[6:], None, self.last_event_id, None)))
            else:
                self._lines(block.split("\n"), out)
                self._dispatch(out)

    def _learn_names(self, heads: list[str]) -> Optional[list[Optional[str]]]:
        # Event-name lines not seen before; None if one is not "event: x".
        names = self._names
        if len(names) > _NAMES_KEPT:
            names.clear()
        for head in heads:
            if head not in names:
                if head[:7] != "event: ":
                    return None
                names[head] = head[7:]
        return list(map(names.get, heads))

    def take_pending(self) -> Optional[bytes]:
        """Hand back what is carried over as bytes, leaving the decoder empty.

        The carried partial line, the lines of an event not yet ended and a
        cut character come back as bytes that, fed again later, frame to
        the same events. For a reader that scans whole events itself and
        feeds the decoder only what it does not take. None (nothing taken)
        before the stream has started, or while a CR may still pair with a
        LF of the next read.
        """
        if not self._started or self._skip_lf:
            return None
        parts: list[str] = []
        if self._event is not None:
            parts.append(f"event: {self._event}\n")
        if self._retry is not None:
            parts.append(f"retry: {self._retry}\n")
        if self._data is not None:
            parts += [f"data: {line}\n" for line in self._data]
        parts.append(self._buf)
        pending = "".join(parts).encode() + self._cut_char
        self._buf = ""
        self._cut_char = b""
        self._data = self._event = self._retry = None
        self._idle = True
        return pending

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
