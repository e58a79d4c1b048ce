"""The shared HTTP layer: sessions, cancellable calls, bodies in and out.

Owns everything the clients do with ``requests``: one ``requests.Session``
per client whose connections report their sockets to the ``CallScope`` bound
on the calling thread, so ``CallScope.close()`` from any other thread can
shut a socket down and make a read blocked in ``recv`` (even one still
waiting for the response headers) return at once; the reader then releases
the connection. Request bodies are strict JSON and valid UTF-8 (lone
surrogates become U+FFFD, NaN/inf become null). Every read is bounded by the
client's read timeout and, nearer, the scope's deadline. Foreign exceptions
are translated in one place (``boundary.raise_mapped``); error bodies are
read up to 8 KiB. No local of ours holds the request headers once sent.
"""

from __future__ import annotations

import json
import logging
import math
import re
import socket
import threading
import time
import zlib
from collections.abc import Mapping
from typing import Any, Callable, Optional, Union

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from loopctl.errors import Cancelled, ModelError
from loopctl.providers.boundary import (
    ERROR_BODY_LIMIT,
    PROTOCOL,
    RATE_LIMIT,
    STATUS,
    TIMEOUT,
    TRANSPORT,
    CallInfo,
    Secret,
    error_kind,
    model_error,
    parse_json,
    parse_retry_after,
    raise_mapped,
    status_error,
)

log = logging.getLogger("loopctl")

RESPONSE_BODY_LIMIT = 10 * 1024 * 1024
READ_SIZE = 64 * 1024
Timeout = Union[float, tuple[float, float]]
DEFAULT_TIMEOUT: tuple[float, float] = (10.0, 120.0)


# -- cancellable calls ---------------------------------------------------------

_local = threading.local()


def _shutdown(sock: Any) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed or never connected


class CallScope:
    """The sockets one logical call uses; ``close()`` (any thread) shuts them.

    A scope is bound to the calling thread with ``with scope.bound():``;
    connections made through a tracked session attach their sockets to it.
    ``deadline`` (a ``time.monotonic()`` value) bounds the call's reads.
    """

    __slots__ = ("_lock", "_socks", "closed", "deadline")

    def __init__(self, deadline: Optional[float] = None) -> None:
        self._lock = threading.Lock()
        self._socks: list[Any] = []
        self.closed = False
        self.deadline = deadline

    def attach(self, sock: object) -> None:
        """Track ``sock``; shut it at once if the scope is already closed."""
        if sock is None:
            return
        with self._lock:
            if not self.closed:
                if sock not in self._socks:
                    self._socks.append(sock)
                return
        _shutdown(sock)

    @property
    def sock(self) -> Any:
        """The socket attached last (the one the call reads from), or None."""
        socks = self._socks
        return socks[-1] if socks else None

    def detach(self) -> None:
        """Forget the sockets (their connection went back to the pool)."""
        with self._lock:
            self._socks = []

    def close(self) -> None:
        """Shut down every attached socket (idempotent, any thread)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            socks = list(self._socks)
        for s in socks:
            _shutdown(s)

    def bound(self) -> _Binding:
        """Bind this scope to the calling thread for the ``with`` block."""
        return _Binding(self)


class _Binding:
    __slots__ = ("_scope", "_prev")

    def __init__(self, scope: CallScope) -> None:
        self._scope = scope
        self._prev: Optional[CallScope] = None

    def __enter__(self) -> CallScope:
        self._prev = getattr(_local, "scope", None)
        _local.scope = self._scope
        return self._scope

    def __exit__(self, *exc: object) -> None:
        _local.scope = self._prev


def current_scope() -> Optional[CallScope]:
    """The scope bound to the calling thread, if any."""
    return getattr(_local, "scope", None)


def _report_sock(conn: object) -> None:
    scope: Optional[CallScope] = getattr(_local, "scope", None)
    if scope is not None:
        scope.attach(getattr(conn, "sock", None))


class _TrackedHTTPConnection(HTTPConnection):
    def connect(self) -> None:
        super().connect()
        _report_sock(self)

    def getresponse(self, *args: object, **kwargs: object) -> Any:
        _report_sock(self)  # a reused keep-alive connection never calls connect()
        return super().getresponse(*args, **kwargs)


class _TrackedHTTPSConnection(HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        _report_sock(self)

    def getresponse(self, *args: object, **kwargs: object) -> Any:
        _report_sock(self)
        return super().getresponse(*args, **kwargs)


class _TrackedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _TrackedHTTPConnection


class _TrackedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _TrackedHTTPSConnection




class TrackingAdapter(HTTPAdapter):
    """An ``HTTPAdapter`` whose connections attach their sockets to the bound scope."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        """Make the pool manager with tracking connection pools."""
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _TrackedHTTPPool, "https": _TrackedHTTPSPool}
        self.poolmanager.key_fn_by_scheme = dict(self.poolmanager.key_fn_by_scheme)


def make_session() -> requests.Session:
    """A ``requests.Session`` with tracking adapters (one per client)."""
    s = requests.Session()
    adapter = TrackingAdapter(pool_connections=4, pool_maxsize=16, max_retries=0)
    s.mount("http://", adapter)
    s.mount("https://", adapter)
    return s


def _sock_of(resp: requests.Response) -> object:
    """Best-effort socket of a response from a session we did not make."""
    raw = resp.raw
    conn = getattr(raw, "_connection", None)
    sock = getattr(conn, "sock", None)
    if sock is None:
        fp = getattr(getattr(raw, "_fp", None), "fp", None)
        sock = getattr(getattr(fp, "raw", None), "_sock", None)
    return sock


def split_timeout(timeout: Timeout) -> tuple[float, float]:
    """``(connect, read)`` seconds from a client's ``timeout``."""
    if isinstance(timeout, tuple):
        return float(timeout[0]), float(timeout[1])
    return float(timeout), float(timeout)


