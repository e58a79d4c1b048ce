"""The SSE decoder: framing rules, chunk boundaries anywhere, limits."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopctl.errors import ModelError
from loopctl.providers.sse import DONE, SSEDecoder, SSEEvent, iter_events


def decode_all(data: bytes, cuts: Sequence[int] = (), max_line: int = 1 << 20) -> list[SSEEvent]:
    dec = SSEDecoder(max_line)
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
    with pytest.raises(ModelError, match="longer than 1024 characters"):
        dec.feed(b"y" * 100)


def test_default_limit_is_one_mebibyte() -> None:
    dec = SSEDecoder()
    line = b"data: " + b"x" * ((1 << 20) - 6)  # exactly 1 MiB
    assert dec.feed(line + b"\n\n") == [SSEEvent("x" * ((1 << 20) - 6))]
    with pytest.raises(ModelError, match="1048576"):
        dec.feed(b"z" * ((1 << 20) + 1))


@pytest.mark.parametrize("cuts", [[], [3], [700], [1030], [5, 600, 1029, 1031]])
def test_a_complete_line_over_the_limit_raises_in_any_chunking(cuts: list[int]) -> None:
    # The limit holds for the line, not for what one read happened to carry.
    data = b"data: ok\n\n" + b"data: " + b"x" * 1019 + b"\n\n"  # that line is 1025 characters
    with pytest.raises(ModelError, match="longer than 1024"):
        decode_all(data, cuts, max_line=1024)
    assert decode_all(data[:-7] + b"\n\n", cuts, max_line=1024)[-1].data == "x" * 1014  # 1020 passes


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


# -- the bulk fast paths against a line-by-line reference -----------------------


def reference(data: bytes) -> list[SSEEvent]:
    """The WHATWG rules applied one line at a time, with no fast path: the
    events dispatched by the complete lines of ``data`` (no flush)."""
    text = data.decode("utf-8", "replace")
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = re.split(r"\r\n|\r|\n", text)
    lines.pop()  # not ended yet
    out: list[SSEEvent] = []
    buf: Optional[list[str]] = None
    event: Optional[str] = None
    retry: Optional[int] = None
    last_id: Optional[str] = None
    for line in lines:
        if not line:
            if buf is not None:
                out.append(SSEEvent("\n".join(buf), event, last_id, retry))
            buf, event, retry = None, None, None
            continue
        if line.startswith(":"):
            continue
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            buf = [*(buf or []), value]
        elif name == "event":
            event = value
        elif name == "id" and "\x00" not in value:
            last_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            retry = int(value)
    return out


def feed_all(data: bytes, cuts: Sequence[int]) -> tuple[list[SSEEvent], list[int]]:
    """Events from feeding ``data`` cut at ``cuts``, and how many came out by each cut."""
    dec = SSEDecoder()
    out: list[SSEEvent] = []
    seen: list[int] = []
    prev = 0
    for c in [*sorted(set(cuts)), len(data)]:
        out += dec.feed(data[prev:c])
        seen.append(len(out))
        prev = c
    return out, seen


_value = st.text(st.sampled_from('ab {}":,0123é\u2028\x00\ufeff'), max_size=6)
_field = st.builds(
    lambda name, sep, value: name + sep + value,
    st.sampled_from(["data", "data", "data", "event", "id", "retry", "", "x", "dat", "Data"]),
    st.sampled_from([": ", ":", ":  ", ""]),
    _value,
)
_line = st.one_of(
    _field,
    st.just(""),  # blank line: dispatch
    st.builds(lambda v: ":" + v, _value),  # comment
    st.builds(lambda v: "retry: " + v, st.sampled_from(["10", "1x", "", "٣"])),
    st.builds(lambda v: "data: " + v, _value),
    st.builds(lambda n, v: f"event: {n}\ndata: {v}\n", st.sampled_from(["e1", "e2", "", "message_start"]), _value),
)


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    lines = draw(st.lists(_line, max_size=25))
    endings = st.sampled_from(["\n", "\n", "\r\n", "\r"])
    text = "".join(line + draw(endings) for line in lines)
    if draw(st.booleans()):
        text += draw(_value)  # an unfinished last line
    prefix = draw(st.sampled_from([b"", b"", b"\xef\xbb\xbf"]))
    return prefix + text.encode()


@settings(max_examples=400, deadline=None)
@given(streams(), st.lists(st.integers(min_value=0, max_value=400), max_size=10))
def test_any_stream_any_chunking_matches_the_line_by_line_reference(data: bytes, cuts: list[int]) -> None:
    cuts = [c % (len(data) + 1) for c in cuts]
    assert feed_all(data, cuts)[0] == reference(data)


@settings(max_examples=200, deadline=None)
@given(streams(), st.lists(st.integers(min_value=0, max_value=400), max_size=10))
def test_every_event_comes_out_of_the_feed_that_completes_it(data: bytes, cuts: list[int]) -> None:
    # Never held back: after each read, exactly the events the bytes so far
    # complete have come out (a final CR already ends its line).
    cuts = sorted({c % (len(data) + 1) for c in cuts})
    _, seen = feed_all(data, cuts)
    assert seen == [len(reference(data[:c])) for c in [*cuts, len(data)]]


def _bulk(shape: str, n: int, rng: random.Random) -> bytes:
    words = ["hi", " there", "é", '\\"q\\"', "", "ü" * 3, "x" * 40]
    if shape == "data":
        evs = [f'data: {{"choices": [{{"delta": {{"content": "{rng.choice(words)}"}}}}]}}\n\n' for _ in range(n)]
    else:
        names = ["content_block_delta", "ping", "message_delta", ""] + [f"n{k}" for k in range(80)]
        evs = [f"event: {rng.choice(names)}\ndata: {{\"text\": \"{rng.choice(words)}\"}}\n\n" for _ in range(n)]
    return "".join(evs).encode()


@pytest.mark.parametrize("shape", ["data", "event"])
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), cuts=st.lists(st.integers(min_value=0, max_value=10**6), max_size=30))
def test_bulk_shapes_give_the_same_events_in_any_chunking(shape: str, seed: int, cuts: list[int]) -> None:
    # Long runs of the provider shapes take the bulk paths; cut anywhere
    # (inside "\n\n", inside a UTF-8 character) they match one whole read.
    rng = random.Random(seed)
    data = _bulk(shape, 300, rng)
    cuts = [c % (len(data) + 1) for c in cuts]
    out, _ = feed_all(data, cuts)
    assert out == feed_all(data, [])[0] == reference(data)
    assert len(out) == 300


@pytest.mark.parametrize("intruder", [
    b": keep-alive\n",
    b"id: 42\n",
    b"data: second line\n",
    b"retry: 500\n",
    b"event: late\n",
    b"\n",
    b"data:no-space\n\n",
    b"event:x\ndata: y\n\n",
    # Three-line shapes that look like "event" + "data" + blank at a glance:
    b"event: a\ndata:x\n\n",
    b"event: a\n: comment\n\n",
    b"event: a\nevent: b\n\n",
    b"event: a\ndata: x\ndata: y\nevent: b\ndata: z\n\n",
])
@pytest.mark.parametrize("shape", ["data", "event"])
def test_an_irregular_line_inside_a_bulk_run_is_decoded_by_the_rules(intruder: bytes, shape: str) -> None:
    rng = random.Random(7)
    head, tail = _bulk(shape, 40, rng), _bulk(shape, 40, rng)
    # Insert the intruder between two events, and also inside an event
    # (after its first line), then read in sizes that straddle it.
    between = head + intruder + tail
    first_line_end = tail.index(b"\n") + 1
    inside = head + tail[:first_line_end] + intruder + tail[first_line_end:]
    for data in (between, inside):
        want = reference(data)
        for size in (7, 64, 1000, len(data)):
            cuts = list(range(size, len(data), size))
            assert feed_all(data, cuts)[0] == want, (intruder, size)


def test_many_distinct_event_names_stay_correct() -> None:
    data = b"".join(b"event: name%d\ndata: %d\n\n" % (k, k) for k in range(500))
    evs = decode_all(data)
    assert [(e.event, e.data) for e in evs] == [(f"name{k}", str(k)) for k in range(500)]


def test_empty_event_name_is_kept_as_empty() -> None:
    data = b"event: \ndata: a\n\n" * 3
    assert decode_all(data) == [SSEEvent("a", "")] * 3


def test_last_id_is_carried_into_bulk_events() -> None:
    data = b"id: 9\n" + b"data: x\n\n" * 50 + b"id: 10\ndata: y\n\n" + b"data: z\n\n" * 50
    evs = decode_all(data, [30])
    assert {e.id for e in evs[:50]} == {"9"}
    assert {e.id for e in evs[50:]} == {"10"}


def test_cr_at_the_end_of_a_bulk_read_and_lf_at_the_start_of_the_next() -> None:
    data = b"data: a\r\n\r\n" * 20
    cut = data.index(b"\r\n\r\n", 100) + 1  # between CR and LF
    assert decode_all(data, [cut]) == [SSEEvent("a")] * 20
    cut2 = cut + 2  # between the second CR and its LF
    assert decode_all(data, [cut2]) == [SSEEvent("a")] * 20


# -- one event per read (the path a server flushing per event takes) --------------


@st.composite
def event_reads(draw: st.DrawFn) -> list[bytes]:
    """Reads that each end with a blank line, as a per-event flush sends them."""
    reads = [b"data: warm-up\n\n"]  # the decoder has started and holds nothing
    for _ in range(draw(st.integers(1, 8))):
        lines = draw(st.lists(_line, min_size=1, max_size=4))
        endings = st.sampled_from(["\n", "\n", "\r\n", "\r"])
        text = "".join(line + draw(endings) for line in lines) + draw(st.sampled_from(["\n", "\n", "\r\n", "\r"]))
        reads.append(text.encode())
    return reads


@settings(max_examples=300, deadline=None)
@given(event_reads())
def test_reads_of_one_event_each_match_the_reference(reads: list[bytes]) -> None:
    dec = SSEDecoder()
    for k, read in enumerate(reads):
        got = dec.feed(read)
        # Each read's events come out of that read, none later.
        assert got == reference(b"".join(reads[: k + 1]))[len(reference(b"".join(reads[:k]))):]


def test_a_carried_partial_line_is_not_skipped_by_a_whole_event_read() -> None:
    dec = SSEDecoder()
    assert dec.feed(b"data: a\n\ndata: b") == [SSEEvent("a")]
    assert dec.feed(b"data: x\n\n") == [SSEEvent("bdata: x")]
    assert dec.feed(b"data: c\n\n") == [SSEEvent("c")]


def test_one_event_reads_carry_the_last_id() -> None:
    dec = SSEDecoder()
    assert dec.feed(b"id: 5\ndata: a\n\n") == [SSEEvent("a", None, "5")]
    assert dec.feed(b"data: b\n\n") == [SSEEvent("b", None, "5")]
    assert dec.feed(b"event: e\ndata: c\n\n") == [SSEEvent("c", "e", "5")]


def test_one_event_read_with_a_cr_inside_is_framed_by_the_rules() -> None:
    dec = SSEDecoder()
    dec.feed(b"data: warm-up\n\n")
    assert dec.feed(b"data: a\rdata: b\n\n") == [SSEEvent("a\nb")]
    assert dec.feed(b"event: e\rdata: c\n\n") == [SSEEvent("c", "e")]


def test_one_event_read_over_the_limit_raises() -> None:
    dec = SSEDecoder(max_line=1024)
    dec.feed(b"data: warm-up\n\n")
    with pytest.raises(ModelError, match="longer than 1024"):
        dec.feed(b"data: " + b"x" * 1019 + b"\n\n")
