"""The streamed body of a model call: ``SSEStream``, the ``ModelStream`` of both HTTP clients.

The POST happens on the first ``next()`` (so the handler's deadline and
``close()`` cover the wait for headers too), the body is read with ``read1``
(one system call per read, never waiting to fill a buffer) and decoded as
the bytes arrive. ``close()`` works from any thread: it shuts the socket
down, and whichever side is not blocked releases the connection exactly
once. A body read to its end returns its connection to the pool; any other
ends it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any, Callable, Optional

import requests

from loopctl.errors import Cancelled, LoopError, ModelError
from loopctl.providers.base import StreamEvent
from loopctl.providers.boundary import (
    PROTOCOL,
    CallInfo,
    model_error,
    raise_mapped,
)
from loopctl.providers.http import (
    READ_SIZE,
    CallScope,
    check_deadline,
    read_bound,
    read_json,
)
from loopctl.providers.reader import StreamParser, StreamReader

log = logging.getLogger("loopctl")


class SSEStream:
    """A ``ModelStream`` over a streamed HTTP response, decoded as it arrives.

    The POST happens on the first ``next()``, so ``close()`` and
    ``set_deadline()`` cover the wait for the response headers too.
    ``close()`` is safe from any thread: it shuts the socket down so a
    blocked read returns, and the connection is released (by the reader,
    or right here when no read is in progress).
    """

    def __init__(
        self,
        open_response: Callable[[CallScope], requests.Response],
        parser: StreamParser,
        call: CallInfo,
        on_json: Optional[Callable[[Any], Iterator[StreamEvent]]] = None,
        hint: str = "",
    ) -> None:
        self._open_response = open_response
        self._call = call
        self._parser = parser
        self._label = call.label
        self._hint = hint
        self._on_json = on_json
        self._scope = CallScope()
        self._lock = threading.Lock()
        self._resp: Optional[requests.Response] = None
        self._closed = False
        self._reading = False
        self._released = False

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._closed

    def set_deadline(self, deadline: Optional[float]) -> None:
        """Bound the wait for the next event: a ``time.monotonic()`` value or None."""
        self._scope.deadline = deadline

    def close(self) -> None:
        """Stop the stream from any thread; a blocked read returns promptly."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._released:
                return  # the connection may already serve another call
            reading = self._reading
            resp = self._resp
            self._scope.close()  # under the lock: no read starts after this
        if not reading and resp is not None:
            self._release(resp, complete=False)

    def _release(self, resp: requests.Response, complete: bool) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
            if complete:
                self._scope.detach()
        try:
            if complete:
                resp.raw.release_conn()  # fully read: the connection can be reused
            else:
                resp.close()
        except Exception:  # closing a socket that a shutdown already broke
            log.debug("%s: error while releasing the connection", self._label, exc_info=True)

    def _read(self, read1: Callable[[int], bytes]) -> Optional[bytes]:
        scope = self._scope
        with self._lock:
            if self._closed:
                return None
            self._reading = True
        t, deadline_hit = read_bound(self._call.read_timeout, scope.deadline)
        try:
            try:
                check_deadline(scope, self._call)
            except ModelError:
                if self._closed:
                    return None
                raise
            sock = scope.sock
            if sock is not None:
                sock.settimeout(t)
            return read1(READ_SIZE)
        except ModelError:
            raise
        except Exception as exc:
            if self._closed:
                return None
            raise_mapped(exc, self._call, deadline_hit=deadline_hit)
        finally:
            with self._lock:
                self._reading = False

    def __iter__(self) -> Iterator[StreamEvent]:
        try:
            yield from self._events()
        except LoopError as err:
            self._call.secret.scrub(err)  # the one redaction point of a streamed call
            raise

    def _content_type(self, resp: requests.Response) -> str:
        """The response's content type, lowercased, when it is one this stream reads.

        Raises:
            ModelError: (kind "protocol") not an event stream (nor the JSON
                body of a server that ignored ``"stream": true``), or an
                encoded one (asked for identity: it cannot be parsed as it
                arrives).
        """
        ctype = resp.headers.get("content-type", "").lower()
        if ctype and not ctype.startswith("text/event-stream") and not (
            self._on_json is not None and ctype.startswith("application/json")
        ):
            raise model_error(
                f"{self._label}: expected an event stream from {self._call.url}, got "
                f"{ctype.split(';')[0]}{self._hint}",
                kind=PROTOCOL,
                summary=f"not an event stream ({ctype.split(';')[0]})",
            )
        coding = resp.headers.get("content-encoding", "").strip().lower()
        if coding not in ("", "identity") and not ctype.startswith("application/json"):  # JSON is decoded whole
            raise model_error(
                f"{self._label}: the event stream is {coding[:40]!r}-encoded (asked for identity)",
                kind=PROTOCOL,
                summary="an encoded event stream",
            )
        return ctype

    def _events(self) -> Iterator[StreamEvent]:
        scope = self._scope
        if self._closed:
            return
        try:
            resp = self._open_response(scope)
        except Cancelled:
            return
        complete = False
        with self._lock:
            self._resp = resp
            closed = self._closed
        try:
            if closed:
                return
            ctype = self._content_type(resp)
            if self._on_json is not None and ctype.startswith("application/json"):
                # A server that ignored "stream": true answered with one JSON body.
                with self._lock:
                    self._reading = True  # close() then only shuts the socket
                try:
                    data = read_json(resp, scope, self._call)
                except Cancelled:
                    return
                finally:
                    with self._lock:
                        self._reading = False
                complete = True
                yield from self._on_json(data)
                return
            raw: Any = resp.raw
            read1 = getattr(raw, "read1", None)
            if read1 is None:  # urllib3 < 2: read the http.client response directly
                read1 = raw._fp.read1
            reader = StreamReader(self._parser, self._label)
            while True:
                chunk = self._read(read1)
                if chunk is None:
                    return  # closed
                if not chunk:
                    complete = True
                    break
                yield from reader.feed(chunk)
                if reader.done:
                    complete = self._drain(read1)
                    return
            if self._closed:
                return
            yield from reader.finish()
        finally:
            self._release(resp, complete)

    def _drain(self, read1: Callable[[int], bytes]) -> bool:
        # After the terminal event the body should end at once; read that end
        # (briefly) so the connection can go back to the pool.
        scope = self._scope
        saved = scope.deadline
        scope.deadline = time.monotonic() + 0.25
        try:
            for _ in range(4):
                chunk = self._read(read1)
                if chunk is None:
                    return False
                if not chunk:
                    return True
            return False
        except ModelError:
            return False
        finally:
            scope.deadline = saved


# -- the client base ------------------------------------------------------------


__all__ = ["SSEStream"]
