"""Text that crosses a trust boundary, made safe in one place (a leaf).

``clean_text``, ``json_depth_exceeds``, ``json_safe`` and ``loads_strict``
(lone surrogates, JSON nesting, non-finite numbers) live in
``loopctl.jsontext``, the one leaf this one imports, and are re-exported
here.

``redact`` is the one mask every outlet's text goes through (errors, events,
serialized records, logs, spans, CLI output): it hides every credential a
client of this process was given (registered with ``register_secrets``) and
anything shaped like a key (``sk-...``, ``sk-ant-...``, ``key-...``, a bearer
token), whoever produced the text (the model, a tool, a server).
``excerpt`` bounds how much untrusted text a message or an event quotes,
and ``quote`` and ``masked_head`` do it masking before cutting (a key the
cut would split is masked whole, never half shown; ``whole_cut`` cuts
content left unmasked before such a key).
"""

from __future__ import annotations

import itertools
import logging
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import attrs

from loopctl.jsontext import (
    MAX_JSON_DEPTH,
    NotJSONNumber,
    clean_text,
    json_depth_exceeds,
    json_safe,
    loads_strict,
)

#: The most untrusted text an error message or an event's error field quotes.
EXCERPT_LIMIT = 2048

REDACTED = "<redacted>"

# Key shapes: OpenAI/Anthropic-style keys (``sk-``, ``sk-ant-``, ``pk-``, ``rk-``),
# ``key-`` keys with a digit (never a name like "key-value-store-lookup"), and
# an Authorization header's bearer token. Case-sensitive prefixes at a word
# start keep ordinary words ("risk-free", "task-list") out.
_KEY_SHAPES = re.compile(
    r"\b(?:[spr]k-[A-Za-z0-9_\-*]{6,}"
    r"|key-(?=[A-Za-z_\-*]*[0-9])[A-Za-z0-9_\-*]{12,})"
    r"|\b[Bb]earer\s+[A-Za-z0-9._~+/\-=]{8,}"
)


def _has_key_mark(text: str) -> bool:
    # Every key shape contains one of these three: a text with none of them
    # has no key shape, and three substring scans cost a tenth of the
    # pattern's (it tries a word start at every character: about 6 us for
    # 180 characters). Keep them in step with _KEY_SHAPES.
    return "k-" in text or "key-" in text or "earer" in text


#: A registered credential shorter than this is never masked process-wide
#: (a short "secret" would mask ordinary words in every run's text).
MIN_SECRET_CHARS = 8

_secrets_lock = threading.Lock()
_secrets_by_owner: dict[int, tuple[str, ...]] = {}
_secret_forms: tuple[str, ...] = ()  # longest first: a secret containing another is masked whole
_registrations = itertools.count()  # keys, never reused (an owner's id() is, once it is gone)
# Registrations whose owner was collected. A finalizer only appends here: the
# collector may run it inside any allocation, on a thread that already holds
# _secrets_lock (mid-rebuild), where waiting for the lock would hang forever.
_gone: list[int] = []


def _rebuild_locked() -> None:
    """Drop the collected owners' forms and rebuild ``_secret_forms`` (under ``_secrets_lock``)."""
    global _secret_forms
    while True:
        while _gone:
            _secrets_by_owner.pop(_gone.pop(), None)
        forms = {f for group in _secrets_by_owner.values() for f in group}
        _secret_forms = tuple(sorted(forms, key=len, reverse=True))
        if not _gone:  # a collection during the rebuild may have let more go
            return


def _forget(key: int) -> None:
    _gone.append(key)
    # Settle now unless the lock is held (by another thread, or by this one
    # when a collection runs this mid-rebuild); its holder, or the next
    # registration, settles it then. Until then the forms stay masked: more
    # masking, never less.
    if _secrets_lock.acquire(blocking=False):
        try:
            _rebuild_locked()
        finally:
            _secrets_lock.release()


