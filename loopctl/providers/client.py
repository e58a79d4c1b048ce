"""``HTTPClientBase``: what the OpenAI and Anthropic clients share over ``http.py``.

The model name and base URL, the session and its timeouts, request
options mapped onto the wire body, the POST with its call scope, and both
ways to call: ``stream()`` (an ``SSEStream`` from ``sse_stream``) and
``complete()``. Credentials are registered as secrets so no error or log
line can carry them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any, Optional

import attrs
import requests

from loopctl.checks import integer, number, shown
from loopctl.errors import ConfigError, LoopError
from loopctl.messages import ModelRequest, ModelResponse, ToolCallPart
from loopctl.providers.base import StreamEvent, response_events
from loopctl.providers.boundary import (
    PROTOCOL,
    CallInfo,
    Secret,
    model_error,
    url_credentials,
)
from loopctl.providers.http import (
    WIRE_INT_MAX,
    CallScope,
    Timeout,
    current_scope,
    make_session,
    post,
    read_json,
    response_status_error,
    split_timeout,
)
from loopctl.providers.reader import StreamParser
from loopctl.providers.secrets import header_secrets
from loopctl.providers.sse_stream import SSEStream
from loopctl.text import masked_head
from loopctl.timeouts import required_seconds

log = logging.getLogger("loopctl")


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
            raise ConfigError(f"model must be a non-empty str, got {shown(model)}")
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            url = url_credentials(base_url)[0] if isinstance(base_url, str) else base_url
            raise ConfigError(f"base_url must be an http(s) URL, got {shown(url)}")
        field = f"{type(self).__name__}.timeout"
        if isinstance(timeout, tuple) and len(timeout) == 2:
            timeout = (
                required_seconds(timeout[0], f"{field} (connect)"),
                required_seconds(timeout[1], f"{field} (read)"),
            )
        elif isinstance(timeout, tuple):
            raise ConfigError(f"{field} must be seconds > 0 or a (connect, read) pair, got {shown(timeout)}")
        else:
            timeout = required_seconds(timeout, field)
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
            raise ConfigError(f"model must be a non-empty str, got {shown(name)}")
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
            body["max_tokens"] = integer(opts.max_tokens, "RequestOptions.max_tokens", 1, WIRE_INT_MAX)
        if opts.temperature is not None:
            # Finite: the body's JSON would carry NaN or an infinity as null, an option dropped.
            body["temperature"] = number(opts.temperature, "RequestOptions.temperature")
        choice = opts.tool_choice
        if choice is not None:
            if not isinstance(choice, str) or not choice:
                raise ConfigError(f"RequestOptions.tool_choice must be a non-empty str, got {shown(choice)}")
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
                raise ConfigError(f"RequestOptions.response_format must be a JSON Schema dict, got {shown(fmt)}")
            key, value = self._native_response_format(fmt)
            body[key] = value
        if opts.extra_body is not None:
            if not isinstance(opts.extra_body, Mapping):
                raise ConfigError(f"RequestOptions.extra_body must be a dict, got {shown(opts.extra_body)}")
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
            headers["accept"] = "text/event-stream"  # (every call asks for an unencoded body: http.post)
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
                f"{label}: response of an unexpected shape ({type(exc).__name__}: {masked_head(str(exc), 120)})", kind=PROTOCOL
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
