"""The wire's one error boundary: foreign exceptions in, tagged ``LoopError`` out.

Owns what every HTTP client path goes through: the redaction of each error
a client raises (``raise_mapped`` scrubs with the client's ``Secret``, see
``secrets.py``); ``map_exception``, the one place
``requests``/``urllib3``/socket exceptions become errors that say what
happened (refused, DNS, timeout, TLS, reset) and where. ``status_error``:
an HTTP error status, its body's message, ``Retry-After``, and the
"context too long" rejections classified as ``ContextOverflow``.
``foreign_error``: what an exception a client (any client, not only ours)
let escape becomes.

Errors leave tagged: ``kind`` ("status", "rate_limit", "timeout",
"transport", "protocol"), ``retry_after`` (seconds or None) and ``summary``
(a short cause a person reads, e.g. "rate limited (429)").
"""

from __future__ import annotations

import email.utils
import json
import math
import re
import socket
import ssl
import time
from collections.abc import Mapping
from typing import Any, NoReturn, Optional
from urllib.parse import urlsplit

import requests
import urllib3

from loopctl.errors import ConfigError, ContextOverflow, LoopError, ModelError
from loopctl.providers.secrets import Secret, redact_key_shapes, url_credentials
from loopctl.text import MAX_JSON_DEPTH, json_depth_exceeds, masked_head

ERROR_BODY_LIMIT = 8 * 1024
RATE_LIMIT_STATUSES = frozenset((429, 503, 529))

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
    summary: Optional[str] = None,
) -> ModelError:
    """A ``ModelError`` tagged with ``kind``, ``retry_after`` and a short ``summary``."""
    err = ModelError(message, status, retryable)
    return tag(err, kind, retry_after, summary)


def tag(
    err: ModelError, kind: str, retry_after: Optional[float] = None, summary: Optional[str] = None
) -> ModelError:
    """Set the tags of ``err`` (mutates; returns it)."""
    err.__dict__.update(kind=kind, retry_after=retry_after, summary=summary)
    return err


def error_kind(err: BaseException) -> Optional[str]:
    """The ``kind`` tag of an error from this layer (None for other errors)."""
    return getattr(err, "kind", None)


def error_summary(err: BaseException) -> str:
    """A short cause for ``err`` (its ``summary`` tag, else its first line)."""
    summary = getattr(err, "summary", None)
    if summary:
        return str(summary)
    text = str(err).split("\n", 1)[0]
    return masked_head(text, 200) or type(err).__name__


# -- the mapping of foreign exceptions -------------------------------------------


class CallInfo:
    """What the boundary needs to say what happened: where, with which limits.

    ``url`` is shown in messages, so it carries no credentials.
    """

    __slots__ = ("connect_timeout", "label", "read_timeout", "secret", "url")

    def __init__(
        self, label: str, url: str, secret: Secret, connect_timeout: Optional[float], read_timeout: Optional[float]
    ) -> None:
        self.label = label
        self.url = url
        self.secret = secret
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout

    def __repr__(self) -> str:
        return f"CallInfo({self.label!r}, {self.url!r})"


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    seen: set[int] = set()
    todo: list[Any] = [exc]
    while todo:
        e = todo.pop(0)
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        out.append(e)
        todo += [e.__cause__, e.__context__, getattr(e, "reason", None), *e.args]
    return out


def _has(chain: list[BaseException], *types: type[BaseException]) -> bool:
    return any(isinstance(e, types) for e in chain)


def _host(url: str) -> str:
    return urlsplit(url).hostname or url


def _config_error(chain: list[BaseException], call: CallInfo) -> Optional[ConfigError]:
    """A request the settings made unsendable (a bad header value or URL); retrying cannot help."""
    if _has(chain, requests.exceptions.InvalidHeader) or any(
        # Older requests lets http.client's own check raise: "Invalid header value b'...'".
        type(e) is ValueError and str(e).startswith(("Invalid header value", "Invalid header name"))
        for e in chain
    ):
        return ConfigError(
            f"{call.label}: a request header has an invalid value (a line break or leading/trailing "
            "whitespace, e.g. in the API key or extra_headers)"
        )
    if _has(chain, requests.exceptions.InvalidURL, requests.exceptions.MissingSchema,
            requests.exceptions.InvalidSchema):
        return ConfigError(f"{call.label}: invalid request URL {call.url!r}")
    return None


