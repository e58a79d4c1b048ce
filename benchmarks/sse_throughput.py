"""SSE decode throughput: the stream reader and the accumulator beside a bytes.split floor.

Generates a ~20 MB stream in each provider's recorded wire format (chat
completion chunks as OpenAI-compatible servers send them, Anthropic message
events) and times, in the same run:

- floor: only split the reads into lines with ``bytes.split`` (carrying the
  partial last line), the least any line-based reader does;
- decoder: ``SSEDecoder.feed`` (framing only, events out);
- full: what the clients run, ``StreamReader`` (decoder + the provider's
  parser + runs of same-envelope deltas read in bulk) + ``StreamAccumulator``
  (the reply assembled; its text is checked against a plain JSON reading);
- per event: decoder + parser + accumulator with every event's JSON parsed
  on its own (the path a read takes when it is not a run);
- reference: bytes.split lines + ``json.loads`` of each data line.

Two read patterns: 16 KiB reads (one TLS record, what ``read1`` returns
from a provider over HTTPS on a busy stream) and one event per read (a model
streaming tokens slower than the network, where the server flushes each
event). The floor is measured on the same reads each time.

Every figure is the best of several rounds, and the rounds interleave the
floor with the figures, so a loaded machine slows both alike. Prints MB/s
and deltas/s (the stream's own deltas, however many events carry them),
and one ``RESULT`` line per figure for ``run_all.py``.
Run: ``python benchmarks/sse_throughput.py`` (about 30 s).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from run_all import report  # noqa: E402

from loopctl.providers.anthropic import AnthropicStreamParser  # noqa: E402
from loopctl.providers.base import PartDelta, StreamAccumulator  # noqa: E402
from loopctl.providers.openai import OpenAIStreamParser  # noqa: E402
from loopctl.providers.reader import StreamReader  # noqa: E402
from loopctl.providers.sse import SSEDecoder  # noqa: E402

TARGET = 20 * 1024 * 1024
READ = 16 * 1024
ROUNDS = 7
WORDS = ["the", " quick", " brown", " fox", " jumps", " over", " lazy", " dog", ",", " and", " 42", "\n"]


def openai_stream() -> tuple[bytes, int]:
    head = {"id": "chatcmpl-AbCdEfGhIjKlMnOpQrStUvWxYz012", "object": "chat.completion.chunk",
            "created": 1730000000, "model": "gpt-4o-2024-08-06", "system_fingerprint": "fp_0123456789"}
    out = [b"data: " + json.dumps({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                         "logprobs": None, "finish_reason": None}]}).encode() + b"\n\n"]
    size, n = len(out[0]), 0
    while size < TARGET:
        word = WORDS[n % len(WORDS)]
        ev = b"data: " + json.dumps({**head, "choices": [{"index": 0, "delta": {"content": word},
                                                           "logprobs": None, "finish_reason": None}]}).encode() + b"\n\n"
        out.append(ev)
        size += len(ev)
        n += 1
    out.append(b"data: " + json.dumps({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}).encode()
               + b"\n\n")
    out.append(b"data: " + json.dumps({**head, "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": n,
                                                                        "total_tokens": n + 10}}).encode() + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return b"".join(out), n


def anthropic_stream() -> tuple[bytes, int]:
    def ev(name: str, data: dict[str, Any]) -> bytes:
        return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

    out = [ev("message_start", {"type": "message_start", "message": {
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL", "type": "message", "role": "assistant", "content": [],
        "model": "claude-sonnet-4-5-20250929", "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 25, "output_tokens": 1}}}),
        ev("content_block_start", {"type": "content_block_start", "index": 0,
                                   "content_block": {"type": "text", "text": ""}})]
    size, n = sum(map(len, out)), 0
    while size < TARGET:
        e = ev("content_block_delta", {"type": "content_block_delta", "index": 0,
                                       "delta": {"type": "text_delta", "text": WORDS[n % len(WORDS)]}})
        out.append(e)
        size += len(e)
        n += 1
    out += [ev("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ev("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                 "usage": {"output_tokens": n}}),
            ev("message_stop", {"type": "message_stop"})]
    return b"".join(out), n


def reads(data: bytes) -> list[bytes]:
    return [data[i : i + READ] for i in range(0, len(data), READ)]


def event_reads(data: bytes) -> list[bytes]:
    # One read per event, as a server that flushes each event delivers them.
    return [part + b"\n\n" for part in data.split(b"\n\n")[:-1]]


def floor(chunks: list[bytes]) -> int:
    lines = 0
    tail = b""
    for chunk in chunks:
        parts = (tail + chunk).split(b"\n")
        tail = parts.pop()
        lines += len(parts)
    return lines


def json_floor(chunks: list[bytes]) -> int:
    # The second floor: bytes.split lines + json.loads of every data line,
    # the least any consumer that reads the JSON does.
    loads = json.loads
    n = 0
    tail = b""
    for chunk in chunks:
        parts = (tail + chunk).split(b"\n")
        tail = parts.pop()
        for line in parts:
            if line[:6] == b"data: " and line[6:7] == b"{":
                loads(line[6:])
                n += 1
    return n


def decoder_only(chunks: list[bytes]) -> int:
    feed = SSEDecoder().feed
    n = 0
    for chunk in chunks:
        n += len(feed(chunk))
    return n


def full(parser_cls: Callable[[], Any]) -> Callable[[list[bytes]], int]:
    # What the clients run: StreamReader (decoder + parser + delta runs) + accumulator.
    def run(chunks: list[bytes]) -> int:
        reader = StreamReader(parser_cls(), "bench")
        acc = StreamAccumulator()
        feed = acc.feed
        deltas = 0
        for chunk in chunks:
            for ev in reader.feed(chunk):
                if type(ev) is PartDelta:
                    deltas += 1
                feed(ev)
        for ev in reader.finish():
            feed(ev)
        resp = acc.build()
        assert resp.message.text == expected_text(chunks), "assembled text differs"
        return deltas

    return run


_EXPECTED: dict[int, str] = {}


def expected_text(chunks: list[bytes]) -> str:
    # The reply text read the slow, obvious way (once per stream, not timed).
    key = id(chunks)
    if key not in _EXPECTED:
        text = []
        for block in b"".join(chunks).split(b"\n\n"):
            line = block.split(b"\n")[-1]
            if line.startswith(b"data: {"):
                doc = json.loads(line[6:])
                if doc.get("choices"):
                    text.append(doc["choices"][0].get("delta", {}).get("content") or "")
                elif doc.get("type") == "content_block_delta":
                    text.append(doc["delta"].get("text", ""))
        _EXPECTED[key] = "".join(text)
    return _EXPECTED[key]


def per_event(parser_cls: Callable[[], Any]) -> Callable[[list[bytes]], int]:
    # Decoder + parser + accumulator with every event parsed on its own.
    def run(chunks: list[bytes]) -> int:
        dec = SSEDecoder()
        parser = parser_cls()
        acc = StreamAccumulator()
        feed = acc.feed
        deltas = 0
        for chunk in chunks:
            for sse in dec.feed(chunk):
                for ev in parser.feed(sse):
                    if type(ev) is PartDelta:
                        deltas += 1
                    feed(ev)
        return deltas

    return run


def race(runs: dict[str, tuple[Callable[[list[bytes]], int], list[bytes]]]) -> dict[str, tuple[float, int]]:
    """Best time (and result) of each run over ROUNDS interleaved rounds."""
    best: dict[str, tuple[float, int]] = {}
    for _ in range(ROUNDS):
        for name, (fn, chunks) in runs.items():
            t0 = time.perf_counter()
            result = fn(chunks)
            t = time.perf_counter() - t0
            if name not in best or t < best[name][0]:
                best[name] = (t, result)
    return best


def main() -> None:
    print(f"python {sys.version.split()[0]}, best of {ROUNDS} interleaved rounds")
    for name, make, parser in (("openai", openai_stream, OpenAIStreamParser),
                               ("anthropic", anthropic_stream, AnthropicStreamParser)):
        data, deltas = make()
        big, small = reads(data), event_reads(data)
        mb = len(data) / 1e6
        times = race({
            "floor": (floor, big),
            "decoder": (decoder_only, big),
            "full": (full(parser), big),
            "per_event": (per_event(parser), big),
            "json": (json_floor, big),
            "floor1": (floor, small),
            "decoder1": (decoder_only, small),
            "full1": (full(parser), small),
        })
        t = {k: v[0] for k, v in times.items()}
        assert times["per_event"][1] == deltas, (times["per_event"][1], deltas)
        assert times["decoder"][1] == times["decoder1"][1] == len(small), "events lost"
        print(f"\n{name}: {mb:.1f} MB, {deltas:,} text deltas, {len(small):,} SSE events")
        rows = (("16 KiB reads: floor (bytes.split lines)", t["floor"], t["floor"]),
                ("16 KiB reads: decoder (SSE framing)", t["decoder"], t["floor"]),
                ("16 KiB reads: full (StreamReader+accumulator)", t["full"], t["floor"]),
                ("16 KiB reads: per event (decoder+parser+acc.)", t["per_event"], t["floor"]),
                ("16 KiB reads: reference (split + json.loads)", t["json"], t["floor"]),
                ("one event per read: floor", t["floor1"], t["floor1"]),
                ("one event per read: decoder", t["decoder1"], t["floor1"]),
                ("one event per read: full", t["full1"], t["floor1"]))
        for label, secs, base in rows:
            print(f"  {label:46s} {mb / secs:8.1f} MB/s  {deltas / secs:12,.0f} deltas/s  {base / secs:5.2f}x floor")
        print(f"  full path: {times['full'][1]:,} PartDelta events out for {deltas:,} deltas in "
              f"(one per read of a run)")
        # One line per figure for benchmarks/run_all.py (value, floor, value/floor).
        report(f"sse {name} decoder", mb / t["decoder"], mb / t["floor"], "MB/s")
        report(f"sse {name} full (StreamReader+accumulator)", mb / t["full"], mb / t["floor"], "MB/s")
        report(f"sse {name} per-event path (decoder+parser+accumulator)", mb / t["per_event"], mb / t["floor"],
               "MB/s")
        report(f"sse {name} full vs split+json.loads", mb / t["full"], mb / t["json"], "MB/s")
        report(f"sse {name} full, one event per read", mb / t["full1"], mb / t["floor1"], "MB/s")


if __name__ == "__main__":
    main()
