"""A client's secrets and the one redaction every error it raises goes through.

``Secret`` holds every credential a client was given (the key, header
values that may authorise, URL credentials) and masks each of them, in
every form it shows up in text (as is, stripped, escaped, percent-decoded),
plus anything shaped like an API key. ``scrub`` applies that to an error and
its whole cause/context chain, and drops what could still hold a secret:
the locals of our frames, the tracebacks of foreign causes. Pure: no IO.
"""

from __future__ import annotations

import json
import re
import traceback
from collections.abc import Iterable, Mapping
from typing import Optional
from urllib.parse import unquote, urlsplit, urlunsplit

from loopctl.errors import LoopError

_KEY_SHAPES = re.compile(r"\b(sk-[A-Za-z0-9_\-*]{6,}|key-[A-Za-z0-9_\-*]{12,})")
_REDACTED = "<redacted>"


def redact_key_shapes(text: str) -> str:
    """``text`` with anything shaped like an API key masked."""
    return _KEY_SHAPES.sub(_REDACTED, text)


def _forms(value: str) -> set[str]:
    # The ways a value shows up in text: as is, stripped, escaped by repr or
    # JSON, percent-decoded (URL credentials).
    forms = {value, value.strip(), repr(value)[1:-1], json.dumps(value)[1:-1], unquote(value)}
    return {f for f in forms if len(f) >= 4}  # a 1-3 character "secret" would mask half the text


class Secret:
    """The credentials of one client; never shows them in a repr, str or log line.

    Args:
        value: the API key (sent in a header), or None.
        others: further secrets to mask (custom header values, URL
            credentials); empty ones are ignored.
    """

    __slots__ = ("_forms", "_value")

    def __init__(self, value: Optional[str], others: Iterable[Optional[str]] = ()) -> None:
        self._value = value or None
        forms: set[str] = set()
        for v in (value, *others):
            if v:
                forms |= _forms(str(v))
        # Longest first, so a secret containing another is masked whole.
        self._forms = tuple(sorted(forms, key=len, reverse=True))

    def reveal(self) -> Optional[str]:
        """The credential itself (for the request header only)."""
        return self._value

    def __bool__(self) -> bool:
        return self._value is not None

    def __repr__(self) -> str:
        return "Secret(<redacted>)" if self._value else "Secret(None)"

    __str__ = __repr__

    def redact(self, text: str) -> str:
        """``text`` with every credential of this client and anything key-shaped masked."""
        for form in self._forms:
            if form in text:
                text = text.replace(form, _REDACTED)
        return redact_key_shapes(text)

    def scrub(self, err: BaseException) -> BaseException:
        """Redact ``err`` and its whole cause/context chain in place; returns ``err``.

        A ``LoopError`` keeps its traceback's frames (file, line, function)
        but not their locals, which may hold the headers or text the server
        echoed; a foreign exception keeps its type and redacted text, not its
        traceback (frames of ``requests``/``urllib3`` hold the headers).
        """
        seen: set[int] = set()
        todo: list[Optional[BaseException]] = [err]
        while todo:
            exc = todo.pop()
            if exc is None or id(exc) in seen:
                continue
            seen.add(id(exc))
            if isinstance(exc, LoopError):
                exc.message = self.redact(exc.message)
                exc.args = (exc.message,)
                if exc.__traceback__ is not None:
                    traceback.clear_frames(exc.__traceback__)  # frames still running are kept
            else:
                try:
                    text = self.redact(str(exc))
                except Exception:
                    text = type(exc).__name__
                try:
                    exc.args = (text,)
                except Exception:
                    pass
                exc.__traceback__ = None
            todo += (exc.__cause__, exc.__context__)
        return err


# Header names whose values describe the request, never authorise it.
PLAIN_HEADERS = frozenset(("accept", "accept-encoding", "content-type", "user-agent", "anthropic-version",
                           "anthropic-beta", "openai-beta"))


def header_secrets(headers: Mapping[str, str]) -> list[str]:
    """The values of ``headers`` that may be credentials (all but the plain ones)."""
    return [str(v) for k, v in headers.items() if str(k).lower() not in PLAIN_HEADERS]


def url_credentials(url: str) -> tuple[str, list[str]]:
    """``url`` without its ``user:password@`` part, and the credentials removed."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, []
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    clean = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    # A short user name ("user", "admin") is not a secret and would mask ordinary words.
    user = parts.username if parts.username and len(parts.username) >= 8 else None
    return clean, [s for s in (parts.password, user) if s]


__all__ = ["PLAIN_HEADERS", "Secret", "header_secrets", "redact_key_shapes", "url_credentials"]
