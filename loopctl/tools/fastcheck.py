"""A yes/no validator compiled once per schema, for the common case: an ``@tool`` schema.

``compile_schema(schema)`` returns ``accept(value) -> bool`` that accepts
exactly what the explaining validator (``loopctl.tools.walker``) accepts.
Schemas made only of the keywords ``@tool`` emits (``type``, ``enum``,
``const``, ``anyOf``, ``properties``, ``required``,
``additionalProperties``, ``items``, the size and range bounds, and
annotations) become a tree of small closures; a schema that uses any other
validation keyword anywhere (``$ref``, ``pattern``, ``oneOf``, ...) is
checked by the walker instead, so the two can never disagree on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Callable, Optional

from loopctl.tools.jsonvalues import JSON_TYPES, among, is_type, same
from loopctl.tools.walker import run

Accept = Callable[[object], bool]

#: Keywords the closures implement; anything else that constrains sends the schema to the walker.
_WALKER_ONLY = frozenset((
    "$ref", "allOf", "oneOf", "not", "if", "then", "else", "pattern", "patternProperties",
    "propertyNames", "uniqueItems", "multipleOf", "exclusiveMinimum", "exclusiveMaximum",
    "minProperties", "maxProperties", "dependentRequired", "dependencies", "dependentSchemas",
    "prefixItems", "additionalItems", "contains", "minContains", "maxContains",
))


_BOUNDS = ("minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems")


def _sane(schema: Mapping[str, Any]) -> bool:
    """The keyword values the closures read are well-formed (else the walker reports the schema)."""
    t = schema.get("type")
    return (
        all(
            schema.get(k) is None or (isinstance(schema[k], (int, float)) and not isinstance(schema[k], bool))
            for k in _BOUNDS
        )
        and (t is None or _known(t) or (isinstance(t, (list, tuple)) and bool(t) and all(_known(n) for n in t)))
        and isinstance(schema.get("required", ()), (list, tuple))
        and isinstance(schema.get("enum", ()), (list, tuple))
        and ("anyOf" not in schema or (isinstance(schema["anyOf"], (list, tuple)) and bool(schema["anyOf"])))
    )


def _known(name: object) -> bool:
    return isinstance(name, str) and name in JSON_TYPES


def _is_plain(schema: object) -> bool:
    """True when the closures cover every constraint in ``schema`` (recursively)."""
    if not isinstance(schema, Mapping) or not _WALKER_ONLY.isdisjoint(schema) or not _sane(schema):
        return False
    props = schema.get("properties") or {}
    extra = schema.get("additionalProperties", True)
    items = schema.get("items")
    branches = schema.get("anyOf") or ()
    return (
        isinstance(props, Mapping)
        and all(_is_plain(p) for p in props.values())
        and (isinstance(extra, bool) or _is_plain(extra))
        and (items is None or _is_plain(items))
        and all(_is_plain(b) for b in branches)
    )


def _is_integer(v: object) -> bool:
    if type(v) is int:
        return True
    return is_type(v, "integer")


_TYPE_TESTS: dict[str, Accept] = {
    "string": lambda v: isinstance(v, str),
    "integer": _is_integer,
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "array": lambda v: isinstance(v, (list, tuple)),
    "object": lambda v: type(v) is dict or isinstance(v, Mapping),
}


def compile_schema(schema: Mapping[str, Any]) -> Accept:
    """A fast yes/no validator for ``schema``, accepting exactly what ``check`` accepts.

    Built once per schema (``@tool`` does it at decoration); on a "no",
    ``check`` produces the message.
    """
    if not _is_plain(schema):
        return lambda v: not run(schema, v, "", 1)
    return _compile(schema)


def _compile(schema: Mapping[str, Any]) -> Accept:
    tests: list[Accept] = []
    branches = schema.get("anyOf")
    if branches:
        subs = [_compile(b) for b in branches]
        tests.append(lambda v: any(f(v) for f in subs))
    t = schema.get("type")
    if t is not None:
        names = (t,) if isinstance(t, str) else tuple(t)
        kinds = [_TYPE_TESTS[n] for n in names]  # known names only: _sane sent any other to the walker
        tests.append(kinds[0] if len(kinds) == 1 else (lambda v: any(k(v) for k in kinds)))
    if "enum" in schema:
        options = list(schema["enum"])
        tests.append(lambda v: among(v, options))
    if "const" in schema:
        const = schema["const"]
        tests.append(lambda v: same(v, const))
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


def _compile_bounds(schema: Mapping[str, Any], lo_key: str, hi_key: str) -> Optional[Callable[[float], bool]]:
    lo, hi = schema.get(lo_key), schema.get(hi_key)
    if lo is None and hi is None:
        return None
    return lambda n: (lo is None or n >= lo) and (hi is None or n <= hi)


def _compile_object(schema: Mapping[str, Any]) -> Optional[Callable[[Mapping[str, object]], bool]]:
    props = {k: _compile(v) for k, v in (schema.get("properties") or {}).items()}
    required = tuple(schema.get("required") or ())
    extra = schema.get("additionalProperties", True)
    extra_test: Optional[Accept] = _compile(extra) if isinstance(extra, Mapping) else None
    refuse_extra = extra is False
    if not props and not required and extra_test is None and not refuse_extra:
        return None

    def accept(v: Mapping[str, object]) -> bool:
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


def _compile_array(schema: Mapping[str, Any]) -> Optional[Callable[[Sequence[object]], bool]]:
    items = schema.get("items")
    item_test = _compile(items) if isinstance(items, Mapping) else None
    size = _compile_bounds(schema, "minItems", "maxItems")
    if item_test is None and size is None:
        return None

    def accept(v: Sequence[object]) -> bool:
        if size is not None and not size(len(v)):
            return False
        return item_test is None or all(item_test(x) for x in v)

    return accept


__all__ = ["compile_schema"]
