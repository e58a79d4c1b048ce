"""A JSON Schema checked whole, once, before it is used: ``check_schema(schema, what)``.

The validator (``loopctl.tools.walker``) refuses a value when it reaches a
broken spot of its schema, so a schema written by hand can fail only when
some input happens to reach the spot. A schema the program itself asks for
(a typed answer) is checked here instead, before anything is sent: every
keyword the validator applies, at every depth (subschemas, ``$defs``,
``$ref`` targets), must have a value it can apply, and no ``$ref`` may lead
back to itself without reading input. The first fault is a ``ConfigError``
naming its place as a JSON pointer and the bad value. Unknown keywords and
annotations (``format``, ``description``, ...) are not checked, as the
validator ignores them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any, Callable, NoReturn, Optional, TypeVar

import attrs

from loopctl.errors import ConfigError
from loopctl.text import masked_head
from loopctl.tools.jsonvalues import (
    JSON_TYPES,
    SchemaFault,
    is_type,
    json_type,
    regex,
    resolve,
    show,
)

# Keywords whose value is one subschema, applied to the value itself.
_IN_PLACE_ONE = ("not", "if", "then", "else")
# ... a non-empty list of subschemas applied to the value itself.
_IN_PLACE_LISTS = ("allOf", "anyOf", "oneOf")
# ... one subschema applied to a member, an item or a key.
_NESTED_ONE = ("additionalProperties", "propertyNames", "additionalItems", "contains")
# ... a mapping of subschemas applied to members (or, for the definitions, reached by ``$ref``).
_NESTED_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SIZES = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
          "minContains", "maxContains")
_BOUNDS = ("minimum", "maximum")
_EXCLUSIVE = ("exclusiveMinimum", "exclusiveMaximum")  # a number, or the draft-4 flag

_T = TypeVar("_T")


def check_schema(schema: object, what: str) -> None:
    """Refuse a schema the validator could not apply somewhere.

    Args:
        schema: the JSON Schema (a mapping or a bool).
        what: names the schema in the message (``"output_type schema"``).

    Raises:
        ConfigError: the first fault, with its JSON pointer and the bad value.
    """
    found = schema_fault(schema)
    if found is not None:
        where, problem = found
        raise ConfigError(f"{what} is not a valid JSON Schema: at {where}, {problem}")


def schema_fault(schema: object) -> Optional[tuple[str, str]]:
    """The first fault of ``schema`` as (JSON pointer, what is wrong); None when it can be applied."""
    if isinstance(schema, bool):
        return None
    if not isinstance(schema, Mapping):
        return "#", f"a schema must be an object or a bool, got {json_type(schema)} {show(schema)}"
    places: dict[int, str] = {}  # id of each schema object checked -> its pointer
    in_place: dict[int, list[_Edge]] = {}  # id -> the subschemas applied to the same value
    todo: list[tuple[object, str]] = [(schema, "#")]
    while todo:
        node, where = todo.pop()
        if isinstance(node, bool) or id(node) in places:
            continue
        if not isinstance(node, Mapping):
            return where, f"a schema must be an object or a bool, got {json_type(node)} {show(node)}"
        places[id(node)] = where
        try:
            _check_values(node)
            subs = list(_subschemas(schema, node, where))
        except _KeywordFault as exc:
            return _pointer(where, *exc.tokens), str(exc)
        in_place[id(node)] = [e for e in subs if e.same_value and isinstance(e.schema, Mapping)]
        todo.extend((e.schema, e.where) for e in reversed(subs))
    return _cycle(in_place, places)


@attrs.frozen
class _Edge:
    """A subschema of a schema object: where it is, and whether it applies to the same value."""

    schema: object
    where: str
    same_value: bool
    ref: Optional[str] = None  # the ``$ref`` it was reached by


def _cycle(in_place: Mapping[int, list[_Edge]], places: Mapping[int, str]) -> Optional[tuple[str, str]]:
    """A chain of subschemas applied to the same value that comes back to its start, if any.

    The validator would follow it for ever (it refuses the value instead).
    """
    state: dict[int, bool] = {}  # True while on the current chain, False once done
    for start in in_place:
        if start in state:
            continue
        state[start] = True
        chain: list[tuple[int, Iterator[_Edge]]] = [(start, iter(in_place[start]))]
        while chain:
            at, edges = chain[-1]
            for edge in edges:
                sub = id(edge.schema)
                if state.get(sub):
                    if edge.ref is not None:
                        return (_pointer(places[at], "$ref"),
                                f"$ref {show(edge.ref)} leads back to itself without reading any input (a cycle)")
                    return edge.where, "the schema contains itself without reading any input (a cycle)"
                if sub not in state and sub in in_place:
                    state[sub] = True
                    chain.append((sub, iter(in_place[sub])))
                    break
            else:
                state[at] = False
                chain.pop()
    return None


def _pointer(where: str, *tokens: object) -> str:
    escaped = (str(t).replace("~", "~0").replace("/", "~1") for t in tokens)
    path = "/".join((where, *escaped))
    return path if len(path) <= 120 else masked_head(path, 117) + "..."


def _check_values(node: Mapping[str, Any]) -> None:
    """The keyword values of one schema object that are not themselves subschemas."""
    t = node.get("type")
    if t is not None:
        names = [t] if isinstance(t, str) else t if isinstance(t, (list, tuple)) else None
        if not names or any(not isinstance(n, str) or n not in JSON_TYPES for n in names):
            _fault("type", f"{show(t)} names no JSON type ({', '.join(sorted(JSON_TYPES))})")
    for key in ("enum", "required"):
        if key in node and not isinstance(node[key], (list, tuple)):
            _fault(key, f"must be a list, got {json_type(node[key])} {show(node[key])}")
    if "enum" in node and not node["enum"]:
        _fault("enum", "must list at least one value (no answer could fit)")
    for i, name in enumerate(node.get("required") or ()):
        if not isinstance(name, str):
            _fault("required", f"must list property names, got {show(name)}", i)
    for key in _SIZES:
        if key in node and not (is_type(node[key], "integer") and node[key] >= 0):
            _fault(key, f"must be a whole number >= 0, got {show(node[key])}")
    for key in (*_BOUNDS, *_EXCLUSIVE):
        value = node.get(key)
        if value is not None and not _finite(value) and not (key in _EXCLUSIVE and isinstance(value, bool)):
            _fault(key, f"must be a finite number, got {json_type(value)} {show(value)}")
    factor = node.get("multipleOf")
    if factor is not None and not (_finite(factor) and factor > 0):
        _fault("multipleOf", f"must be a finite number greater than 0, got {show(factor)}")
    if "pattern" in node:
        _at(("pattern",), regex, node["pattern"])
    if "uniqueItems" in node and not isinstance(node["uniqueItems"], bool):
        _fault("uniqueItems", f"must be true or false, got {show(node['uniqueItems'])}")
    for key, dep in _mapping(node, "dependentRequired").items():
        _names_list(node, ("dependentRequired", key), dep)
    for key, dep in _mapping(node, "dependencies").items():
        if isinstance(dep, (list, tuple)):
            _names_list(node, ("dependencies", key), dep)


def _finite(value: object) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def _names_list(node: Mapping[str, Any], tokens: tuple[object, ...], names: object) -> None:
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        _fault(tokens[0], f"must list property names, got {show(names)}", *tokens[1:])


def _subschemas(root: Mapping[str, Any], node: Mapping[str, Any], where: str) -> Iterator[_Edge]:
    """Each subschema of ``node`` (its ``$ref`` target included), checking the keywords that hold them."""
    if "$ref" in node:
        ref = node["$ref"]
        target = _at(("$ref",), resolve, root, ref)
        yield _Edge(target, str(ref), True, str(ref))
    for key in _IN_PLACE_ONE:
        if key in node:
            yield _Edge(node[key], _pointer(where, key), True)
    for key in _IN_PLACE_LISTS:
        if key in node:
            listed = node[key]
            if not isinstance(listed, (list, tuple)) or not listed:
                _fault(key, f"must list at least one schema, got {show(listed)}")
            for i, sub in enumerate(listed):
                yield _Edge(sub, _pointer(where, key, i), True)
    for key, sub in _mapping(node, "dependentSchemas").items():
        yield _Edge(sub, _pointer(where, "dependentSchemas", key), True)
    for key, dep in _mapping(node, "dependencies").items():
        if not isinstance(dep, (list, tuple)):
            yield _Edge(dep, _pointer(where, "dependencies", key), True)
    for key in _NESTED_ONE:
        if key in node:
            yield _Edge(node[key], _pointer(where, key), False)
    for key in _NESTED_MAPS:
        for name, sub in _mapping(node, key).items():
            if key == "patternProperties":
                _at((key, name), regex, name)
            yield _Edge(sub, _pointer(where, key, name), False)
    yield from _item_schemas(node, where)


def _item_schemas(node: Mapping[str, Any], where: str) -> Iterator[_Edge]:
    items = node.get("items")
    if isinstance(items, (list, tuple)):  # the draft-7 tuple form
        for i, sub in enumerate(items):
            yield _Edge(sub, _pointer(where, "items", i), False)
    elif "items" in node:
        yield _Edge(items, _pointer(where, "items"), False)
    if "prefixItems" in node:
        prefix = node["prefixItems"]
        if not isinstance(prefix, (list, tuple)):
            _fault("prefixItems", f"must be a list of schemas, got {json_type(prefix)} {show(prefix)}")
        for i, sub in enumerate(prefix):
            yield _Edge(sub, _pointer(where, "prefixItems", i), False)


def _mapping(node: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = node.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        _fault(key, f"must be an object, got {json_type(value)} {show(value)}")
    return value


def _fault(key: object, problem: str, *more: object) -> NoReturn:
    """Raise the fault of a schema object's ``key`` (``more``: tokens below it, such as a list index)."""
    raise _KeywordFault(f"{key} {problem}", (key, *more))


def _at(tokens: tuple[object, ...], apply: Callable[..., _T], *args: object) -> _T:
    """``apply(*args)``, its ``SchemaFault`` placed at the keyword ``tokens`` lead to."""
    try:
        return apply(*args)
    except SchemaFault as exc:
        raise _KeywordFault(str(exc), tokens) from None


class _KeywordFault(SchemaFault):
    """A fault of one keyword's value; ``tokens`` lead from the schema object to it."""

    def __init__(self, text: str, tokens: tuple[object, ...]) -> None:
        super().__init__(text)
        self.tokens = tokens


__all__ = ["check_schema", "schema_fault"]
