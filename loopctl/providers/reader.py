"""One streamed body's bytes in, stream events out: ``StreamReader``.

Joins the SSE decoder, a provider's stream parser and delta templates
(``delta_runs.py``). Every event goes through the decoder and the parser
until the parser reports a plain delta (one string value, one part, no
other effect); the reader then learns that event's template, and while
reads hold whole runs of events of that exact shape it takes each run in
bulk: one ``PartDelta`` per read carrying the run's text, the same text the
parser would have produced event by event. A read that is not such a run
(another event anywhere in it, a different envelope) goes through the
decoder and the parser; any event other than a plain delta or a ping drops
the template, so a run is never read across a change of state. After
three reads in a row miss, a stream whose envelopes differ per event (a
random field, an event counter) stops trying.

Pure: no IO; mutates; one per stream.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from typing import Optional, Protocol

from loopctl.providers.base import PartDelta, Ping, StreamEvent
from loopctl.providers.delta_runs import DeltaTemplate
from loopctl.providers.http import PROTOCOL, model_error
from loopctl.providers.sse import MAX_LINE, SSEDecoder, SSEEvent

_MISSES_ALLOWED = 3  # reads in a row not taken in bulk before the stream stops trying
_PROBE = "\u2063probe\u00e9"  # a value no event is likely to carry, with escapes to decode
_PROBE_JSON = b"\\u2063probe\\u00e9"


class StreamParser(Protocol):
    """Maps SSE events of one provider to stream events.

    ``delta_field``, set by each ``feed``: the JSON key whose string value
    became the one ``PartDelta`` this event produced, when that delta is
    all the event did (the same bytes with another value would do the
    same with that value); None otherwise. A parser may leave it None
    always; its streams are then read event by event.
    """

    done: bool
    delta_field: Optional[str]

    def feed(self, event: SSEEvent) -> list[StreamEvent]:
        """Stream events for one SSE event (may raise ``ModelError``)."""
        ...

    def finish(self) -> list[StreamEvent]:
        """At end of body: closing events, or raise the truncation error."""
        ...


def feed_checked(parser: StreamParser, event: SSEEvent, label: str) -> list[StreamEvent]:
    """``parser.feed(event)``, with JSON of the wrong shape turned into ``ModelError``.

    Parsers index into provider JSON freely; this is the one boundary where a
    chunk of an unexpected shape becomes a protocol error instead of a bare
    ``KeyError`` or ``AttributeError``.
    """
    try:
        return parser.feed(event)
    except (AttributeError, TypeError, KeyError, IndexError) as exc:
        raise model_error(
            f"{label}: unexpected stream chunk shape: {event.data[:200]!r}", kind=PROTOCOL
        ) from exc


def _event_bytes(event: SSEEvent) -> bytes:
    # Bytes that frame to exactly this event (so bytes matching a template
    # learned from them frame to this event with another value); a server
    # framing it otherwise simply never matches.
    head = "" if event.event is None else f"event: {event.event}\n"
    data = event.data.replace("\n", "\ndata: ")
    return f"{head}data: {data}\n\n".encode()


class StreamReader:
    """Decodes one streamed body into stream events (mutates; not thread-safe).

    Args:
        parser: the provider's stream parser for this body.
        label: names the client in error messages.
        max_line: the SSE line limit, in characters (see ``SSEDecoder``).
    """

    __slots__ = ("_decoder", "_label", "_max_line", "_misses", "_parser", "_raw", "_template")

    def __init__(self, parser: StreamParser, label: str, max_line: int = MAX_LINE) -> None:
        self._decoder = SSEDecoder(max_line)
        self._parser = parser
        self._label = label
        self._max_line = max_line
        self._template: Optional[DeltaTemplate] = None
        self._raw: Optional[bytes] = None  # held back by the bulk path; None: the decoder holds it
        self._misses = 0 if hasattr(parser, "delta_field") else _MISSES_ALLOWED

    @property
    def done(self) -> bool:
        """True once the parser saw the stream's terminal event."""
        return self._parser.done

    def feed(self, chunk: bytes) -> Iterable[StreamEvent]:
        """The stream events ``chunk`` completes, in order.

        Iterate the result to its end before the next ``feed``: events are
        parsed as they are taken, so an error event raises right after the
        events before it in the same read.

        Raises:
            ModelError: a malformed or error event, or an over-long line.
        """
        raw = self._raw
        if raw is None:
            return self._events(self._decoder.feed(chunk))
        if b"\r" in chunk:
            # CR or CRLF line ends: templates are learned LF-framed and never
            # match, and a blank line need not be b"\n\n" here; read per event.
            self._misses = _MISSES_ALLOWED
            self._raw = None
            return self._events(self._decoder.feed(raw + chunk))
        data = raw + chunk if raw else chunk
        cut = data.rfind(b"\n\n") + 2
        if cut > 1:
            template = self._template
            if template is not None and cut <= self._max_line:
                text = template.match(data, cut)
                if text is not None:
                    self._misses = 0
                    out = [PartDelta(template.index, template.kind, text)] if text else []
                    rest = data[cut:]
                    if len(rest) <= self._max_line:
                        self._raw = rest
                        return out
                    self._raw = None
                    return [*out, *self._events(self._decoder.feed(rest))]
                self._misses += 1
        elif len(data) <= self._max_line:
            self._raw = data  # no whole event yet
            return ()
        self._raw = None  # the decoder reads on, until a template is learned again
        return self._events(self._decoder.feed(data))

    def finish(self) -> Iterator[StreamEvent]:
        """At the end of the body: the last events, then the parser's ending.

        Raises:
            ModelError: the body was truncated (see the parser's ``finish``).
        """
        raw = self._raw
        self._raw = None
        self._template = None
        self._misses = _MISSES_ALLOWED  # nothing more is read in bulk
        events = self._decoder.feed(raw) if raw else []
        yield from self._events(events + self._decoder.flush())
        if not self._parser.done:
            yield from self._parser.finish()

    def _events(self, events: list[SSEEvent]) -> Iterator[StreamEvent]:
        # The decoder's events through the parser; then what the next read
        # may take in bulk.
        parser = self._parser
        label = self._label
        plain: Optional[tuple[SSEEvent, str, StreamEvent]] = None  # the last plain delta
        changed = False
        for sse in events:
            try:
                evs = feed_checked(parser, sse, label)
            except BaseException:
                self._template = None
                raise
            field = getattr(parser, "delta_field", None)
            if field is not None:
                plain = (sse, field, evs[0])
            elif not (len(evs) == 1 and type(evs[0]) is Ping):
                plain = None
                changed = True
            if evs:
                yield from evs
            if parser.done:
                self._template = None
                return
        if self._misses >= _MISSES_ALLOWED:
            self._template = None
        elif plain is not None:
            self._learn(*plain)
        elif changed:
            self._template = None
        if self._template is not None:
            self._raw = self._decoder.take_pending()  # None: not yet (a CR may pair with a LF)

    def _learn(self, sse: SSEEvent, field: str, delta: StreamEvent) -> None:
        template = None
        if type(delta) is PartDelta:
            template = DeltaTemplate.learn(_event_bytes(sse), field, delta.index, delta.kind, delta.text)
            if template is not None and not self._reads_value_at(template, field):
                template = None
        self._template = template

    def _reads_value_at(self, template: DeltaTemplate, field: str) -> bool:
        # The template found the field's bytes; the parser must take its
        # delta from exactly there (not from a same-named key elsewhere, an
        # escaped key, a default): fed the event with another value in that
        # place, a copy of the parser must give a delta of that value alone.
        events = SSEDecoder(self._max_line).feed(template.event_with(_PROBE_JSON))
        if len(events) != 1:
            return False
        try:
            parser = copy.deepcopy(self._parser)
            out = parser.feed(events[0])
        except Exception:  # a parser that cannot be copied, or rejects the probe
            return False
        return out == [PartDelta(template.index, template.kind, _PROBE)] and parser.delta_field == field


__all__ = ["StreamParser", "StreamReader", "feed_checked"]
