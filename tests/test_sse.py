"""The SSE decoder: framing rules, chunk boundaries anywhere, limits."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopctl.errors import ModelError
from loopctl.providers.sse import DONE, SSEDecoder, SSEEvent, iter_events


def decode_all(data: bytes, cuts: list[int] = ()) -> list[SSEEvent]:  # type: ignore[assignment]
    dec = SSEDecoder()
    out: list[SSEEvent] = []
    prev = 0
    for c in sorted(cuts):
        out += dec.feed(data[prev:c])
        prev = c
    out += dec.feed(data[prev:])
    return out + dec.flush()


def test_single_line_data_events_come_out_in_order() -> None:
    evs = decode_all(b"data: one\n\ndata: two\n\n")
    assert [e.data for e in evs] == ["one", "two"]
    assert all(e.event is None for e in evs)


def test_multi_line_data_joins_with_newline() -> None:
    assert decode_all(b"data: a\ndata: b\ndata:c\n\n")[0].data == "a\nb\nc"


def test_only_one_leading_space_is_stripped() -> None:
    assert decode_all(b"data:  two spaces\n\n")[0].data == " two spaces"


def test_comments_are_ignored_and_do_not_dispatch() -> None:
    evs = decode_all(b": keep-alive\n\n: another\ndata: x\n: mid\n\n")
    assert [e.data for e in evs] == ["x"]


def test_event_name_id_and_retry_fields() -> None:
    evs = decode_all(b"event: message_start\nid: 7\nretry: 1500\ndata: {}\n\nevent: ping\ndata: {}\n\n")
    assert evs[0] == SSEEvent("{}", "message_start", "7", 1500)
    # The event name resets per event; the last id persists, as the standard says.
    assert evs[1] == SSEEvent("{}", "ping", "7", None)


def test_crlf_and_lone_cr_line_endings() -> None:
    assert [e.data for e in decode_all(b"data: a\r\n\r\ndata: b\r\rdata: c\n\n")] == ["a", "b", "c"]


def test_crlf_split_between_chunks_is_one_line_end() -> None:
    dec = SSEDecoder()
    assert dec.feed(b"data: a\r") == []
    # The LF completing the CRLF must not count as a blank line...
    assert dec.feed(b"\n") == []
    # ...so the event only dispatches on the real blank line.
    assert dec.feed(b"\r\n") == [SSEEvent("a")]


def test_a_line_split_across_chunks_is_reassembled() -> None:
    dec = SSEDecoder()
    assert dec.feed(b'data: {"hel') == []
    assert dec.feed(b'lo": 1}') == []
    assert dec.feed(b"\n\n") == [SSEEvent('{"hello": 1}')]


def test_complete_event_is_returned_by_the_feed_that_completes_it() -> None:
    # Nothing already sent is held back: the event comes out of this feed.
    dec = SSEDecoder()
    assert dec.feed(b"data: first\n\ndata: sec") == [SSEEvent("first")]
    assert dec.feed(b"ond\n\n") == [SSEEvent("second")]


def test_blank_line_arriving_alone_dispatches_the_pending_event() -> None:
    dec = SSEDecoder()
    assert dec.feed(b"data: a\n") == []
    assert dec.feed(b"\n") == [SSEEvent("a")]
    assert dec.feed(b"data: b\n") == []
    assert dec.feed(b"\ndata: c\n\n") == [SSEEvent("b"), SSEEvent("c")]


def test_extra_blank_lines_between_events_dispatch_nothing() -> None:
    assert [e.data for e in decode_all(b"data: a\n\n\n\n\ndata: b\n\n")] == ["a", "b"]


def test_event_without_data_is_not_dispatched_but_empty_data_is() -> None:
    assert decode_all(b"event: x\n\n") == []
    assert decode_all(b"data:\n\n") == [SSEEvent("")]
    assert decode_all(b"data\n\n") == [SSEEvent("")]


def test_bom_at_stream_start_is_dropped() -> None:
    assert decode_all(b"\xef\xbb\xbfdata: x\n\n") == [SSEEvent("x")]


def test_done_marker_is_plain_data() -> None:
    assert decode_all(b"data: [DONE]\n\n")[0].data == DONE


def test_flush_keeps_finished_lines_and_drops_a_cut_line() -> None:
    dec = SSEDecoder()
    dec.feed(b"data: whole line\n")
    assert dec.flush() == [SSEEvent("whole line")]
    dec = SSEDecoder()
    dec.feed(b'data: {"cut mid')
    assert dec.flush() == []


def test_line_longer_than_the_limit_raises_naming_the_limit() -> None:
    dec = SSEDecoder(max_line=1024)
    dec.feed(b"data: " + b"x" * 1000)
    with pytest.raises(ModelError, match="longer than 1024 bytes"):
        dec.feed(b"y" * 100)


def test_default_limit_is_one_mebibyte() -> None:
    dec = SSEDecoder()
    dec.feed(b"data: " + b"x" * (1 << 20) + b"\n\n")  # complete lines of any length pass
    with pytest.raises(ModelError):
        dec.feed(b"z" * ((1 << 20) + 1))


def test_invalid_utf8_is_replaced_not_raised() -> None:
    assert decode_all(b"data: \xff\n\n")[0].data == "\ufffd"


def test_utf8_character_split_across_chunks_survives() -> None:
    data = "data: héllo\n\n".encode()
    cut = data.index(b"\xc3") + 1
    assert decode_all(data, [cut]) == [SSEEvent("héllo")]


def test_iter_events_decodes_an_iterable_of_chunks() -> None:
    assert [e.data for e in iter_events([b"data: a\n", b"\ndata: b\n"])] == ["a", "b"]


_stream = (
    b": hi\r\n"
    b"event: message_start\r\ndata: {\"a\": 1}\r\n\r\n"
    b"data: x\ndata: y\n\n"
    b"id: 3\ndata: z\r\rdata:  sp\n\n\n"
    b"retry: 10\ndata: [DONE]\n\n"
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(_stream)), max_size=12))
def test_any_chunking_gives_the_same_events(cuts: list[int]) -> None:
    assert decode_all(_stream, cuts) == decode_all(_stream)


def test_byte_by_byte_feed_matches_whole_feed_on_a_long_stream() -> None:
    rng = random.Random(5)
    parts = []
    for i in range(200):
        kind = rng.randrange(4)
        if kind == 0:
            parts.append(b"data: %d\n\n" % i)
        elif kind == 1:
            parts.append(b"event: e%d\r\ndata: l1\r\ndata: l2\r\n\r\n" % i)
        elif kind == 2:
            parts.append(b": comment %d\n" % i)
        else:
            parts.append(b"data: {\"n\": %d}\r\r" % i)
    data = b"".join(parts)
    whole = decode_all(data)
    dec = SSEDecoder()
    one = [e for k in range(len(data)) for e in dec.feed(data[k : k + 1])] + dec.flush()
    assert one == whole
    assert len(whole) == sum(1 for p in parts if b"data" in p)