def map_exception(exc: BaseException, call: CallInfo, *, deadline_hit: bool = False) -> LoopError:
    """The ``LoopError`` for a foreign exception raised by a call (the one mapping).

    ``deadline_hit``: a read timed out because the caller's deadline (not
    the client's read timeout) was the nearer bound.
    """
    if isinstance(exc, LoopError):
        return exc
    label, url = call.label, call.url
    chain = _chain(exc)
    refused = _config_error(chain, call)
    if refused is not None:
        return refused
    if _has(chain, requests.exceptions.SSLError, ssl.SSLError, urllib3.exceptions.SSLError):
        reason = next((str(e) for e in chain if isinstance(e, ssl.SSLError)), "handshake failed")
        short = f"TLS error with {url}"
        return model_error(f"{label}: {short}: {masked_head(reason, 200)}", retryable=False, kind=TRANSPORT, summary=short)
    # Refused, DNS and reset first: urllib3's NewConnectionError is also a ConnectTimeoutError.
    if _has(chain, ConnectionRefusedError):
        short = f"connection refused at {url}"
        return model_error(f"{label}: {short}", retryable=True, kind=TRANSPORT, summary=short)
    if _has(chain, socket.gaierror, urllib3.exceptions.NameResolutionError):
        short = f"DNS lookup failed for {_host(url)}"
        return model_error(f"{label}: {short} ({url})", retryable=True, kind=TRANSPORT, summary=short)
    if _has(chain, ConnectionResetError, BrokenPipeError, ConnectionAbortedError):
        short = f"connection reset by {url}"
        return model_error(f"{label}: {short}", retryable=True, kind=TRANSPORT, summary=short)
    if _has(chain, requests.exceptions.ConnectTimeout) or any(
        isinstance(e, urllib3.exceptions.ConnectTimeoutError)
        and not isinstance(e, urllib3.exceptions.NewConnectionError)
        for e in chain
    ):
        t = call.connect_timeout
        short = f"connect to {url} timed out" + (f" after {t:g}s (the connect timeout)" if t is not None else "")
        return model_error(f"{label}: {short}", retryable=True, kind=TIMEOUT, summary=short)
    if _has(chain, requests.Timeout, urllib3.exceptions.TimeoutError, socket.timeout, TimeoutError) or (
        "timed out" in str(exc)
    ):
        t = call.read_timeout
        if deadline_hit:
            short = "the call's deadline passed"
        elif t is not None:
            short = f"no data from {url} within the read timeout of {t:g}s"
        else:
            short = f"read from {url} timed out"
        err = model_error(f"{label}: timed out: {short}", retryable=True, kind=TIMEOUT, summary=short)
        err.__dict__["deadline_hit"] = deadline_hit
        return err
    if _has(chain, requests.exceptions.ChunkedEncodingError, urllib3.exceptions.ProtocolError,
            urllib3.exceptions.IncompleteRead):
        short = f"connection to {url} dropped mid-response"
    else:
        short = f"connection to {url} failed ({type(exc).__name__})"
    return model_error(f"{label}: {short}", retryable=True, kind=TRANSPORT, summary=short)


def foreign_error(exc: BaseException) -> ModelError:
    """A ``ModelError`` for an exception a model client let escape untranslated.

    A transport-shaped one (``OSError``, ``requests``/``urllib3``) is a
    retryable transport failure named by its type only (its text may quote
    headers); anything else keeps its text, as a non-retryable failure.
    """
    if isinstance(exc, (OSError, ConnectionError, TimeoutError)) or type(exc).__module__.startswith(
        ("requests", "urllib3")
    ):
        kind = TIMEOUT if isinstance(exc, TimeoutError) else TRANSPORT
        return model_error(f"model call failed: {type(exc).__name__}", retryable=True, kind=kind)
    return ModelError(f"model call failed: {type(exc).__name__}: {exc}")


def raise_mapped(exc: BaseException, call: CallInfo, *, deadline_hit: bool = False) -> NoReturn:
    """Raise ``map_exception(exc)``, redacted, chained to a scrubbed ``exc``.

    A header-building failure (``ConfigError``) is raised without its cause:
    the cause quotes the header value.
    """
    err = map_exception(exc, call, deadline_hit=deadline_hit)
    if err is exc:
        raise call.secret.scrub(err)
    call.secret.scrub(exc)
    if isinstance(err, ConfigError):
        call.secret.scrub(err)
        raise err from None
    call.secret.scrub(err)
    raise err from exc


# -- JSON from the wire ------------------------------------------------------------


