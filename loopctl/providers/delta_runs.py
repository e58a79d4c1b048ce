"""Runs of same-envelope delta events, read in bulk: ``DeltaTemplate``.

A streamed reply is mostly one kind of event repeated: a chat-completion
chunk or an Anthropic ``content_block_delta`` whose bytes are identical
from one event to the next except for one JSON string, the new text.
A template holds those fixed bytes, learned from one event the provider's
parser has already read, and ``match`` reads a whole run of such events
with a handful of bulk byte operations instead of a JSON parse and a few
Python steps per event.

A run is only taken when it is provably what the per-event path would
read: the run's bytes are checked to be exactly ``head + key + value +
end`` per event (one ``split`` at the key, one suffix strip per event, and
a length identity that holds only if every strip took place), and every
value is checked to be a JSON string body by the JSON parser itself. Any
doubt (an event of another shape anywhere in the run, an escape the check
cannot place, invalid UTF-8, a control character) returns None, and the
caller reads the bytes event by event as before. Pure: no IO, no state
beyond the learned bytes.
"""

from __future__ import annotations

import json.decoder
from itertools import repeat
from typing import Callable, Optional, cast

_DEL = b"\x7f"
_strip_gap = bytes.removesuffix
_strip_head = bytes.removeprefix
# The C string scanner behind json: (text, index after the opening quote) ->
# (decoded string, index after the closing quote); ValueError if malformed.
_scan_string = cast(Callable[[str, int], "tuple[str, int]"], vars(json.decoder)["scanstring"])
_WS_CHARS = (" ", "\t", "\r", "\n")


class DeltaTemplate:
    """The fixed bytes of one delta event, and the part/kind its value feeds.

    Built by ``learn``; immutable after. ``match(data, cut)`` returns the
    concatenated decoded values of a run of events of this exact shape, or
    None when ``data[:cut]`` is not such a run.

    Attributes:
        index: the part index the values feed (as the parser routed them).
        kind: the delta kind ("text", "thinking", "tool_input", ...).
    """

    __slots__ = ("_end", "_gap", "_head", "_key", "_lead", "_split_at_end", "index", "kind")

    def __init__(self, head: bytes, key: bytes, end: bytes, index: int, kind: str) -> None:
        self._head = head  # an event's bytes before the key
        self._key = key  # '"content": "': the key up to the value's opening quote
        self._end = end  # from the value's closing quote to the end of the event
        self._gap = end + head  # what lies between a value and the next key
        self._lead = head + key  # what lies before a value in its event
        # Splitting at a short end (Anthropic's '"}}\n\n') searches faster
        # than at the key and leaves one piece per event plus the rest;
        # a long end (a chat-completion chunk's) is slower to search for.
        self._split_at_end = len(end) <= len(key) + 4
        self.index = index
        self.kind = kind

    def _shape(self) -> tuple[bytes, bytes, bytes, int, str]:
        return (self._head, self._key, self._end, self.index, self.kind)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DeltaTemplate):
            return NotImplemented
        return self._shape() == other._shape()

    def __hash__(self) -> int:
        return hash(self._shape())

    def __repr__(self) -> str:
        return f"DeltaTemplate(index={self.index}, kind={self.kind!r}, key={self._key!r})"

    @classmethod
    def learn(cls, raw: bytes, field: str, index: int, kind: str, value: str) -> Optional[DeltaTemplate]:
        """The template of ``raw`` (one whole event, blank line included).

        ``field`` is the JSON key whose string value the parser turned into a
        delta of ``kind`` for part ``index`` with text ``value``. Returns None
        when the key is not exactly once in the event, its value is not a
        string right after it, or the template does not read ``raw`` back to
        ``value`` (so a template never disagrees with the parser on its own
        source).
        """
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            return None
        quoted = '"' + field + '"'
        key_start = text.find(quoted)
        if key_start < 0 or text.find(quoted, key_start + 1) >= 0:
            return None
        pos = key_start + len(quoted)
        while text[pos : pos + 1] in _WS_CHARS:
            pos += 1
        if text[pos : pos + 1] != ":":
            return None
        pos += 1
        while text[pos : pos + 1] in _WS_CHARS:
            pos += 1
        if text[pos : pos + 1] != '"':
            return None
        try:
            _, after = _scan_string(text, pos + 1)
        except ValueError:
            return None
        if not raw.endswith(b"\n\n") or raw.count(b"\n\n") != 1:
            return None  # one event, ended by the blank line the reader cuts at
        end = text[after - 1 :].encode()
        template = cls(text[:key_start].encode(), text[key_start : pos + 1].encode(), end, index, kind)
        if template.match(raw, len(raw)) != value:
            return None
        return template

    def event_with(self, value: bytes) -> bytes:
        """This event's bytes with ``value`` (a JSON string body) in the value's place."""
        return self._lead + value + self._end

    def match(self, data: bytes, cut: int) -> Optional[str]:
        """The values of the run of events ``data[:cut]``, joined; else None.

        ``data[:cut]`` must be whole events and ``data[cut:]`` hold no
        blank line (the start of an event the caller keeps for later).
        """
        end = self._end
        if self._split_at_end:
            # One piece per event, "head + key + value", then the rest.
            if not data.endswith(end, 0, cut):
                return None
            pieces = data.split(end)
            count = len(pieces) - 1
            pieces[-1] = b'"'  # the rest, not read; the closing quote in its place
            body = _DEL.join(map(_strip_head, pieces, repeat(self._lead)))
            # ``body`` is "v1 DEL v2 ... vN DEL \"", and every strip took
            # place iff the lengths add up.
            lead = 0
            size = cut - (len(self._lead) + len(end)) * count + count + 1
        else:
            # "head", then per event "value + end + head", the last one
            # "value + end + rest" (or "value + end + head", then the key's
            # side of the rest when the rest has reached its key).
            key = self._key
            pieces = data.split(key)
            tail = len(data) - cut
            if tail:
                at = data.find(key, cut)
                if at >= 0:
                    if data.find(key, at + 1) >= 0:
                        return self.match(data[:cut], cut)
                    pieces.pop()
                    tail = at - cut
            count = len(pieces) - 1
            if count < 1 or pieces[0] != self._head:
                return None
            last = pieces.pop()
            stop = len(last) - tail
            if not last.endswith(end, 0, stop):
                return None
            pieces[0] = b""  # a leading DEL (the scan starts after it)
            pieces.append(last[: stop - len(end) + 1])  # the last value, its closing quote kept
            body = _DEL.join(map(_strip_gap, pieces, repeat(self._gap)))
            lead = 1
            size = cut - (len(self._head) + len(key) + len(end) - 1) * count + 1
        if len(body) != size or count < 1:
            return None
        # Every value is a whole JSON string body iff the values joined by
        # DEL (a plain character in JSON, and no character that may follow
        # "\\" or complete a "\\u" escape) read as one string: a stray quote
        # ends it early, an escape cut off at a value's end meets the DEL.
        try:
            doc = body.decode()
            text, after = _scan_string(doc, lead)
        except ValueError:  # a bad escape or control character; invalid UTF-8
            return None
        if after != len(doc):  # ended early: a quote outside an escape
            return None
        dels = count - lead  # DELs the scanned text holds
        if not dels:
            return text
        joined = text.replace("\x7f", "")
        if len(joined) != len(text) - dels:
            return None  # a value holds DEL itself: read it event by event
        return joined


__all__ = ["DeltaTemplate"]
