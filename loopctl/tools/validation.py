"""Input validation against a tool's JSON Schema (a practical subset).

``check(schema, value)`` returns None for valid input, else one message that
names every bad field (``field 'a' must be integer, got string 'x'``), so the
model can fix everything in one retry. It never raises and never mutates.
Supported keywords: ``type`` (a name or a list), ``enum``, ``const``,
``anyOf``/``oneOf`` (both treated as "any of"), ``properties``,
``required``, ``additionalProperties`` (bool or schema; absent means
allowed, as JSON Schema says), ``items``, ``minimum``/``maximum``,
``minLength``/``maxLength``, ``minItems``/``maxItems``. Other keywords are
ignored. JSON numbers decode as floats sometimes, so ``3.0`` is an integer;
``True`` is never a number.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

_MAX_PROBLEMS = 5


def json_type(value: Any) -> str:
    """The JSON type name of a decoded value (``"string"``, ``"integer"``, ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def _is_type(value: Any, name: str) -> bool:
    if name == "string":
        return isinstance(value, str)
    if name == "integer":
        if isinstance(value, bool):
            return False
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if name == "boolean":
        return isinstance(value, bool)
    if name == "null":
        return value is None
    if name == "array":
        return isinstance(value, (list, tuple))
    if name == "object":
        return isinstance(value, Mapping)
    return True  # an unknown type name constrains nothing


def _same(a: Any, b: Any) -> bool:
    # 1 == True in Python; in JSON they differ.
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def describe(schema: Mapping[str, Any]) -> str:
    """What a schema expects, in words (``integer``, ``string or null``, ``one of 'a', 'b'``)."""
    if "enum" in schema:
        return "one of " + ", ".join(_show(v) for v in schema["enum"])
    if "const" in schema:
        return _show(schema["const"])
    t = schema.get("type")
    if isinstance(t, str):
        return t
    if isinstance(t, (list, tuple)) and t:
        return " or ".join(str(x) for x in t)
    branches = schema.get("anyOf") or schema.get("oneOf")
    if branches:
        return " or ".join(describe(b) for b in branches)
    return "any value"


def _label(path: str) -> str:
    return f"field '{path}'"


def _walk(schema: Mapping[str, Any], value: Any, path: str, out: list[str]) -> None:
    if len(out) >= _MAX_PROBLEMS:
        return
    branches = schema.get("anyOf") or schema.get("oneOf")
    if branches:
        if not any(_first(b, value) is None for b in branches):
            out.append(f"{_label(path)} must be {describe(schema)}, got {json_type(value)} {_show(value)}")
            return
    t = schema.get("type")
    if t is not None:
        names = (t,) if isinstance(t, str) else tuple(t)
        if not any(_is_type(value, n) for n in names):
            out.append(f"{_label(path)} must be {describe(schema)}, got {json_type(value)} {_show(value)}")
            return
    if "enum" in schema and not any(_same(value, e) for e in schema["enum"]):
        out.append(f"{_label(path)} must be {describe(schema)}, got {_show(value)}")
        return
    if "const" in schema and not _same(value, schema["const"]):
        out.append(f"{_label(path)} must be {_show(schema['const'])}, got {_show(value)}")
        return
    if isinstance(value, Mapping):
        _walk_object(schema, value, path, out)
    elif isinstance(value, (list, tuple)):
        _walk_array(schema, value, path, out)
    elif isinstance(value, str):
        _bounds(schema, len(value), "minLength", "maxLength", "characters", path, out)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        lo, hi = schema.get("minimum"), schema.get("maximum")
        if lo is not None and value < lo:
            out.append(f"{_label(path)} must be >= {lo}, got {_show(value)}")
        elif hi is not None and value > hi:
            out.append(f"{_label(path)} must be <= {hi}, got {_show(value)}")


def _bounds(
    schema: Mapping[str, Any], n: int, lo_key: str, hi_key: str, unit: str, path: str, out: list[str]
) -> None:
    lo, hi = schema.get(lo_key), schema.get(hi_key)
    if lo is not None and n < lo:
        out.append(f"{_label(path)} must have at least {lo} {unit}, got {n}")
    elif hi is not None and n > hi:
        out.append(f"{_label(path)} must have at most {hi} {unit}, got {n}")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _walk_object(schema: Mapping[str, Any], value: Mapping[str, Any], path: str, out: list[str]) -> None:
    props: Mapping[str, Any] = schema.get("properties") or {}
    for name in schema.get("required") or ():
        if len(out) >= _MAX_PROBLEMS:
            return
        if name not in value:
            sub = props.get(name)
            what = f" ({describe(sub)})" if isinstance(sub, Mapping) else ""
            out.append(f"missing required field '{_join(path, name)}'{what}")
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        sub = props.get(key)
        if sub is not None:
            _walk(sub, item, _join(path, str(key)), out)
        elif extra is False:
            allowed = ", ".join(props) if props else "none"
            out.append(f"unknown field '{_join(path, str(key))}' (allowed: {allowed})")
        elif isinstance(extra, Mapping):
            _walk(extra, item, _join(path, str(key)), out)
        if len(out) >= _MAX_PROBLEMS:
            return


def _walk_array(schema: Mapping[str, Any], value: Any, path: str, out: list[str]) -> None:
    _bounds(schema, len(value), "minItems", "maxItems", "items", path, out)
    items = schema.get("items")
    if isinstance(items, Mapping):
        for i, item in enumerate(value):
            _walk(items, item, f"{path}[{i}]", out)
            if len(out) >= _MAX_PROBLEMS:
                return


def _first(schema: Mapping[str, Any], value: Any) -> Optional[str]:
    out: list[str] = []
    _walk(schema, value, "value", out)
    return out[0] if out else None


def check(schema: Mapping[str, Any], value: Any) -> Optional[str]:
    """Validate a tool's whole input; None when valid, else the problems joined by ``"; "``."""
    if schema.get("type") == "object" and not isinstance(value, Mapping):
        return f"input must be an object, got {json_type(value)}"
    out: list[str] = []
    if isinstance(value, Mapping):
        _walk_object(schema, value, "", out)
    else:
        _walk(schema, value, "input", out)
    return "; ".join(out) if out else None


def matches(schema: Mapping[str, Any], value: Any) -> bool:
    """True when ``value`` satisfies ``schema`` (used to pick a union branch)."""
    return _first(schema, value) is None


__all__ = ["check", "describe", "json_type", "matches"]