def parse_json(text: str, label: str, what: str) -> object:
    """Parse one JSON document from the wire.

    Raises:
        ModelError: (kind "protocol") the text is not one JSON document, or
            it nests deeper than the interpreter can parse.
    """
    try:
        return json.loads(text)
    except RecursionError:
        raise model_error(f"{label}: {what} is JSON nested too deeply to parse", kind=PROTOCOL) from None
    except ValueError as exc:
        raise model_error(f"{label}: malformed JSON in {what}: {masked_head(text, 200)!r}", kind=PROTOCOL) from exc


#: What ``parsed_value_problem`` finds.
TOO_DEEP = "too deep"
NOT_FINITE = "not finite"


def parsed_value_problem(value: object, limit: int = MAX_JSON_DEPTH) -> Optional[str]:
    """What keeps an already parsed value from being JSON (one walk, no recursion); None when fit.

    ``TOO_DEEP``: lists and dicts (any mapping or sequence: a client may hand over tuples
    or views) nested deeper than ``limit``; ``NOT_FINITE``: a NaN or an
    infinite float anywhere (a body parsed leniently upstream: NaN is still
    not JSON). Whichever the walk meets first.
    """
    todo: list[tuple[object, int]] = [(value, 0)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return NOT_FINITE
        elif isinstance(item, (Mapping, list, tuple)):
            if depth + 1 > limit:
                return TOO_DEEP
            children = item.values() if isinstance(item, Mapping) else item
            todo.extend((child, depth + 1) for child in children)
    return None


# -- HTTP statuses -------------------------------------------------------------------


def parse_retry_after(value: Optional[str], now: Optional[float] = None) -> Optional[float]:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if seconds == seconds else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    base = time.time() if now is None else now
    return max(0.0, when.timestamp() - base)


def provider_message(body: bytes) -> str:
    """The human message of an error body (JSON ``error.message`` or the text)."""
    text = body.decode("utf-8", "replace")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return masked_head(text.strip(), 500)
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("type")
            if msg:
                return masked_head(str(msg), 1000)
        elif isinstance(err, str):
            return masked_head(err, 1000)
        if isinstance(data.get("message"), str):
            return masked_head(str(data["message"]), 1000)
    return masked_head(text.strip(), 500)


_OVERFLOW = re.compile(
    r"context_length_exceeded|maximum context length|prompt is too long|too many tokens|context window"
    r"|context length|exceeds the context",
    re.IGNORECASE,
)


def is_context_overflow(status: Optional[int], text: str) -> bool:
    """True for a provider's "the request is too long for the context window" rejection."""
    return status in (None, 400, 413) and _OVERFLOW.search(text) is not None


def overflow_error(message: str, status: Optional[int]) -> ContextOverflow:
    """A ``ContextOverflow`` tagged like the boundary's other errors."""
    err = ContextOverflow(message, status)
    tag(err, STATUS, None, "context too long for the model")
    return err


def status_error(status: int, reason: str, body: bytes, retry_after: Optional[str], label: str) -> ModelError:
    """The ``ModelError`` for a non-2xx response (``body``: at most 8 KiB of it)."""
    raw = body.decode("utf-8", "replace")
    msg = provider_message(body) or reason or "no message"
    if status in (400, 413) and is_context_overflow(status, raw):
        return overflow_error(f"{label}: context too long (HTTP {status}): {msg}", status)
    if status in RATE_LIMIT_STATUSES:
        after = parse_retry_after(retry_after)
        summary = f"rate limited ({status})" if status == 429 else f"server error ({status})"
        return model_error(
            f"{label}: rate limited (HTTP {status}): {msg}", status, True,
            kind=RATE_LIMIT, retry_after=after, summary=summary,
        )
    retryable = status >= 500 or status == 408
    summary = f"server error ({status})" if status >= 500 else f"HTTP {status}"
    return model_error(f"{label}: HTTP {status}: {msg}", status, retryable, kind=STATUS, summary=summary)


__all__ = [
    "MAX_JSON_DEPTH",
    "NOT_FINITE",
    "PROTOCOL",
    "RATE_LIMIT",
    "STATUS",
    "TIMEOUT",
    "TOO_DEEP",
    "TRANSPORT",
    "CallInfo",
    "Secret",
    "error_kind",
    "error_summary",
    "foreign_error",
    "is_context_overflow",
    "json_depth_exceeds",
    "map_exception",
    "model_error",
    "overflow_error",
    "parse_json",
    "parsed_value_problem",
    "parse_retry_after",
    "raise_mapped",
    "redact_key_shapes",
    "status_error",
    "tag",
    "url_credentials",
]
