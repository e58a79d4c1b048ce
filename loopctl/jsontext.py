"""JSON and Unicode hygiene for untrusted text (a leaf: it imports nothing of loopctl).

``clean_text`` replaces lone surrogates (a str holding one cannot be encoded
as UTF-8, so one such character from a tool or a model would fail every
request or store that carries it); ``json_depth_exceeds`` tells, without
parsing, whether JSON text nests deeper than a limit (``json`` would raise
``RecursionError`` long after the damage is done); ``json_safe`` makes a
value JSON that ``allow_nan=False`` accepts (a non-finite float becomes
null, as JavaScript's ``JSON.stringify`` does); ``loads_strict`` reads JSON
as RFC 8259 defines it (``NaN``, ``Infinity`` and a number too large for a
float are refused, where Python's ``json`` reads them as non-finite floats
that no outlet can write back). ``loopctl.text`` re-exports them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

#: JSON nested deeper than this is refused wherever untrusted JSON is read.
MAX_JSON_DEPTH = 64


def clean_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD (a split pair is joined)."""
    if type(text) is not str or text.isascii():  # the common case: nothing to scan
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Through UTF-16: a high+low pair decodes to its character, a lone half to U+FFFD.
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def json_depth_exceeds(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when the JSON ``text`` nests arrays/objects deeper than ``limit``."""
    if text.count("{") + text.count("[") <= limit:
        return False
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def json_safe(value: object) -> Any:
    """``value`` as JSON ``allow_nan=False`` accepts: a non-finite float becomes None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


class NotJSONNumber(ValueError):
    """``NaN``, ``Infinity``, ``-Infinity`` or a literal too large for a float: not a JSON number."""


def _refuse_constant(name: str) -> object:
    raise NotJSONNumber(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NotJSONNumber(f"{text[:40]} is too large for a number")
    return value


def loads_strict(text: str) -> object:
    """``json.loads`` that refuses what RFC 8259 does not allow and Python's json does.

    Raises:
        NotJSONNumber: ``NaN``/``Infinity``/``-Infinity``, or a number that
            overflows to an infinite float (``1e999``).
        ValueError: any other malformed JSON.
        RecursionError: the text nests too deeply to parse.
    """
    return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)


__all__ = [
    "MAX_JSON_DEPTH", "NotJSONNumber", "clean_text", "json_depth_exceeds", "json_safe", "loads_strict",
]
