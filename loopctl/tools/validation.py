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
from typing import Any, Callable, Optional

_MAX_PROBLEMS = 5


def json_type(value: object) -> str:
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


def _is_type(value: object, name: str) -> bool:
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


def _same(a: object, b: object) -> bool:
    # 1 == True in Python; in JSON they differ.
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def _show(value: object) -> str:
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


def _walk(schema: Mapping[str, Any], value: object, path: str, out: list[str]) -> None:
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
        elif extra is not True and isinstance(extra, Mapping):  # the default (True) skips the ABC's check
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


def _first(schema: Mapping[str, Any], value: object) -> Optional[str]:
    out: list[str] = []
    _walk(schema, value, "value", out)
    return out[0] if out else None


def problems(schema: Mapping[str, Any], value: object, root: str = "value") -> list[str]:
    """Every problem (at most five) of a whole value against ``schema``; ``[]`` when valid.

    Paths start at ``root`` (``value.items[2].name``), so a person or a model
    reading the list can find each bad spot.
    """
    out: list[str] = []
    _walk(schema, value, root, out)
    return out


def check(schema: Mapping[str, Any], value: Any) -> Optional[str]:
    """Validate a tool's whole input; None when valid, else the problems joined by ``"; "``."""
    is_object = type(value) is dict or isinstance(value, Mapping)  # a dict skips the ABC's check
    if not is_object and schema.get("type") == "object":
        return f"input must be an object, got {json_type(value)}"
    out: list[str] = []
    if is_object:
        _walk_object(schema, value, "", out)
    else:
        _walk(schema, value, "input", out)
    return "; ".join(out) if out else None


Accept = Callable[[Any], bool]

def _is_integer(v: object) -> bool:
    if type(v) is int:
        return True
    return _is_type(v, "integer")


_TYPE_TESTS: dict[str, Accept] = {
    "string": lambda v: isinstance(v, str),
    "integer": _is_integer,
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "array": lambda v: isinstance(v, (list, tuple)),
    "object": lambda v: type(v) is dict or isinstance(v, Mapping),
}


def _always(v: object) -> bool:
    return True


def compile_schema(schema: Mapping[str, Any]) -> Accept:
    """A fast yes/no validator for ``schema``, accepting exactly what ``check`` accepts.

    Built once per schema (``@tool`` does it at decoration); on a "no",
    ``check`` produces the message.
    """
    tests: list[Accept] = []
    branches = schema.get("anyOf") or schema.get("oneOf")
    if branches:
        subs = [compile_schema(b) for b in branches]
        tests.append(lambda v: any(f(v) for f in subs))
    t = schema.get("type")
    if t is not None:
        names = (t,) if isinstance(t, str) else tuple(t)
        kinds = [_TYPE_TESTS.get(n, _always) for n in names]
        tests.append(kinds[0] if len(kinds) == 1 else (lambda v: any(k(v) for k in kinds)))
    if "enum" in schema:
        options = list(schema["enum"])
        tests.append(lambda v: any(_same(v, e) for e in options))
    if "const" in schema:
        const = schema["const"]
        tests.append(lambda v: _same(v, const))
    obj = _compile_object(schema)
    arr = _compile_array(schema)
    text = _compile_bounds(schema, "minLength", "maxLength")
    num = _compile_bounds(schema, "minimum", "maximum")

    def accept(v: object) -> bool:
        for test in tests:
            if not test(v):
                return False
        # Cheap concrete checks first: ABC isinstance (Mapping) is slow.
        if isinstance(v, str):
            return text is None or text(len(v))
        if isinstance(v, (int, float)):
            return num is None or isinstance(v, bool) or num(v)
        if v is None:
            return True
        if isinstance(v, (list, tuple)):
            return arr is None or arr(v)
        if isinstance(v, dict) or isinstance(v, Mapping):  # a dict (frozen ones too) skips the ABC check
            return obj is None or obj(v)
        return True

    return accept


def _compile_bounds(schema: Mapping[str, Any], lo_key: str, hi_key: str) -> Optional[Callable[[object], bool]]:
    lo, hi = schema.get(lo_key), schema.get(hi_key)
    if lo is None and hi is None:
        return None
    return lambda n: (lo is None or n >= lo) and (hi is None or n <= hi)


def _compile_object(schema: Mapping[str, Any]) -> Optional[Accept]:
    props = {k: compile_schema(v) for k, v in (schema.get("properties") or {}).items()}
    required = tuple(schema.get("required") or ())
    extra = schema.get("additionalProperties", True)
    extra_test: Optional[Accept] = compile_schema(extra) if isinstance(extra, Mapping) else None
    refuse_extra = extra is False
    if not props and not required and extra_test is None and not refuse_extra:
        return None

    def accept(v: Mapping[str, Any]) -> bool:
        for name in required:
            if name not in v:
                return False
        for key, item in v.items():
            test = props.get(key)
            if test is not None:
                if not test(item):
                    return False
            elif refuse_extra:
                return False
            elif extra_test is not None and not extra_test(item):
                return False
        return True

    return accept


def _compile_array(schema: Mapping[str, Any]) -> Optional[Accept]:
    items = schema.get("items")
    item_test = compile_schema(items) if isinstance(items, Mapping) else None
    size = _compile_bounds(schema, "minItems", "maxItems")
    if item_test is None and size is None:
        return None

    def accept(v: Any) -> bool:
        if size is not None and not size(len(v)):
            return False
        return item_test is None or all(item_test(x) for x in v)

    return accept


def matches(schema: Mapping[str, Any], value: object) -> bool:
    """True when ``value`` satisfies ``schema`` (used to pick a union branch)."""
    return _first(schema, value) is None


__all__ = ["check", "compile_schema", "describe", "json_type", "matches"]
