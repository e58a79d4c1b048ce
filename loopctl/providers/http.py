"""The shared HTTP layer: sessions, cancellable calls, status -> error mapping.

Owns everything the clients do with ``requests``: one ``requests.Session``
per client whose connections report their sockets to the ``CallScope`` bound
on the calling thread, so ``CallScope.close()`` from any other thread can
shut a socket down and make a read blocked in ``recv`` (even one still
waiting for the response headers) return at once; the reader then releases
the connection. Errors leave this module as ``ModelError`` with two extra
attributes, ``kind`` ("status", "rate_limit", "timeout", "transport",
"protocol") and ``retry_after`` (seconds or None); foreign exceptions are
chained. Error bodies are read up to 8 KiB. Secrets never reach a message.
"""

from __future__ import annotations

import email.utils
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any, Optional, Union

import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from loopctl.errors import Cancelled, ModelError

log = logging.getLogger("loopctl")

ERROR_BODY_LIMIT = 8 * 1024
RESPONSE_BODY_LIMIT = 10 * 1024 * 1024
READ_SIZE = 64 * 1024
RATE_LIMIT_STATUSES = frozenset((429, 503, 529))
Timeout = Union[float, tuple[float, float]]
DEFAULT_TIMEOUT: tuple[float, float] = (10.0, 120.0)

# Kinds of failure a ModelError from this layer carries in ``.kind``.
STATUS = "status"
RATE_LIMIT = "rate_limit"
TIMEOUT = "timeout"
TRANSPORT = "transport"
PROTOCOL = "protocol"


def model_error(
    message: str,
    status: Optional[int] = None,
    retryable: bool = False,
    *,
    kind: str = STATUS,
    retry_after: Optional[float] = None,
) -> ModelError:
    """A ``ModelError`` tagged with the failure ``kind`` and ``retry_after``."""
    err = ModelError(message, status, retryable)
    err.__dict__.update(kind=kind, retry_after=retry_after)
    return err


def error_kind(err: BaseException) -> Optional[str]:
    """The ``kind`` tag of an error from this layer (None for other errors)."""
    return getattr(err, "kind", None)


# -- secrets -------------------------------------------------------------------

_KEY_SHAPES = re.compile(r"\b(sk-[A-Za-z0-9_\-*]{6,}|key-[A-Za-z0-9_\-*]{12,})")


class Secret:
    """A credential that never shows itself in a repr, str or log line."""

    __slots__ = ("_value",)

    def __init__(self, value: Optional[str]) -> None:
        self._value = value or None

    def reveal(self) -> Optional[str]:
        """The credential itself (for the request header only)."""
        return self._value

    def __bool__(self) -> bool:
        return self._value is not None

    def __repr__(self) -> str:
        return "Secret(<redacted>)" if self._value else "Secret(None)"

    __str__ = __repr__

    def redact(self, text: str) -> str:
        """``text`` with this credential and anything key-shaped masked."""
        if self._value:
            text = text.replace(self._value, "<redacted>")
        return _KEY_SHAPES.sub("<redacted>", text)


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

    def attach(self, sock: Any) -> None:
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

    def __exit__(self, *exc: Any) -> None:
        _local.scope = self._prev


def current_scope() -> Optional[CallScope]:
    """The scope bound to the calling thread, if any."""
    return getattr(_local, "scope", None)


def _report_sock(conn: Any) -> None:
    scope: Optional[CallScope] = getattr(_local, "scope", None)
    if scope is not None:
        scope.attach(getattr(conn, "sock", None))


class _TrackedHTTPConnection(HTTPConnection):
    def connect(self) -> None:
        super().connect()
        _report_sock(self)

    def getresponse(self, *args: Any, **kwargs: Any) -> Any:
        _report_sock(self)  # a reused keep-alive connection never calls connect()
        return super().getresponse(*args, **kwargs)