def register_secrets(owner: object, forms: Iterable[str]) -> None:
    """Mask ``forms`` in every outlet's text for as long as ``owner`` lives.

    Args:
        owner: the object holding the credentials (weakly referenced).
        forms: the ways the credentials show up in text; those shorter than
            ``MIN_SECRET_CHARS`` are ignored.
    """
    kept = tuple(f for f in forms if len(f) >= MIN_SECRET_CHARS)
    if not kept:
        return
    key = next(_registrations)
    with _secrets_lock:
        _secrets_by_owner[key] = kept
        _rebuild_locked()
    weakref.finalize(owner, _forget, key)


def redact(text: str) -> str:
    """``text`` with every registered credential and anything key-shaped masked."""
    if not text:
        return text
    return mask_spans(text, _secret_forms)


def mask_spans(text: str, forms: Iterable[str]) -> str:
    """``text`` with every occurrence of ``forms`` and every key shape masked (``text`` itself if none).

    All are found in the text as given, then masked together: a registered
    key that starts a longer key-shaped token, or a key-shaped part inside
    a registered credential, is masked whole, never leaving a tail or a
    head of the other behind (as masking one kind after the other would).
    """
    spans = _spans(text, forms)
    if not spans:
        return text
    out: list[str] = []
    kept_to = 0  # text before this index is written out or masked
    for start, end in spans:
        if end <= kept_to:
            continue  # inside a span already masked
        if start > kept_to or not out:  # else it overlaps or touches the last mask, which grows
            out += (text[kept_to:start], REDACTED)
        kept_to = end
    out.append(text[kept_to:])
    return "".join(out)


def _spans(text: str, forms: Iterable[str]) -> list[tuple[int, int]]:
    """Where ``forms`` and the key shapes occur in ``text``, sorted."""
    spans = [m.span() for m in _KEY_SHAPES.finditer(text)] if _has_key_mark(text) else []
    for form in forms:
        at = text.find(form)
        while at >= 0:  # one after another, as str.replace finds them: linear in the text
            spans.append((at, at + len(form)))
            at = text.find(form, at + len(form))
    spans.sort()
    return spans


def _mask_window(limit: int) -> int:
    """How much of a text to mask (or search) to cut it at ``limit``: a key crossing the cut is seen whole."""
    forms = _secret_forms
    return limit + max(256, len(forms[0]) if forms else 0)


def whole_cut(text: str, limit: int) -> int:
    """Where to cut ``text`` to keep at most ``limit`` characters without splitting a key.

    ``limit``, or the start of a registered credential or key shape that a
    cut there would split (the head kept unmasked then holds none of it).
    """
    if len(text) <= limit:
        return len(text)
    forms = _secret_forms
    for start, end in reversed(_spans(text[: _mask_window(limit)], forms)):
        if start < limit < end:
            limit = start
    return limit


def redact_key_shapes(text: str) -> str:
    """``text`` with anything shaped like an API key or a bearer token masked."""
    return _KEY_SHAPES.sub(REDACTED, text) if _has_key_mark(text) else text


