"""One streamed body's bytes in, stream events out: ``StreamReader``.

Joins the SSE decoder and a provider's stream parser, one event at a time:
every SSE event the decoder completes goes through the parser, in order.
JSON of an unexpected shape becomes a ``ModelError`` here (``feed_checked``),
the one place a parser's ``KeyError``/``TypeError`` is translated.

Pure: no IO; mutates; one per stream.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from loopctl.providers.base import StreamEvent
from loopctl.providers.http import PROTOCOL, model_error
from loopctl.providers.sse import MAX_LINE, SSEDecoder, SSEEvent
from loopctl.text import masked_head


class StreamParser(Protocol):
    """Maps SSE events of one provider to stream events."""

    done: bool

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
            f"{label}: unexpected stream chunk shape: {masked_head(event.data, 200)!r}", kind=PROTOCOL
        ) from exc


class StreamReader:
    """Decodes one streamed body into stream events (mutates; not thread-safe).

    Args:
        parser: the provider's stream parser for this body.
        label: names the client in error messages.
        max_line: the SSE line limit, in characters (see ``SSEDecoder``).
    """

    __slots__ = ("_decoder", "_label", "_parser")

    def __init__(self, parser: StreamParser, label: str, max_line: int = MAX_LINE) -> None:
        self._decoder = SSEDecoder(max_line)
        self._parser = parser
        self._label = label

    @property
    def done(self) -> bool:
        """True once the parser saw the stream's terminal event."""
        return self._parser.done

    def feed(self, chunk: bytes) -> Iterator[StreamEvent]:
        """The stream events ``chunk`` completes, in order.

        Iterate the result to its end before the next ``feed``: an error
        event raises right after the events before it in the same read.

        Raises:
            ModelError: a malformed or error event, or an over-long line.
        """
        parser = self._parser
        for sse in self._decoder.feed(chunk):
            yield from feed_checked(parser, sse, self._label)
            if parser.done:
                return

    def finish(self) -> Iterator[StreamEvent]:
        """At the end of the body: the last event, then the parser's ending.

        Raises:
            ModelError: the body was truncated (see the parser's ``finish``).
        """
        parser = self._parser
        for sse in self._decoder.flush():
            if parser.done:
                break
            yield from feed_checked(parser, sse, self._label)
        if not parser.done:
            yield from parser.finish()


__all__ = ["StreamParser", "StreamReader", "feed_checked"]
