"""A client's secrets, registered with the one redaction every outlet goes through.

``Secret`` holds every credential a client was given (the key, header
values that may authorise and their credentials after an auth scheme, URL
credentials), registers every form each
shows up in text (as is, stripped, escaped, percent-decoded) with
``loopctl.text.register_secrets`` (so no event, record, log or span of any
run shows them) and masks them itself, plus anything shaped like an API
key. ``scrub`` applies that to an error and its whole cause/context chain
(``loopctl.errors.scrub_error``), and drops what could still hold a secret:
the locals of our frames, the tracebacks of foreign causes. Pure: no IO.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from typing import Optional
from urllib.parse import unquote, urlsplit, urlunsplit

from loopctl.errors import scrub_error
from loopctl.text import MIN_SECRET_CHARS, mask_spans, redact_key_shapes, register_secrets
from loopctl.text import redact as _redact_everywhere


def _forms(value: str) -> set[str]:
    # The ways a value shows up in text: as is, stripped, escaped by repr or
    # JSON, percent-decoded (URL credentials).
    forms = {value, value.strip(), repr(value)[1:-1], json.dumps(value)[1:-1], unquote(value)}
    return {f for f in forms if len(f) >= 4}  # a 1-3 character "secret" would mask half the text


def secret_forms(values: Iterable[Optional[str]]) -> tuple[str, ...]:
    """Every form ``values`` show up in text (empty ones ignored), longest first.

    Longest first, so a secret containing another is masked whole.
    """
    forms: set[str] = set()
    for v in values:
        if v:
            forms |= _forms(str(v))
    return tuple(sorted(forms, key=len, reverse=True))


class Secret:
    """The credentials of one client; never shows them in a repr, str or log line.

    Args:
        value: the API key (sent in a header), or None.
        others: further secrets to mask (custom header values, URL
            credentials); empty ones are ignored.
    """

    __slots__ = ("__weakref__", "_forms", "_value")

    def __init__(self, value: Optional[str], others: Iterable[Optional[str]] = ()) -> None:
        self._value = value or None
        self._forms = secret_forms((value, *others))
        register_secrets(self, self._forms)

    def reveal(self) -> Optional[str]:
        """The credential itself (for the request header only)."""
        return self._value

    def __bool__(self) -> bool:
        return self._value is not None

    def __repr__(self) -> str:
        return "Secret(<redacted>)" if self._value else "Secret(None)"

    __str__ = __repr__

    def redact(self, text: str) -> str:
        """``text`` with every credential of this client (and of every other) and anything key-shaped masked."""
        return _redact_everywhere(mask_spans(text, self._forms))

    def scrub(self, err: BaseException) -> BaseException:
        """Redact ``err`` and its whole cause/context chain in place; returns ``err``.

        A ``LoopError`` keeps its traceback's frames (file, line, function)
        but not their locals, which may hold the headers or text the server
        echoed; a foreign exception keeps its type and redacted text, not its
        traceback (frames of ``requests``/``urllib3`` hold the headers).
        """
        return scrub_error(err, self.redact, strip_foreign=True)


# Header names whose values describe the request, never authorise it.
PLAIN_HEADERS = frozenset(("accept", "accept-encoding", "content-type", "user-agent", "anthropic-version",
                           "anthropic-beta", "openai-beta"))


#: Authorization schemes whose credentials follow the scheme word (lower case).
AUTH_SCHEMES = frozenset(("bearer", "basic", "token", "apikey", "api-key", "key", "oauth", "sso-key"))


def header_secrets(headers: Mapping[str, str]) -> list[str]:
    """The values of ``headers`` that may be credentials (all but the plain ones), with their parts.

    Every such value is a secret whole. One of the form ``<scheme>
    <credentials>`` with a known scheme (``AUTH_SCHEMES``: ``Bearer``,
    ``Basic``, ``Token``, ...) is a secret by its credentials too, and for
    ``Basic`` by the decoded ``user:password`` and its password: a server
    or a model echoing the token alone is masked. Other values are not
    split into words (``X-Title: Assistant Production`` masks that value,
    never the word "Production" everywhere).
    """
    out: list[str] = []
    for k, v in headers.items():
        if str(k).lower() not in PLAIN_HEADERS:
            out += _credential_parts(str(v))
    return out


def _credential_parts(value: str) -> list[str]:
    scheme, _, rest = value.strip().partition(" ")
    rest = rest.strip()
    if scheme.lower() not in AUTH_SCHEMES or not rest:
        return [value]
    parts = [rest]
    if scheme.lower() == "basic":
        try:
            pair = base64.b64decode(rest, validate=True).decode("utf-8")
        except (ValueError, UnicodeDecodeError):  # binascii.Error is a ValueError
            pair = ""
        parts += (pair, pair.partition(":")[2])  # the password; a user name is no secret
    return [value] + [p for p in parts if len(p) >= MIN_SECRET_CHARS]


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


__all__ = ["AUTH_SCHEMES", "PLAIN_HEADERS", "Secret", "header_secrets", "redact_key_shapes", "secret_forms", "url_credentials"]