def read_bound(read_timeout: Optional[float], deadline: Optional[float]) -> tuple[Optional[float], bool]:
    """The socket timeout for one read, and whether the deadline is the nearer bound."""
    if deadline is None:
        return read_timeout, False
    left = max(deadline - time.monotonic(), 0.001)
    if read_timeout is None or left < read_timeout:
        return left, True
    return read_timeout, False


def check_deadline(scope: CallScope, call: CallInfo) -> None:
    """Raise the timeout error once the scope's deadline has passed.

    Between reads: a server trickling bytes never lets one read time out.
    """
    if scope.deadline is not None and time.monotonic() >= scope.deadline:
        err = model_error(f"{call.label}: timed out: the call's deadline passed", retryable=True, kind=TIMEOUT,
                          summary="the call's deadline passed")
        err.__dict__["deadline_hit"] = True
        raise err


# -- request bodies ---------------------------------------------------------------

_SURROGATE = re.compile("[\ud800-\udfff]")

#: The largest int a provider's JSON parser takes (a signed 64-bit int): a
#: configured count above it could not be sent, or not be read as sent.
WIRE_INT_MAX = 2**63 - 1


def _finite(value: object) -> object:
    # NaN and infinities are not JSON: they go as null.
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def encode_body(body: Mapping[str, Any]) -> bytes:
    """``body`` as strict JSON in valid UTF-8 (what a provider accepts).

    NaN/inf (not JSON) are sent as ``null``; a lone surrogate (not UTF-8)
    as U+FFFD. The usual body takes the fast path: one ``dumps``, one encode.
    """
    try:
        text = json.dumps(body, ensure_ascii=False, allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(body), ensure_ascii=False, allow_nan=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text).encode("utf-8")


# -- the calls -----------------------------------------------------------------------


def post(
    session: requests.Session,
    call: CallInfo,
    url: str,
    headers: dict[str, str],
    body: Mapping[str, Any],
    *,
    scope: CallScope,
) -> requests.Response:
    """POST ``body`` as JSON and return the response with its body unread.

    The scope is bound for the call, so ``scope.close()`` interrupts it.
    ``headers`` is consumed: this frame drops it once sent.

    Raises:
        Cancelled: the scope was closed.
        ConfigError: a header value ``requests`` refuses (no cause chained).
        ModelError: a timeout or connection failure (tagged, retryable).
    """
    if scope.closed:
        raise Cancelled("model call closed")
    data = encode_body(body)
    # Bodies are read as raw bytes (so a deadline and a cancel reach every
    # read): ask for them as sent, whatever requests' default or a user's
    # extra header says.
    for name in [k for k in headers if k.lower() == "accept-encoding"]:
        del headers[name]
    headers["Accept-Encoding"] = "identity"
    connect, read = call.connect_timeout, call.read_timeout
    deadline_hit = False
    if scope.deadline is not None:
        left = max(scope.deadline - time.monotonic(), 0.001)
        if connect is not None:
            connect = min(connect, left)
        if read is None or left < read:
            read, deadline_hit = left, True
    try:
        try:
            with scope.bound():
                resp = session.post(url, data=data, headers=headers, timeout=(connect, read), stream=True)
        finally:
            del headers  # never kept alive by a traceback through this frame
    except Exception as exc:
        if scope.closed:
            raise Cancelled("model call closed") from None
        raise_mapped(exc, call, deadline_hit=deadline_hit)
    scope.attach(_sock_of(resp))  # sessions without tracking adapters
    if scope.closed:
        resp.close()
        raise Cancelled("model call closed")
    return resp