class _TrackedHTTPSConnection(HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        _report_sock(self)

    def getresponse(self, *args: Any, **kwargs: Any) -> Any:
        _report_sock(self)
        return super().getresponse(*args, **kwargs)


class _TrackedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _TrackedHTTPConnection


class _TrackedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _TrackedHTTPSConnection


class TrackingAdapter(HTTPAdapter):
    """An ``HTTPAdapter`` whose connections attach their sockets to the bound scope."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
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


def _sock_of(resp: requests.Response) -> Any:
    """Best-effort socket of a response from a session we did not make."""
    raw = resp.raw
    conn = getattr(raw, "_connection", None)
    sock = getattr(conn, "sock", None)
    if sock is None:
        fp = getattr(getattr(raw, "_fp", None), "fp", None)
        sock = getattr(getattr(fp, "raw", None), "_sock", None)
    return sock


def _timeouts(timeout: Timeout, deadline: Optional[float]) -> tuple[float, float]:
    if isinstance(timeout, tuple):
        connect, read = timeout
    else:
        connect = read = float(timeout)
    if deadline is not None:
        left = max(deadline - time.monotonic(), 0.001)
        read = min(read, left)
        connect = min(connect, left)
    return connect, read


_TIMEOUT_EXC = (requests.Timeout, urllib3.exceptions.TimeoutError, socket.timeout)


def transport_error(label: str, exc: BaseException, timeout: Optional[float] = None) -> ModelError:
    """Map a foreign network exception to a tagged, retryable ``ModelError``."""
    if isinstance(exc, _TIMEOUT_EXC) or "timed out" in str(exc):
        within = f" within {timeout:g}s" if timeout is not None else ""
        return model_error(f"{label}: timed out: no data{within}", retryable=True, kind=TIMEOUT)
    return model_error(f"{label}: connection failed: {type(exc).__name__}", retryable=True, kind=TRANSPORT)


def post(
    session: requests.Session,
    url: str,
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    *,
    timeout: Timeout,
    scope: CallScope,
    label: str,
) -> requests.Response:
    """POST ``body`` as JSON and return the response with its body unread.

    The scope is bound for the call, so ``scope.close()`` interrupts it.

    Raises:
        Cancelled: the scope was closed.
        ModelError: a timeout or connection failure (tagged, retryable).
    """
    if scope.closed:
        raise Cancelled("model call closed")
    data = json.dumps(body, ensure_ascii=False).encode("utf-8")
    connect, read = _timeouts(timeout, scope.deadline)
    try:
        with scope.bound():
            resp = session.post(url, data=data, headers=dict(headers), timeout=(connect, read), stream=True)
    except Exception as exc:
        if scope.closed:
            raise Cancelled("model call closed") from exc
        raise transport_error(label, exc, read) from exc
    scope.attach(_sock_of(resp))  # sessions without tracking adapters
    if scope.closed:
        resp.close()
        raise Cancelled("model call closed")
    return resp


_raw_decode = json.JSONDecoder().raw_decode


def parse_json(text: str, label: str, what: str) -> Any:
    """Parse one JSON document from a stream (fast path for the usual shape).

    Raises:
        ModelError: (kind "protocol") the text is not one JSON document.
    """
    try:
        value, end = _raw_decode(text)
        if end == len(text) or not text[end:].strip():
            return value
    except ValueError:
        pass
    try:
        return json.loads(text)  # leading whitespace and the exact error
    except ValueError as exc:
        raise model_error(f"{label}: malformed JSON in {what}: {text[:200]!r}", kind=PROTOCOL) from exc


def parse_retry_after(value: Optional[str], now: Optional[float] = None) -> Optional[float]:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    base = time.time() if now is None else now
    return max(0.0, when.timestamp() - base)


def _provider_message(body: bytes) -> str:
    text = body.decode("utf-8", "replace")
    try:
        data = json.loads(text)
    except ValueError:
        return text.strip()[:500]
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("type")
            if msg:
                return str(msg)[:1000]
        elif isinstance(err, str):
            return err[:1000]
        if isinstance(data.get("message"), str):
            return str(data["message"])[:1000]
    return text.strip()[:500]


def status_error(resp: requests.Response, label: str, secret: Secret) -> ModelError:
    """The ``ModelError`` for a non-2xx response (reads at most 8 KiB of body)."""
    status = resp.status_code
    try:
        body = resp.raw.read(ERROR_BODY_LIMIT) or b""
    except Exception:  # the message is best effort; the status still tells
        body = b""
    finally:
        resp.close()
    msg = secret.redact(_provider_message(body)) or resp.reason or "no message"
    if status in RATE_LIMIT_STATUSES:
        after = parse_retry_after(resp.headers.get("retry-after"))
        return model_error(
            f"{label}: rate limited (HTTP {status}): {msg}", status, True, kind=RATE_LIMIT, retry_after=after
        )
    retryable = status >= 500 or status == 408
    return model_error(f"{label}: HTTP {status}: {msg}", status, retryable, kind=STATUS)


def read_json(resp: requests.Response, scope: CallScope, label: str, limit: int = RESPONSE_BODY_LIMIT) -> Any:
    """Read a whole JSON body (at most ``limit`` bytes), cancellable via ``scope``."""
    chunks: list[bytes] = []
    size = 0
    try:
        while True:
            sock = scope.sock
            if sock is not None and scope.deadline is not None:
                sock.settimeout(max(scope.deadline - time.monotonic(), 0.001))
            chunk = resp.raw.read(READ_SIZE)
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise model_error(f"{label}: response body larger than {limit} bytes", kind=PROTOCOL)
            chunks.append(chunk)
    except ModelError:
        resp.close()
        raise
    except Exception as exc:
        resp.close()
        if scope.closed:
            raise Cancelled("model call closed") from exc
        raise transport_error(label, exc) from exc
    if scope.closed:
        resp.close()
        raise Cancelled("model call closed")
    scope.detach()  # the connection goes back to the pool: never shut it from here on
    try:
        resp.raw.release_conn()
    except Exception:
        resp.close()
    raw = b"".join(chunks)
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise model_error(f"{label}: malformed JSON response: {raw[:200]!r}", kind=PROTOCOL) from exc


__all__ = [
    "CallScope",
    "Secret",
    "TrackingAdapter",
    "current_scope",
    "error_kind",
    "make_session",
    "model_error",
    "parse_retry_after",
    "post",
    "read_json",
    "status_error",
    "transport_error",
]
