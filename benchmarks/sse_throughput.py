"""SSE decode throughput of the clients' one per-event path, beside a fixed floor.

Generates a ~8 MB stream in each provider's recorded wire format (chat
completion chunks as OpenAI-compatible servers send them, Anthropic message
events) and times what the clients run on every streamed body:
``StreamReader`` (the SSE decoder, then the provider's parser, event by
event) feeding ``StreamAccumulator`` (the reply assembled; its text is
checked against a plain JSON reading of the stream).

The floor is hand-written: 100,000 deltas/s. A fast model sends a few
hundred deltas a second, so the floor leaves a wide margin for a loaded
machine; the figure only has to stay above it. ``bytes.split`` and
``json.loads`` per line are printed beside it for scale (not a goal).

Two read patterns: 16 KiB reads (one TLS record, what ``read1`` returns
from a provider over HTTPS on a busy stream) and one event per read (a model
streaming tokens slower than the network, where the server flushes each
event). Every figure is the best of several rounds.
Run: ``python benchmarks/sse_throughput.py`` (about 20 s; ``--smoke``: a 256 KiB stream,
once).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, Callable, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from loopctl.providers.anthropic import AnthropicStreamParser  # noqa: E402
from loopctl.providers.base import PartDelta, StreamAccumulator  # noqa: E402
from loopctl.providers.openai import OpenAIStreamParser  # noqa: E402
from loopctl.providers.reader import StreamReader  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_all import report, smoke_requested  # noqa: E402

TARGET = 8 * 1024 * 1024
READ = 16 * 1024
ROUNDS = 5
SMOKE_TARGET, SMOKE_ROUNDS = 256 * 1024, 1  # --smoke: a 256 KiB stream, once
FLOOR_DELTAS_PER_S = 100_000.0
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


def split_json(chunks: list[bytes]) -> int:
    # For scale only: bytes.split lines + json.loads of every data line.
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


def expected_text(data: bytes) -> str:
    # The reply text read the slow, obvious way (once per stream, not timed).
    text = []
    for block in data.split(b"\n\n"):
        line = block.split(b"\n")[-1]
        if line.startswith(b"data: {"):
            doc = json.loads(line[6:])
            if doc.get("choices"):
                text.append(doc["choices"][0].get("delta", {}).get("content") or "")
            elif doc.get("type") == "content_block_delta":
                text.append(doc["delta"].get("text", ""))
    return "".join(text)


def per_event(parser_cls: Callable[[], Any], expected: str) -> Callable[[list[bytes]], int]:
    # What the clients run: StreamReader (decoder + parser, per event) + accumulator.
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
        assert acc.build().message.text == expected, "assembled text differs"
        return deltas

    return run


def best(fn: Callable[[list[bytes]], int], chunks: list[bytes]) -> tuple[float, int]:
    times = []
    result = 0
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        result = fn(chunks)
        times.append(time.perf_counter() - t0)
    return min(times), result


def main(argv: Optional[Sequence[str]] = None) -> None:
    global TARGET, ROUNDS
    if smoke_requested(__doc__.splitlines()[0], argv):
        TARGET, ROUNDS = SMOKE_TARGET, SMOKE_ROUNDS
    print(f"python {sys.version.split()[0]}, best of {ROUNDS} rounds; floor {FLOOR_DELTAS_PER_S:,.0f} deltas/s")
    for name, make, parser in (("openai", openai_stream, OpenAIStreamParser),
                               ("anthropic", anthropic_stream, AnthropicStreamParser)):
        data, deltas = make()
        run = per_event(parser, expected_text(data))
        big, small = reads(data), event_reads(data)
        t_big, got_big = best(run, big)
        t_small, got_small = best(run, small)
        t_json, _ = best(split_json, big)
        assert got_big == got_small == deltas, (got_big, got_small, deltas)
        mb = len(data) / 1e6
        print(f"\n{name}: {mb:.1f} MB, {deltas:,} text deltas")
        for label, secs in (("16 KiB reads: per-event path", t_big),
                            ("one event per read: per-event path", t_small),
                            ("for scale: split + json.loads", t_json)):
            print(f"  {label:38s} {mb / secs:8.1f} MB/s  {deltas / secs:12,.0f} deltas/s")
        report(f"sse {name} per-event path, 16 KiB reads", deltas / t_big, FLOOR_DELTAS_PER_S, "deltas/s",
               target=f">= {FLOOR_DELTAS_PER_S:,.0f} deltas/s")
        report(f"sse {name} per-event path, one event per read", deltas / t_small, FLOOR_DELTAS_PER_S, "deltas/s",
               target=f">= {FLOOR_DELTAS_PER_S:,.0f} deltas/s")


if __name__ == "__main__":
    main()
