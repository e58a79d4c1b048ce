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

import functools
import json.decoder
from itertools import repeat
from typing import Callable, Optional, cast

_DEL = b"\x7f"
_strip_head = bytes.removeprefix
# The C string scanner behind json: (text, index after the opening quote) ->
# (decoded string, index after the closing quote); ValueError if malformed.
_scan_string = cast(Callable[[str, int], "tuple[str, int]"], vars(json.decoder)["scanstring"])
_WS_CHARS = (" ", "\t", "\r", "\n")


@functools.lru_cache(maxsize=64)
def _needle_size(lead: bytes, end: bytes) -> int:
    """How many bytes of ``end`` to split runs at.

    ``bytes.split`` searches with a skip loop (CPython's fastsearch: compare
    the window's last byte, skip past a byte the needle lacks), so how fast
    a needle is found depends on its bytes and those around it. Each safe
    candidate's steps are counted over a few copies of the event, as that
    loop would take them; the fewest wins (the whole end, always safe, by
    default). Deterministic; cached per shape.
    """
    sample = (lead + end) * 4
    best, best_steps = len(end), _search_steps(end, sample)
    for size in range(2, len(end)):
        needle = end[:size]
        if splits_runs_only_at_ends(needle, lead, end):
            steps = _search_steps(needle, sample)
            if steps < best_steps:
                best, best_steps = size, steps
    return best


def splits_runs_only_at_ends(needle: bytes, lead: bytes, end: bytes) -> bool:
    """Whether ``needle`` (a prefix of ``end``) can occur in a run only where an end starts.

    Not in the lead, once in the end, and holding, after its first byte, a
    quote or a control byte, which no valid value holds raw: so it can
    neither start at a value's opening quote nor lie inside a value. (Any
    needle is safe, since ``match`` checks the whole run; this one also
    finds every run.)
    """
    if needle in lead or end.count(needle) != 1:
        return False
    return any(c == 0x22 or c < 0x20 for c in needle[1:])


def _search_steps(needle: bytes, hay: bytes) -> int:
    # A model of CPython's default_find: one step per window, plus a quarter
    # step per byte compared after the last byte matched.
    m = len(needle)
    mlast = m - 1
    last = needle[mlast]
    mask = 0
    for c in needle:
        mask |= 1 << (c & 63)
    skip = mlast
    for j in range(mlast):
        if needle[j] == last:
            skip = mlast - j - 1
    n = len(hay)
    i = steps = 0
    while i <= n - m:
        steps += 1
        jump = m + 1 if i + m < n and not (mask >> (hay[i + m] & 63)) & 1 else 0
        if hay[i + mlast] == last:
            j = 0
            while j < mlast and hay[i + j] == needle[j]:
                j += 1
            steps += j >> 2
            i += m if j == mlast else (jump or skip + 1)
        else:
            i += jump or 1
    return steps


class DeltaTemplate:
    """The fixed bytes of one delta event, and the part/kind its value feeds.

    Built by ``learn``; immutable after. ``match(data, cut)`` returns the
    concatenated decoded values of a run of events of this exact shape, or
    None when ``data[:cut]`` is not such a run.

    Attributes:
        index: the part index the values feed (as the parser routed them).
        kind: the delta kind ("text", "thinking", "tool_input", ...).
    """

    __slots__ = ("_after_needle", "_end", "_lead", "_needle", "index", "kind")

    def __init__(self, lead: bytes, end: bytes, index: int, kind: str) -> None:
        self._lead = lead  # what lies before a value in its event, up to its opening quote
        self._end = end  # from the value's closing quote to the end of the event
        # Runs are split at the start of each end (its first bytes, as many
        # as search fastest).
        size = _needle_size(lead, end)
        self._needle = end[:size]
        self._after_needle = end[size:] + lead  # between the needle and the next value
        self.index = index
        self.kind = kind

    def _shape(self) -> tuple[bytes, bytes, int, str]:
        return (self._lead, self._end, self.index, self.kind)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DeltaTemplate):
            return NotImplemented
        return self._shape() == other._shape()

    def __hash__(self) -> int:
        return hash(self._shape())

    def __repr__(self) -> str:
        return f"DeltaTemplate(index={self.index}, kind={self.kind!r}, end={self._end!r})"

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
        template = cls(text[: pos + 1].encode(), end, index, kind)
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
        needle = self._needle
        # "lead + v1", then per later event "rest of end + lead + v", then
        # "rest of end + the partial event" (cut short at the needle's
        # occurrence in that partial event, if any).
        if not data.endswith(end, 0, cut):
            return None
        pieces = data.split(needle)
        tail = len(data) - cut
        if tail and len(needle) < len(end):
            at = data.find(needle, cut)
            if at >= 0:
                if data.find(needle, at + 1) >= 0:
                    return self.match(data[:cut], cut)
                pieces.pop()
                tail = at - cut
        count = len(pieces) - 1
        # The last needle is the last end's start iff the last piece is
        # exactly the rest of that end and the partial event.
        if count < 1 or len(pieces[-1]) != len(end) - len(needle) + tail:
            return None
        if len(needle) < len(end):  # the first value follows the lead alone
            first = pieces[0]
            if not first.startswith(self._lead):
                return None
            pieces[0] = first[len(self._lead) :]
        pieces[-1] = b'"'  # the closing quote after the last value
        body = _DEL.join(map(_strip_head, pieces, repeat(self._after_needle)))
        # ``body`` is "v1 DEL v2 ... vN DEL \"", and every strip took
        # place iff the lengths add up.
        if len(body) != cut - (len(self._lead) + len(end)) * count + count + 1:
            return None
        # Every value is a whole JSON string body iff the values joined by
        # DEL (a plain character in JSON, and no character that may follow
        # "\\" or complete a "\\u" escape) read as one string: a stray quote
        # ends it early, an escape cut off at a value's end meets the DEL.
        try:
            doc = body.decode()
            text, after = _scan_string(doc, 0)
        except ValueError:  # a bad escape or control character; invalid UTF-8
            return None
        if after != len(doc):  # ended early: a quote outside an escape
            return None
        joined = text.replace("\x7f", "")  # one DEL after each value
        if len(joined) != len(text) - count:
            return None  # a value holds DEL itself: read it event by event
        return joined


__all__ = ["DeltaTemplate"]
