"""SSE decode throughput: the decoder and the accumulator beside a bytes.split floor.

Generates a ~20 MB stream in each provider's recorded wire format (chat
completion chunks as OpenAI sends them, Anthropic message events), cuts it
into 16 KiB reads (what one ``read1`` returns on a busy socket), and times,
in the same run:

- floor: only split the reads into lines with ``bytes.split`` (carrying the
  partial last line), the least any line-based reader does;
- decoder: ``SSEDecoder.feed`` (framing only, events out);
- full: decoder + the provider's stream parser (JSON per event) +
  ``StreamAccumulator`` (the reply assembled);
- reference: bytes.split lines + ``json.loads`` of each data line (what
  parsing the JSON alone costs; printed so the full path's overhead beyond
  the JSON it cannot avoid is visible).

Prints MB/s and deltas/s for each and the ratio to the floor. Best of 5.
Run: ``python benchmarks/sse_throughput.py`` (about 10 s).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from loopctl.providers.anthropic import AnthropicStreamParser  # noqa: E402
from loopctl.providers.base import PartDelta, StreamAccumulator  # noqa: E402
from loopctl.providers.openai import OpenAIStreamParser  # noqa: E402
from loopctl.providers.sse import SSEDecoder  # noqa: E402

TARGET = 20 * 1024 * 1024
READ = 16 * 1024
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


def floor(chunks: list[bytes]) -> int:
    lines = 0
    tail = b""
    for chunk in chunks:
        parts = (tail + chunk).split(b"\n")
        tail = parts.pop()
        lines += len(parts)
    return lines


def json_floor(chunks: list[bytes]) -> int:
    # Reference only: bytes.split lines + json.loads of every data line, the
    # least any consumer that reads the JSON does. Not the floor.
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
    dec = SSEDecoder()
    n = 0
    for chunk in chunks:
        n += len(dec.feed(chunk))
    return n


def full(parser_cls: Callable[[], Any]) -> Callable[[list[bytes]], int]:
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
        resp = acc.build()
        assert resp.message.text, "nothing assembled"
        return deltas

    return run


def best(fn: Callable[[list[bytes]], int], chunks: list[bytes], repeat: int = 5) -> tuple[float, int]:
    times = []
    result = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn(chunks)
        times.append(time.perf_counter() - t0)
    return min(times), result


def main() -> None:
    print(f"python {sys.version.split()[0]}, reads of {READ // 1024} KiB")
    for name, make, parser in (("openai", openai_stream, OpenAIStreamParser),
                               ("anthropic", anthropic_stream, AnthropicStreamParser)):
        data, deltas = make()
        chunks = reads(data)
        mb = len(data) / 1e6
        t_floor, _ = best(floor, chunks)
        t_dec, events = best(decoder_only, chunks)
        t_full, got = best(full(parser), chunks)
        t_json, _ = best(json_floor, chunks)
        assert got == deltas, (got, deltas)
        print(f"\n{name}: {mb:.1f} MB, {deltas:,} text deltas, {events:,} SSE events")
        for label, t in (("floor (bytes.split lines)", t_floor), ("decoder (SSE framing)", t_dec),
                         ("full (decoder+JSON+accumulator)", t_full)):
            print(f"  {label:34s} {mb / t:9.1f} MB/s  {deltas / t:12,.0f} deltas/s  "
                  f"{t_floor / t:5.2f}x floor")
        for label, t in (("decoder", t_dec), ("decoder+JSON+accumulator", t_full)):
            # One line per figure for benchmarks/run_all.py (value, floor, value/floor).
            print(f"RESULT sse {name} {label} | {mb / t:.4g} MB/s | {mb / t_floor:.4g} MB/s | "
                  f"{t_floor / t:.3g}x", flush=True)
        print(f"  {'reference: split + json.loads':34s} {mb / t_json:9.1f} MB/s  {deltas / t_json:12,.0f} deltas/s  "
              f"{t_floor / t_json:5.2f}x floor  (full runs at {t_json / t_full:.2f}x its speed)")


if __name__ == "__main__":
    main()
