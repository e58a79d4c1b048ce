"""The client machinery over ``http.py``: the streamed body and the client base.

``SSEStream`` is the ``ModelStream`` of both HTTP clients: the POST happens
on the first ``next()`` (so the handler's deadline and ``close()`` cover the
wait for headers too), the body is read with ``read1`` (one system call per
read, never waiting to fill a buffer) and decoded as the bytes arrive.
``close()`` works from any thread: it shuts the socket down, and whichever
side is not blocked releases the connection exactly once. A body read to its
end returns its connection to the pool; any other ends it.
``HTTPClientBase`` holds what both clients share.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, Callable, Optional

import attrs
import requests

from loopctl.errors import Cancelled, ConfigError, LoopError, ModelError
from loopctl.messages import ModelRequest, ModelResponse, ToolCallPart
from loopctl.providers.base import StreamEvent, response_events
from loopctl.providers.boundary import (
    PROTOCOL,
    CallInfo,
    Secret,
    model_error,
    raise_mapped,
    url_credentials,
)
from loopctl.providers.http import (
    READ_SIZE,
    CallScope,
    Timeout,
    check_deadline,
    current_scope,
    make_session,
    post,
    read_bound,
    read_json,
    response_status_error,
    split_timeout,
)
from loopctl.providers.reader import StreamParser, StreamReader
from loopctl.providers.secrets import header_secrets
from loopctl.timeouts import required_seconds

log = logging.getLogger("loopctl")


# -- streamed bodies -------------------------------------------------------------


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
        on_json: Optional[Callable[[object], Iterator[StreamEvent]]] = None,
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


class HTTPClientBase:
    """What both HTTP clients share: session, credential, timeouts, the calls.

    Subclasses build the body (``_body``), the headers (``_headers``), the
    URL (``_url``), a stream parser (``_parser``) and a reply from a JSON
    body (``_response_from_json``).
    """

    provider = "http"

    def __init__(
        self,
        model: str,
        api_key: Optional[str],
        base_url: str,
        session: Optional[requests.Session],
        timeout: Timeout,
        extra_headers: Optional[Mapping[str, str]],
    ) -> None:
        if not isinstance(model, str) or not model.strip():
            raise ConfigError(f"model must be a non-empty str, got {model!r}")
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            shown = url_credentials(base_url)[0] if isinstance(base_url, str) else base_url
            raise ConfigError(f"base_url must be an http(s) URL, got {shown!r}")
        if isinstance(timeout, tuple) and len(timeout) == 2:
            timeout = (
                required_seconds(timeout[0], "timeout (connect)"),
                required_seconds(timeout[1], "timeout (read)"),
            )
        elif isinstance(timeout, tuple):
            raise ConfigError(f"timeout must be seconds > 0 or a (connect, read) pair, got {timeout!r:.80}")
        else:
            timeout = required_seconds(timeout, "timeout")
        self._model = model
        self._base_url = base_url.rstrip("/")
        self._shown_url, url_secrets = url_credentials(self._base_url)
        # Every secret the client was given is masked in every error it raises.
        self._secret = Secret(api_key, [*header_secrets(extra_headers or {}), *url_secrets])
        self._owns_session = session is None
        self._session = session if session is not None else make_session()
        self._timeout: Timeout = timeout
        self._extra_headers = dict(extra_headers or {})

    @property
    def model(self) -> str:
        """The model requests go to unless a request overrides it."""
        return self._model

    @property
    def base_url(self) -> str:
        """The base URL requests are sent under."""
        return self._base_url

    def set_model(self, name: str) -> bool:
        """Switch the model for later requests; True (always accepted)."""
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"model must be a non-empty str, got {name!r}")
        self._model = name
        return True

    def close(self) -> None:
        """Close the client's own ``requests.Session`` (not one passed in)."""
        if self._owns_session:
            self._session.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self._model!r}, base_url={self._shown_url!r})"

    # -- subclass hooks
    def _url(self) -> str:
        raise NotImplementedError

    def _headers(self) -> dict[str, str]:
        raise NotImplementedError

    def _body(self, request: ModelRequest, stream: bool) -> dict[str, Any]:
        raise NotImplementedError

    def _parser(self) -> StreamParser:
        raise NotImplementedError

    def _response_from_json(self, data: object) -> ModelResponse:
        raise NotImplementedError

    # -- the calls
    def _apply_options(self, body: dict[str, Any], opts: Any, tool_names: set[str]) -> None:
        """Validate ``RequestOptions`` and write them into ``body`` (never dropped).

        Subclasses say how a tool choice and a response format look on their
        wire (``_native_tool_choice``, ``_native_response_format``).

        Raises:
            ConfigError: an option value this client cannot honour.
        """
        if opts.max_tokens is not None:
            if isinstance(opts.max_tokens, bool) or not isinstance(opts.max_tokens, int) or opts.max_tokens < 1:
                raise ConfigError(f"RequestOptions.max_tokens must be an int >= 1, got {opts.max_tokens!r}")
            body["max_tokens"] = opts.max_tokens
        if opts.temperature is not None:
            if isinstance(opts.temperature, bool) or not isinstance(opts.temperature, (int, float)):
                raise ConfigError(f"RequestOptions.temperature must be a number, got {opts.temperature!r}")
            body["temperature"] = opts.temperature
        choice = opts.tool_choice
        if choice is not None:
            if not isinstance(choice, str) or not choice:
                raise ConfigError(f"RequestOptions.tool_choice must be a non-empty str, got {choice!r}")
            if choice == "required" and not tool_names:
                raise ConfigError("RequestOptions.tool_choice 'required' needs at least one tool")
            if choice not in ("auto", "none", "required") and choice not in tool_names:
                raise ConfigError(
                    f"RequestOptions.tool_choice {choice!r} is neither auto/none/required "
                    "nor the name of a tool in this request"
                )
            body["tool_choice"] = self._native_tool_choice(choice)
        fmt = opts.response_format
        if fmt is not None:
            if not isinstance(fmt, Mapping):
                raise ConfigError(f"RequestOptions.response_format must be a JSON Schema dict, got {fmt!r:.80}")
            key, value = self._native_response_format(fmt)
            body[key] = value
        if opts.extra_body is not None:
            if not isinstance(opts.extra_body, Mapping):
                raise ConfigError(f"RequestOptions.extra_body must be a dict, got {opts.extra_body!r:.80}")
            body.update(opts.extra_body)

    def _native_tool_choice(self, choice: str) -> object:
        """The wire form of a validated tool choice (auto/none/required or a tool name)."""
        raise NotImplementedError

    def _native_response_format(self, fmt: Mapping[str, Any]) -> tuple[str, object]:
        """The body key and wire form of a JSON Schema response format."""
        raise NotImplementedError

    def _label(self, body: Mapping[str, Any]) -> str:
        return f"{self.provider} ({body.get('model', self._model)})"

    # What a client says when a call cannot work as configured.
    key_env = ""
    default_base_url = ""
    stream_hint = ""

    def _call_info(self, body: Mapping[str, Any]) -> CallInfo:
        connect, read = split_timeout(self._timeout)
        return CallInfo(self._label(body), self._shown_url, self._secret, connect, read)

    def _request_headers(self, stream: bool) -> dict[str, str]:
        headers = self._headers()
        headers.update(self._extra_headers)
        if stream:
            headers["accept"] = "text/event-stream"
            headers["accept-encoding"] = "identity"  # no compression holding deltas back
        return headers

    def _post(self, body: dict[str, Any], scope: CallScope, call: CallInfo, stream: bool) -> requests.Response:
        if not self._secret and self.key_env and self._base_url == self.default_base_url:
            raise model_error(
                f"{call.label}: no API key for {self._shown_url}: pass api_key= or set {self.key_env}",
                summary=f"no API key (set {self.key_env})",
            )
        log.debug("POST %s (%s, stream=%s)", self._shown_url, call.label, stream)
        resp = post(self._session, call, self._url(), self._request_headers(stream), body, scope=scope)
        if resp.status_code >= 400:
            raise response_status_error(resp, call.label)
        return resp

    def stream(self, request: ModelRequest) -> SSEStream:
        """The reply as a stream of events (the POST happens on first ``next()``).

        Raises:
            ConfigError: an option this client cannot honour.
        """
        body = self._body(request, True)
        call = self._call_info(body)

        def open_response(scope: CallScope) -> requests.Response:
            return self._post(body, scope, call, True)

        def on_json(data: object) -> Iterator[StreamEvent]:
            return response_events(self._reply_from_json(data, call.label))

        return SSEStream(open_response, self._parser(), call, on_json, self.stream_hint)

    def _reply_from_json(self, data: object, label: str) -> ModelResponse:
        """``_response_from_json`` with JSON of the wrong shape turned into ``ModelError``.

        Like ``feed_checked`` for streams: the parsers index into provider
        JSON freely, and a body of an unexpected shape is a protocol error,
        never a bare ``AttributeError`` or ``KeyError``.
        """
        try:
            return self._redact_calls(self._response_from_json(data))
        except (AttributeError, TypeError, KeyError, IndexError) as exc:
            raise model_error(
                f"{label}: response of an unexpected shape ({type(exc).__name__}: {str(exc)[:120]})", kind=PROTOCOL
            ) from exc

    def _redact_calls(self, response: ModelResponse) -> ModelResponse:
        # The reason of an invalid tool call quotes the model's text: mask this client's secrets in it.
        parts = response.message.parts
        if not any(type(p) is ToolCallPart and p.invalid for p in parts):
            return response
        fixed = tuple(
            attrs.evolve(p, invalid=self._secret.redact(p.invalid)) if type(p) is ToolCallPart and p.invalid else p
            for p in parts
        )
        return attrs.evolve(response, message=attrs.evolve(response.message, parts=fixed))

    def complete(self, request: ModelRequest) -> ModelResponse:
        """The whole reply from one non-streaming call.

        Cancellable: closing the ``CallScope`` bound on this thread (if any)
        makes the call return at once with ``Cancelled``; its deadline bounds
        the call. Every error raised is redacted (no credential in it or its
        causes).

        Raises:
            ConfigError: an option this client cannot honour.
            ModelError: the call failed (``.status`` for HTTP errors).
            Cancelled: the bound scope was closed.
        """
        body = self._body(request, False)
        call = self._call_info(body)
        scope = current_scope() or CallScope()
        try:
            resp = self._post(body, scope, call, False)
            return self._reply_from_json(read_json(resp, scope, call), call.label)
        except LoopError as err:
            self._secret.scrub(err)  # the one redaction point of a whole call
            raise


__all__ = ["HTTPClientBase", "SSEStream", "StreamParser"]
