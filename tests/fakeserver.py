"""A real HTTP server on 127.0.0.1 that speaks the model APIs' wire formats.

A stdlib ``ThreadingHTTPServer`` on its own thread (named ``fakeserver-*``,
never ``loopctl-*``) answers each POST with the next scripted item: a whole
``Reply`` (JSON or bytes, any status and headers) or a ``Stream`` of real SSE
bytes sent with chunked transfer encoding (or close-delimited), each piece
flushed as its own chunk. A stream may wait on a ``Gate`` (an Event the test
sets), ``Stall`` (stop sending until the client goes away), or ``Cut`` (drop
the connection without the terminal chunk). The server records every request
(path, headers, JSON body) and counts open connections, so tests can check
that a client closed what it opened. Builders make OpenAI chat-completion
and Anthropic messages payloads.
"""

from __future__ import annotations

import json
import select
import socket
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional, Union

import attrs


@attrs.define
class Reply:
    """A whole response: ``body`` is JSON-encoded unless it is bytes."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = attrs.field(factory=dict)


@attrs.frozen
class Gate:
    """Wait (at most ``timeout`` s) for ``event`` before sending the next piece."""

    event: threading.Event
    timeout: float = 10.0


@attrs.frozen
class Stall:
    """Send nothing more; end when the client closes (or the server stops)."""


@attrs.frozen
class Cut:
    """Drop the connection now, without the body's terminal chunk."""


Piece = Union[bytes, Gate, Stall, Cut]


@attrs.define
class Stream:
    """A streamed 200 response of SSE ``pieces``.

    ``chunked=False`` sends a close-delimited body (HTTP/1.0 style), where
    a cut looks exactly like a normal end of body.
    """

    pieces: Sequence[Piece]
    chunked: bool = True
    status: int = 200
    headers: dict[str, str] = attrs.field(factory=dict)


@attrs.frozen
class Hang:
    """Send no response at all (not even headers) until the client goes away."""


Item = Union[Reply, Stream, Hang]


@attrs.frozen
class Recorded:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)