def response_status_error(resp: requests.Response, label: str) -> ModelError:
    """The ``ModelError`` for a non-2xx response (reads at most 8 KiB; closes it)."""
    try:
        body = resp.raw.read(ERROR_BODY_LIMIT) or b""
        body = decoded(body, resp.headers.get("content-encoding"), ERROR_BODY_LIMIT, label)
    except Exception:  # the message is best effort; the status still tells
        body = b""
    finally:
        resp.close()
    return status_error(resp.status_code, resp.reason or "", body, resp.headers.get("retry-after"), label)


def read_json(resp: requests.Response, scope: CallScope, call: CallInfo, limit: int = RESPONSE_BODY_LIMIT) -> object:
    """Read a whole JSON body (at most ``limit`` bytes), cancellable via ``scope``.

    Each read waits at most the client's read timeout, and never past the
    scope's deadline.
    """
    chunks: list[bytes] = []
    size = 0
    raw: Any = resp.raw
    read = getattr(raw, "read1", None) or raw.read  # read1: what has arrived, so the deadline is checked
    try:
        while True:
            check_deadline(scope, call)
            t, deadline_hit = read_bound(call.read_timeout, scope.deadline)
            sock = scope.sock
            if sock is not None:
                sock.settimeout(t)
            try:
                chunk = read(READ_SIZE)
            except Exception as exc:
                if scope.closed:
                    raise Cancelled("model call closed") from None
                raise_mapped(exc, call, deadline_hit=deadline_hit)
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise model_error(f"{call.label}: response body larger than {limit} bytes", kind=PROTOCOL)
            chunks.append(chunk)
    except BaseException:
        resp.close()
        raise
    if scope.closed:
        resp.close()
        raise Cancelled("model call closed")
    scope.detach()  # the connection goes back to the pool: never shut it from here on
    try:
        resp.raw.release_conn()
    except Exception:
        resp.close()
    raw = decoded(b"".join(chunks), resp.headers.get("content-encoding"), limit, call.label)
    text = raw.decode("utf-8", "replace")
    return parse_json(text, call.label, "response body")


def decoded(body: bytes, encoding: Optional[str], limit: int, label: str) -> bytes:
    """``body`` undone from a ``Content-Encoding`` (gzip or deflate) a server used though asked not to.

    At most ``limit`` bytes come out (a small body may inflate to gigabytes).

    Raises:
        ModelError: (kind "protocol") another encoding, a body that does not
            decode, or one larger than ``limit`` once decoded.
    """
    coding = (encoding or "").strip().lower()
    if coding in ("", "identity"):
        return body
    if coding not in ("gzip", "x-gzip", "deflate"):
        raise model_error(f"{label}: the response body is {coding[:40]!r}-encoded (asked for identity)", kind=PROTOCOL)
    # wbits 32 + 15: a gzip or zlib header, detected; raw deflate (some servers' "deflate") as a fallback.
    for wbits in (zlib.MAX_WBITS | 32, -zlib.MAX_WBITS):
        inflater = zlib.decompressobj(wbits)
        try:
            out = inflater.decompress(body, limit + 1)
        except zlib.error:
            continue
        if len(out) > limit or inflater.unconsumed_tail:
            raise model_error(f"{label}: response body larger than {limit} bytes", kind=PROTOCOL)
        return out
    raise model_error(f"{label}: the {coding}-encoded response body does not decode", kind=PROTOCOL)


Reader = Callable[[int], bytes]

__all__ = [
    "DEFAULT_TIMEOUT",
    "PROTOCOL",
    "RATE_LIMIT",
    "STATUS",
    "TIMEOUT",
    "TRANSPORT",
    "CallScope",
    "Secret",
    "Timeout",
    "TrackingAdapter",
    "check_deadline",
    "current_scope",
    "decoded",
    "encode_body",
    "error_kind",
    "make_session",
    "model_error",
    "parse_retry_after",
    "post",
    "read_bound",
    "read_json",
    "response_status_error",
    "split_timeout",
]