def excerpt(text: str, limit: int = EXCERPT_LIMIT) -> str:
    """At most ``limit`` characters of ``text``, saying how many were left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def quote(text: str, limit: int = EXCERPT_LIMIT) -> str:
    """Untrusted ``text`` as an outlet may quote it: masked, at most ``limit`` characters."""
    if len(text) <= limit:
        return redact(text)
    return f"{masked_head(text, limit)}... ({len(text) - limit} more characters)"


def masked_head(text: str, limit: int, mask: Callable[[str], str] = redact) -> str:
    """The first ``limit`` characters of untrusted ``text``, masked before they are cut.

    A key the cut would split is masked whole, never leaving its head
    behind: a little more than is kept is masked (bounded work on a
    megabyte; at least the longest registered credential). A mask at the
    cut is kept whole ("<reda" would look like text), so the head may run
    past ``limit`` by less than ``len(REDACTED)``.

    Args:
        mask: the masking (``redact``; an outlet may add its own shapes).
    """
    if len(text) <= limit:
        return mask(text)
    head = mask(text[: _mask_window(limit)])
    marker = head.find(REDACTED, max(0, limit - len(REDACTED) + 1), limit + len(REDACTED) - 1)
    return head[: marker + len(REDACTED) if 0 <= marker < limit else limit]


# The end of a text that a key may still be growing from: the trailing run of
# key/token characters, with a "Bearer " before it.
_OPEN_TAIL = re.compile(r"(?:\b[Bb]earer\s+)?[A-Za-z0-9_.~+/=*\-]*\Z")
#: How key shapes begin (lower case): a tail that is, or starts with, one of these is held.
_KEY_LEADS = ("sk-", "pk-", "rk-", "key-", "bearer")
#: The most a ``StreamMask`` holds back; a longer held token is masked whole.
MAX_HELD_CHARS = 256
_TOKEN_RUN = re.compile(r"[A-Za-z0-9_.~+/=*\-]*")


class StreamMask:
    """Masks a text that arrives in pieces (a streamed reply, tool arguments).

    A key split across pieces (``"sk-SE"``, ``"CRET-123"``) is masked whole:
    each ``feed`` releases the masked text up to the last place a key could
    still begin, and holds back the rest until the next piece or ``flush``.
    A held token that grows past ``MAX_HELD_CHARS`` (a long bearer token or
    credential) is masked as a whole and so is the rest of that token, up to
    the first character no token has. The pieces released, joined, are the
    whole text masked. Not thread-safe: one stream, one reader.
    """

    __slots__ = ("_held", "_inside")

    def __init__(self) -> None:
        self._held = ""
        self._inside = False  # within a too-long token already masked: swallow its rest

    def feed(self, piece: str) -> str:
        """The masked text this piece lets go of (maybe empty)."""
        if self._inside:
            run = _TOKEN_RUN.match(piece)
            end = run.end() if run is not None else 0
            if end == len(piece):
                return ""
            self._inside = False
            piece = piece[end:]
        text = self._held + piece if self._held else piece
        cut = _open_tail_start(text)
        if len(text) - cut > MAX_HELD_CHARS:  # no key is this long unless it is one: mask it all
            self._held, self._inside = "", True
            return redact(text[:cut]) + REDACTED
        self._held = text[cut:]
        if not cut:
            return ""
        out = redact(text[:cut])
        if not self._held and out.endswith(REDACTED) and _TOKEN_RUN.fullmatch(text[-1]):
            self._inside = True  # a masked token reaches the piece's end: what continues it is masked too
        return out

    def flush(self) -> str:
        """What is still held, masked; the mask is empty again."""
        held, self._held, self._inside = self._held, "", False
        return redact(held) if held else ""


def _open_tail_start(text: str) -> int:
    """Where the part of ``text`` that could still be the start of a secret begins.

    Only a tail that could still grow into a key shape (``sk-``, ``key-``,
    ``Bearer ...``) or into a registered credential is held: ordinary words
    go out at once, so a reply paused mid-sentence shows its last word.
    """
    cut = len(text)
    match = _OPEN_TAIL.search(text, max(0, len(text) - MAX_HELD_CHARS))
    if match is not None and match.start() < len(text):
        cut = _key_lead_start(text, match.start())
    last = text[-1:]
    for form in _secret_forms:  # a registered secret's beginning at the text's end
        # Only where the form holds the text's last character can the text end inside it.
        at = form.find(last, 0, len(form) - 1)
        while at >= 0:
            if at + 1 <= len(text) and text.endswith(form[: at + 1]):
                cut = min(cut, len(text) - at - 1)
            at = form.find(last, at + 1, len(form) - 1)
    moved = bool(_secret_forms)
    while moved:  # a whole one the cut would split (its end held, its start released): hold it all
        moved = False
        for form in _secret_forms:
            at = text.find(form, max(0, cut - len(form) + 1))
            if 0 <= at < cut < at + len(form):
                cut, moved = at, True
    return cut


def _key_lead_start(text: str, start: int) -> int:
    """The first word start at or after ``start`` from which a key shape may still grow (else the end)."""
    seg = text[start:]
    if seg[:6].lower() == "bearer" and len(seg) > 6 and seg[6].isspace():
        return start  # "Bearer " and maybe the token's first characters
    for i in range(len(seg)):
        if i and (seg[i - 1].isalnum() or seg[i - 1] == "_"):
            continue  # a key shape starts a word
        tail = seg[i:].lower()
        for lead in _KEY_LEADS:
            if lead.startswith(tail) or tail.startswith(lead):
                return start + i
    return len(text)


def redact_value(value: object) -> Any:
    """``value`` with every string in it (nested in mappings, lists, tuples) masked.

    Returns ``value`` itself when nothing needed masking.
    """
    if type(value) is str:  # a str subclass (an enum's value) is ours, never untrusted
        return redact(value)
    if isinstance(value, _PLAIN):  # before the Mapping ABC check, which is slow
        return value
    if isinstance(value, Mapping):
        items = [(_masked_key(k), redact_value(v)) for k, v in value.items()]
        if all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(items, value.items())):
            return value
        masked: dict[Any, Any] = {}
        for k, v in items:
            while k in masked:  # two keys masked alike: both kept, the later one marked
                k = f"{k}'"
            masked[k] = v
        return masked
    if isinstance(value, (list, tuple)):
        out = [redact_value(v) for v in value]
        if all(a is b for a, b in zip(out, value)):
            return value
        return tuple(out) if isinstance(value, tuple) else out
    return value


def _masked_key(key: object) -> object:
    """A mapping's key as an outlet shows it: model-made keys are text like any other."""
    return redact(key) if type(key) is str else key