class FakeServer:
    """The scriptable server; use as a context manager or call ``close()``."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self._script: deque[Item] = deque()
        self._cond = threading.Condition()
        self.open_connections = 0
        self.total_connections = 0
        self.stalls = 0
        self.stopping = threading.Event()
        server = self

        class Handler(_Handler):
            fake = server

        self._httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01},
            name=f"fakeserver-{self.port}", daemon=True,
        )
        self._thread.start()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (the Anthropic base URL)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_url(self) -> str:
        """The OpenAI-style base URL (with ``/v1``)."""
        return self.url + "/v1"

    def push(self, *items: Item) -> None:
        """Script the next replies, in order."""
        with self._cond:
            self._script.extend(items)

    def _next(self) -> Optional[Item]:
        with self._cond:
            return self._script.popleft() if self._script else None

    def _conn_delta(self, d: int) -> None:
        with self._cond:
            self.open_connections += d
            if d > 0:
                self.total_connections += 1
            self._cond.notify_all()

    def _stalled(self) -> None:
        with self._cond:
            self.stalls += 1
            self._cond.notify_all()

    def wait_stalls(self, n: int, timeout: float = 5.0) -> bool:
        """Block until ``n`` streams have started stalling in total."""
        with self._cond:
            return self._cond.wait_for(lambda: self.stalls >= n, timeout)

    def wait_open_at_most(self, n: int, timeout: float = 5.0) -> bool:
        """Block until at most ``n`` client connections are open."""
        with self._cond:
            return self._cond.wait_for(lambda: self.open_connections <= n, timeout)

    def close(self) -> None:
        """Stop serving; stalled streams end."""
        self.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    def __enter__(self) -> FakeServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        return  # clients that hang up mid-response are part of the tests


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: FakeServer

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.fake._conn_delta(1)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.fake._conn_delta(-1)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def do_GET(self) -> None:
        self._send_whole(Reply(404, {"error": {"message": "not found"}}))

    def do_POST(self) -> None:
        n = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(n) if n else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        with self.fake._cond:
            self.fake.requests.append(Recorded("POST", self.path, headers, body))
        item = self.fake._next()
        if item is None:
            item = Reply(500, {"error": {"message": "fake server: no scripted reply"}})
        if isinstance(item, Reply):
            self._send_whole(item)
        elif isinstance(item, Hang):
            self._stall()
        else:
            self._send_stream(item)

    def _send_whole(self, item: Reply) -> None:
        body = item.body if isinstance(item.body, bytes) else json.dumps(item.body).encode()
        self.send_response(item.status)
        ctype = "application/octet-stream" if isinstance(item.body, bytes) else "application/json"
        self.send_header("content-type", item.headers.get("content-type", ctype))
        for k, v in item.headers.items():
            if k.lower() != "content-type":
                self.send_header(k, v)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_stream(self, item: Stream) -> None:
        self.send_response(item.status)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        for k, v in item.headers.items():
            self.send_header(k, v)
        if item.chunked:
            self.send_header("transfer-encoding", "chunked")
        else:
            self.send_header("connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.flush()
        try:
            for piece in item.pieces:
                if isinstance(piece, bytes):
                    if item.chunked:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    else:
                        self.wfile.write(piece)
                elif isinstance(piece, Gate):
                    piece.event.wait(piece.timeout)
                elif isinstance(piece, Stall):
                    self._stall()
                    return
                elif isinstance(piece, Cut):
                    self._cut()
                    return
            if item.chunked:
                self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True

    def _stall(self) -> None:
        self.close_connection = True
        self.fake._stalled()
        sock = self.connection
        while not self.fake.stopping.is_set():
            readable, _, _ = select.select([sock], [], [], 0.05)
            if readable:
                try:
                    if not sock.recv(1, socket.MSG_PEEK):
                        return  # the client closed or shut down its end
                except OSError:
                    return
                return

    def _cut(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


# -- payload builders ------------------------------------------------------------


def sse(data: Any, event: Optional[str] = None) -> bytes:
    """One SSE event; ``data`` is JSON-encoded unless it is a str."""
    text = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return (head + "".join(f"data: {line}\n" for line in text.split("\n")) + "\n").encode()


OA_DONE = b"data: [DONE]\n\n"


def oa_chunk(delta: Optional[dict[str, Any]] = None, finish: Optional[str] = None,
             usage: Optional[dict[str, int]] = None, model: str = "gpt-test", choices: bool = True) -> bytes:
    """One chat.completion.chunk event."""
    obj: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": model}
    obj["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish}] if choices else []
    if usage is not None:
        obj["usage"] = usage
    return sse(obj)


def _pieces(text: str, n: int) -> list[str]:
    return [text[i : i + n] for i in range(0, len(text), n)] if text else []


def openai_stream(
    text: str = "",
    *,
    reasoning: str = "",
    tool_calls: Iterable[tuple[str, str, str]] = (),
    finish: Optional[str] = None,
    usage: Optional[tuple[int, int]] = (11, 7),
    piece: int = 4,
    model: str = "gpt-test",
) -> list[bytes]:
    """A whole chat-completions stream; tool calls are ``(id, name, args_json)``."""
    out = [oa_chunk({"role": "assistant", "content": ""}, model=model)]
    out += [oa_chunk({"reasoning_content": p}, model=model) for p in _pieces(reasoning, piece)]
    out += [oa_chunk({"content": p}, model=model) for p in _pieces(text, piece)]
    calls = list(tool_calls)
    for i, (cid, name, args) in enumerate(calls):
        first = {"index": i, "id": cid, "type": "function", "function": {"name": name, "arguments": ""}}
        out.append(oa_chunk({"tool_calls": [first]}, model=model))
        out += [
            oa_chunk({"tool_calls": [{"index": i, "function": {"arguments": p}}]}, model=model)
            for p in _pieces(args, piece)
        ]
    out.append(oa_chunk({}, finish or ("tool_calls" if calls else "stop"), model=model))
    if usage is not None:
        u = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
        out.append(oa_chunk(usage=u, choices=False, model=model))
    out.append(OA_DONE)
    return out


def openai_completion(text: str = "", tool_calls: Iterable[tuple[str, str, str]] = (),
                      finish: Optional[str] = None, usage: tuple[int, int] = (11, 7),
                      model: str = "gpt-test") -> dict[str, Any]:
    """A non-streaming chat.completion body."""
    calls = [{"id": c, "type": "function", "function": {"name": n, "arguments": a}} for c, n, a in tool_calls]
    msg: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        msg["tool_calls"] = calls
    return {
        "id": "chatcmpl-2", "object": "chat.completion", "model": model,
        "choices": [{"index": 0, "message": msg, "finish_reason": finish or ("tool_calls" if calls else "stop")}],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
    }


def anthropic_stream(
    text: str = "",
    *,
    thinking: str = "",
    signature: str = "",
    tool_calls: Iterable[tuple[str, str, str]] = (),
    stop: Optional[str] = None,
    usage: tuple[int, int] = (21, 9),
    piece: int = 4,
    model: str = "claude-test",
    ping: bool = True,
) -> list[bytes]:
    """A whole messages stream; tool calls are ``(id, name, args_json)``."""
    out = [sse({"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "usage": {"input_tokens": usage[0], "output_tokens": 1}}}, "message_start")]
    if ping:
        out.append(sse({"type": "ping"}, "ping"))
    idx = 0
    if thinking:
        out.append(sse({"type": "content_block_start", "index": idx,
                        "content_block": {"type": "thinking", "thinking": ""}}, "content_block_start"))
        out += [sse({"type": "content_block_delta", "index": idx,
                     "delta": {"type": "thinking_delta", "thinking": p}}, "content_block_delta")
                for p in _pieces(thinking, piece)]
        if signature:
            out.append(sse({"type": "content_block_delta", "index": idx,
                            "delta": {"type": "signature_delta", "signature": signature}}, "content_block_delta"))
        out.append(sse({"type": "content_block_stop", "index": idx}, "content_block_stop"))
        idx += 1
    if text:
        out.append(sse({"type": "content_block_start", "index": idx,
                        "content_block": {"type": "text", "text": ""}}, "content_block_start"))
        out += [sse({"type": "content_block_delta", "index": idx,
                     "delta": {"type": "text_delta", "text": p}}, "content_block_delta")
                for p in _pieces(text, piece)]
        out.append(sse({"type": "content_block_stop", "index": idx}, "content_block_stop"))
        idx += 1
    calls = list(tool_calls)
    for cid, name, args in calls:
        out.append(sse({"type": "content_block_start", "index": idx,
                        "content_block": {"type": "tool_use", "id": cid, "name": name, "input": {}}},
                       "content_block_start"))
        out += [sse({"type": "content_block_delta", "index": idx,
                     "delta": {"type": "input_json_delta", "partial_json": p}}, "content_block_delta")
                for p in _pieces(args, piece)]
        out.append(sse({"type": "content_block_stop", "index": idx}, "content_block_stop"))
        idx += 1
    out.append(sse({"type": "message_delta", "delta": {"stop_reason": stop or ("tool_use" if calls else "end_turn"),
                                                       "stop_sequence": None},
                    "usage": {"output_tokens": usage[1]}}, "message_delta"))
    out.append(sse({"type": "message_stop"}, "message_stop"))
    return out


def anthropic_message(text: str = "", tool_calls: Iterable[tuple[str, str, Any]] = (),
                      stop: Optional[str] = None, usage: tuple[int, int] = (21, 9),
                      model: str = "claude-test") -> dict[str, Any]:
    """A non-streaming messages body; tool inputs are dicts."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    calls = list(tool_calls)
    content += [{"type": "tool_use", "id": c, "name": n, "input": i} for c, n, i in calls]
    return {"id": "msg_2", "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop or ("tool_use" if calls else "end_turn"),
            "usage": {"input_tokens": usage[0], "output_tokens": usage[1]}}


def open_fds() -> int:
    """How many file descriptors this process has open (Linux)."""
    import os

    return len(os.listdir("/proc/self/fd"))


__all__ = [
    "OA_DONE", "Cut", "FakeServer", "Gate", "Hang", "Recorded", "Reply", "Stall", "Stream",
    "anthropic_message", "anthropic_stream", "oa_chunk", "open_fds", "openai_completion",
    "openai_stream", "sse",
]