_PLAIN = (bool, int, float, type(None))
_TEXT_FIELDS: dict[tuple[type, frozenset[str], frozenset[str]], tuple[tuple[str, bool], ...]] = {}

T = TypeVar("T")


def redact_fields(obj: T, quoted: frozenset[str] = frozenset(), skip: frozenset[str] = frozenset()) -> T:
    """A frozen attrs ``obj`` with every text in its fields masked (``obj`` itself if none changed).

    Args:
        quoted: fields that quote untrusted text: also cut to an excerpt
            (a tuple of texts: each one).
        skip: fields left alone (ids the library made).
    """
    cls: Any = type(obj)
    spec = _TEXT_FIELDS.get((cls, quoted, skip))
    if spec is None:
        spec = tuple((f.name, f.name in quoted) for f in attrs.fields(cls) if f.name not in skip)
        _TEXT_FIELDS[(cls, quoted, skip)] = spec
    changes: dict[str, Any] = {}
    for name, is_quote in spec:
        value = getattr(obj, name)
        if isinstance(value, _PLAIN):
            continue
        new = _masked(value, is_quote)
        if new is not value:
            changes[name] = new
    return attrs.evolve(obj, **changes) if changes else obj  # type: ignore[misc]


def _masked(value: object, quoted: bool) -> object:
    if type(value) is str:  # an enum's text (a str subclass) is ours, never untrusted
        return quote(value) if quoted else redact(value)
    if quoted and isinstance(value, tuple):
        out = tuple(_masked(v, True) for v in value)
        return value if all(a is b for a, b in zip(out, value)) else out
    return redact_value(value)


class RedactingFilter(logging.Filter):
    """A log filter that masks what ``redact`` masks in each record's text and traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format: leave it to the handler to report
            return True
        masked = redact(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True


def install_log_filter(logger: logging.Logger) -> logging.Logger:
    """Add the ``RedactingFilter`` to ``logger`` once; returns it."""
    if not any(isinstance(f, RedactingFilter) for f in logger.filters):
        logger.addFilter(RedactingFilter())
    return logger


install_log_filter(logging.getLogger("loopctl"))


__all__ = [
    "EXCERPT_LIMIT",
    "MAX_HELD_CHARS",
    "MAX_JSON_DEPTH",
    "MIN_SECRET_CHARS",
    "NotJSONNumber",
    "REDACTED",
    "RedactingFilter",
    "StreamMask",
    "clean_text",
    "excerpt",
    "install_log_filter",
    "json_depth_exceeds",
    "json_safe",
    "loads_strict",
    "masked_head",
    "quote",
    "redact",
    "redact_fields",
    "mask_spans",
    "redact_key_shapes",
    "redact_value",
    "register_secrets",
    "whole_cut",
]
