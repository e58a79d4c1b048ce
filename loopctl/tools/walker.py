"""The validator that explains: a decoded value against a JSON Schema, every problem named.

``run(schema, value, path, limit)`` collects at most ``limit``
messages, each naming the field by its path (``field 'user.tags[2]' ...``).
It fails closed: a schema it cannot apply (a ``$ref`` that is not local or
points nowhere, a ``$ref`` cycle that consumes no input, a pattern that
does not compile, a nonsensical keyword value) refuses the value with a
message that says the schema is at fault; so do inputs that nest too deeply
or would take more schema-and-value steps than ``STEPS_PER_VALUE`` per
value in the input (plus ``FREE_STEPS``, at most ``MAX_STEPS``): only an
exponential schema (``anyOf``/``allOf`` over recursive refs) needs that many. Messages quote at most a few
dozen characters of the input.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

from loopctl.text import masked_head
from loopctl.tools.jsonvalues import (
    JSON_TYPES,
    SchemaFault,
    SchemaNode,
    among,
    first_repeat,
    is_multiple,
    is_type,
    json_type,
    regex,
    resolve,
    same,
    show,
)

#: Schema-and-value steps one validation may take: ``FREE_STEPS``, then
#: ``STEPS_PER_VALUE`` for each value in the input, never more than ``MAX_STEPS``.
FREE_STEPS = 10_000
STEPS_PER_VALUE = 20
MAX_STEPS = 300_000
#: Nested subschema applications (input nesting plus ``$ref``/``allOf``/... hops).
MAX_NESTING = 256


_APPLICATORS = frozenset(("allOf", "anyOf", "oneOf", "not", "if"))
_OBJECT_EXTRAS = frozenset(("minProperties", "maxProperties", "dependentRequired", "dependentSchemas", "dependencies"))


class _TooHard(SchemaFault):
    """The input is too deep or too complex to check: refused, the schema is not blamed."""

    blames_schema = False


def describe(schema: object) -> str:
    """What a schema expects, in words (``integer``, ``string or null``, ``one of 'a', 'b'``)."""
    if schema is True or not isinstance(schema, Mapping):
        return "nothing" if schema is False else "any value"
    if "enum" in schema and isinstance(schema["enum"], (list, tuple)):
        options = list(schema["enum"])
        more = f" ({len(options) - 8} more)" if len(options) > 8 else ""
        return "one of " + ", ".join(show(v) for v in options[:8]) + more
    if "const" in schema:
        return show(schema["const"])
    if "pattern" in schema:
        return f"text matching {show(schema['pattern'])}"
    t = schema.get("type")
    if isinstance(t, str):
        return t
    if isinstance(t, (list, tuple)) and t:
        return " or ".join(str(x) for x in t)
    branches = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(branches, (list, tuple)) and branches:
        return " or ".join(describe(b) for b in branches[:8])
    return "any value"


def label(path: str) -> str:
    """``field 'a.b'`` (the input itself when ``path`` is empty); long paths are cut."""
    if not path:
        return "the input"
    return f"field {named(path)}"


def named(path: str) -> str:
    """``'a.b'``, a long path cut to 120 characters (a key of the input may be megabytes)."""
    return f"'{path if len(path) <= 120 else masked_head(path, 117) + '...'}'"


def join(path: str, key: object) -> str:
    """The path of a member: ``a.b`` (``b`` at the top)."""
    name = str(key)
    return f"{path}.{name}" if path else name


class Walk:
    """One validation: the root (for ``$ref``), the problems found, and the bounds.

    Mutates itself as it goes (``out``, ``steps``); make one per validation.
    """

    __slots__ = ("root", "out", "limit", "steps", "budget", "nesting", "active", "top")

    def __init__(self, root: SchemaNode, limit: int) -> None:
        self.root = root
        self.out: list[str] = []
        self.limit = limit
        self.steps = 0
        self.budget = FREE_STEPS  # raised once, by the input's size, when first spent
        self.top: object = None  # the whole input (its size sets the budget)
        self.nesting = 0
        self.active: set[tuple[str, int]] = set()  # ($ref, id(value)) being followed, for cycles

    def full(self) -> bool:
        """True once ``limit`` problems are known (callers stop looking)."""
        return len(self.out) >= self.limit

    def add(self, text: str) -> None:
        """Record one problem."""
        self.out.append(text)

    def fits(self, schema: object, value: object, path: str) -> bool:
        """Whether ``value`` satisfies ``schema`` (its problems are not kept)."""
        out, limit = self.out, self.limit
        self.out, self.limit = [], 1
        try:
            self.walk(schema, value, path)
            return not self.out
        finally:
            self.out, self.limit = out, limit

    def walk(self, schema: object, value: object, path: str) -> None:
        """Check ``value`` at ``path`` against ``schema``, adding what is wrong."""
        if self.full() or schema is True:
            return
        if schema is False:
            self.add(f"{label(path)} is not allowed")
            return
        if type(schema) is not dict and not isinstance(schema, Mapping):  # a dict skips the ABC's check
            raise SchemaFault(f"a schema must be an object or a bool, got {json_type(schema)}")
        self.steps += 1
        if self.steps > self.budget:
            self._spent()
        self.nesting += 1
        try:
            if self.nesting > MAX_NESTING:
                raise _TooHard(f"the input nests too deeply for this schema (over {MAX_NESTING} levels)")
            if "$ref" in schema:
                self._follow(schema["$ref"], value, path)
            if self._applicators(schema, value, path) and self._kind(schema, value, path):
                self._by_type(schema, value, path)
        except SchemaFault as exc:
            if exc.where is None:
                exc.where = path
            raise
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:  # a keyword's value is nonsense
            fault = SchemaFault(f"{type(exc).__name__}: {masked_head(str(exc), 120)}")
            fault.where = path
            raise fault from None
        finally:
            self.nesting -= 1

    def _spent(self) -> None:
        if self.budget == FREE_STEPS and self.top is not None:
            self.budget = min(MAX_STEPS, FREE_STEPS + STEPS_PER_VALUE * _count_values(self.top, MAX_STEPS))
        if self.steps > self.budget:
            raise _TooHard("the input is too large or too complex to check against this schema")

    def _follow(self, ref: object, value: object, path: str) -> None:
        target = resolve(self.root, ref)
        key = (str(ref), id(value))
        if key in self.active:
            raise SchemaFault(f"$ref {show(ref)} leads back to itself without reading any input (a cycle)")
        self.active.add(key)
        try:
            self.walk(target, value, path)
        finally:
            self.active.discard(key)

    def _applicators(self, schema: Mapping[str, Any], value: object, path: str) -> bool:
        """allOf, anyOf, oneOf, not, if/then/else; False when the value is already refused."""
        if _APPLICATORS.isdisjoint(schema):
            return True
        for sub in _alternatives(schema, "allOf") or ():
            self.walk(sub, value, path)
        branches = _alternatives(schema, "anyOf")
        if branches and not any(self.fits(b, value, path) for b in branches):
            self.add(f"{label(path)} must be {describe(schema)}, got {json_type(value)} {show(value)}")
            return False
        branches = _alternatives(schema, "oneOf")
        if branches:
            matched = sum(1 for b in branches if self.fits(b, value, path))
            if matched != 1:
                what = describe({"oneOf": branches})
                extra = "" if matched == 0 else f" (it matches {matched} of the alternatives, not exactly one)"
                self.add(f"{label(path)} must be {what}, got {json_type(value)} {show(value)}{extra}")
                return False
        if "not" in schema and self.fits(schema["not"], value, path):
            self.add(f"{label(path)} must not be {describe(schema['not'])}, got {show(value)}")
            return False
        if "if" in schema and ("then" in schema or "else" in schema):
            branch = "then" if self.fits(schema["if"], value, path) else "else"
            if branch in schema:
                self.walk(schema[branch], value, path)
        return True

    def _kind(self, schema: Mapping[str, Any], value: object, path: str) -> bool:
        """type, enum, const; False when the value is refused."""
        t = schema.get("type")
        if t is not None:
            names = (t,) if isinstance(t, str) else tuple(t)
            unknown = [n for n in names if not isinstance(n, str) or n not in JSON_TYPES]
            if unknown or not names:
                raise SchemaFault(f"type {show(t)} names no JSON type (string, integer, number, ...)")
            if not any(is_type(value, n) for n in names):
                self.add(f"{label(path)} must be {describe(schema)}, got {json_type(value)} {show(value)}")
                return False
        if "enum" in schema and not among(value, _listed(schema, "enum")):
            self.add(f"{label(path)} must be {describe(schema)}, got {show(value)}")
            return False
        if "const" in schema and not same(value, schema["const"]):
            self.add(f"{label(path)} must be {show(schema['const'])}, got {show(value)}")
            return False
        return True

    def _by_type(self, schema: Mapping[str, Any], value: object, path: str) -> None:
        if isinstance(value, str):
            self.bounds(schema, len(value), "minLength", "maxLength", "characters", path)
            if "pattern" in schema and not regex(schema["pattern"]).search(value):
                self.add(f"{label(path)} must match the pattern {show(schema['pattern'])}, got {show(value)}")
        elif isinstance(value, bool) or value is None:
            return
        elif isinstance(value, (int, float)):
            self._number(schema, value, path)
        elif isinstance(value, (list, tuple)):
            self._array(schema, value, path)
        elif isinstance(value, Mapping):
            self._object(schema, value, path)

    def _number(self, schema: Mapping[str, Any], value: float, path: str) -> None:
        lo, hi = schema.get("minimum"), schema.get("maximum")
        xlo, xhi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
        if xlo is True:  # the draft-4 form: a flag on "minimum"
            lo, xlo = None, lo
        if xhi is True:
            hi, xhi = None, hi
        # Each test is "not within": NaN is within no bound.
        if lo is not None and not value >= lo:
            self.add(f"{label(path)} must be >= {lo}, got {show(value)}")
        elif hi is not None and not value <= hi:
            self.add(f"{label(path)} must be <= {hi}, got {show(value)}")
        elif xlo is not None and xlo is not False and not value > xlo:
            self.add(f"{label(path)} must be > {xlo}, got {show(value)}")
        elif xhi is not None and xhi is not False and not value < xhi:
            self.add(f"{label(path)} must be < {xhi}, got {show(value)}")
        elif "multipleOf" in schema and not is_multiple(value, schema["multipleOf"]):
            self.add(f"{label(path)} must be a multiple of {show(schema['multipleOf'])}, got {show(value)}")

    def _object(self, schema: Mapping[str, Any], value: Mapping[str, Any], path: str) -> None:
        props: Mapping[str, Any] = schema.get("properties") or {}
        for name in _listed(schema, "required") if "required" in schema else ():
            if self.full():
                return
            if name not in value:
                sub = props.get(name)
                if isinstance(sub, Mapping) and "$ref" in sub:
                    sub = resolve(self.root, sub["$ref"])
                what = f" ({describe(sub)})" if isinstance(sub, Mapping) else ""
                self.add(f"missing required field {named(join(path, name))}{what}")
        self._members(schema, props, value, path)
        if not _OBJECT_EXTRAS.isdisjoint(schema):
            self.bounds(schema, len(value), "minProperties", "maxProperties", "properties", path)
            self._dependencies(schema, value, path)

    def _members(self, schema: Mapping[str, Any], props: Mapping[str, Any], value: Mapping[str, Any], path: str) -> None:
        extra = schema.get("additionalProperties", True)
        patterns: Mapping[str, Any] = schema.get("patternProperties") or {}
        names = schema.get("propertyNames")
        if extra is True and not props and not patterns and names is None:
            return
        for key, item in value.items():
            if self.full():
                return
            where = join(path, key)
            if names is not None and not self.fits(names, key, where):
                self.add(f"{label(where)}: the name {show(key)} is not allowed ({describe(names)})")
            matched = False
            if key in props:
                matched = True
                self.walk(props[key], item, where)
            for pattern, sub in patterns.items():
                if regex(pattern).search(str(key)):
                    matched = True
                    self.walk(sub, item, where)
            if matched or extra is True:
                continue
            if extra is False:
                allowed = ", ".join(list(props)[:20]) + (", ..." if len(props) > 20 else "") if props else "none"
                self.add(f"unknown field {named(where)} (allowed: {allowed})")
            else:
                self.walk(extra, item, where)

    def _dependencies(self, schema: Mapping[str, Any], value: Mapping[str, Any], path: str) -> None:
        required: dict[str, Any] = dict(schema.get("dependentRequired") or {})
        subschemas: dict[str, Any] = dict(schema.get("dependentSchemas") or {})
        for key, dep in (schema.get("dependencies") or {}).items():  # the draft-7 spelling of both
            (required if isinstance(dep, (list, tuple)) else subschemas)[key] = dep
        for key, needed in required.items():
            if key in value:
                for name in needed:
                    if name not in value and not self.full():
                        self.add(f"missing field {named(join(path, name))} (required when {named(join(path, key))} is given)")
        for key, sub in subschemas.items():
            if key in value:
                self.walk(sub, value, path)

    def _array(self, schema: Mapping[str, Any], value: Sequence[object], path: str) -> None:
        self.bounds(schema, len(value), "minItems", "maxItems", "items", path)
        if schema.get("uniqueItems") is True and not self.full():
            self.unique(value, path)
        prefix = schema.get("prefixItems")
        items = schema.get("items")
        rest: object = items
        if isinstance(items, (list, tuple)):  # the draft-7 tuple form
            prefix, rest = items, schema.get("additionalItems", True)
        start = 0
        if isinstance(prefix, (list, tuple)):
            for i, (sub, item) in enumerate(zip(prefix, value)):
                self.walk(sub, item, f"{path}[{i}]")
            start = len(prefix)
        if rest is not None and rest is not True:
            for i in range(start, len(value)):
                if self.full():
                    return
                self.walk(rest, value[i], f"{path}[{i}]")
        if "contains" in schema:
            self._contains(schema, value, path)

    def _contains(self, schema: Mapping[str, Any], value: Sequence[object], path: str) -> None:
        sub = schema["contains"]
        n = sum(1 for i, item in enumerate(value) if self.fits(sub, item, f"{path}[{i}]"))
        lo, hi = schema.get("minContains", 1), schema.get("maxContains")
        if n < lo:
            self.add(f"{label(path)} must contain at least {lo} item(s) that are {describe(sub)}, got {n}")
        elif hi is not None and n > hi:
            self.add(f"{label(path)} must contain at most {hi} item(s) that are {describe(sub)}, got {n}")

    def bounds(self, schema: Mapping[str, Any], n: int, lo_key: str, hi_key: str, unit: str, path: str) -> None:
        """A size's ``lo_key``/``hi_key`` bounds (``minItems``/``maxItems``, ...)."""
        lo, hi = schema.get(lo_key), schema.get(hi_key)
        if lo is not None and n < lo:
            self.add(f"{label(path)} must have at least {lo} {unit}, got {n}")
        elif hi is not None and n > hi:
            self.add(f"{label(path)} must have at most {hi} {unit}, got {n}")

    def unique(self, value: Sequence[object], path: str) -> None:
        """``uniqueItems``: JSON equality (``1`` equals ``1.0``, not ``true``)."""
        i, j = first_repeat(value)
        if i >= 0:
            self.add(f"{label(path)} must have unique items, but items {i} and {j} are equal ({show(value[i])})")


def _listed(schema: Mapping[str, Any], key: str) -> Sequence[Any]:
    """A keyword whose value must be a list (``enum``, ``required``).

    Raises:
        SchemaFault: it is not (a string would be read letter by letter).
    """
    listed = schema[key]
    if not isinstance(listed, (list, tuple)):
        raise SchemaFault(f"{key} must be a list, got {json_type(listed)} {show(listed)}")
    return listed


def _alternatives(schema: Mapping[str, Any], key: str) -> Optional[Sequence[Any]]:
    """``allOf``/``anyOf``/``oneOf``'s schemas (None when absent).

    Raises:
        SchemaFault: not a non-empty list (an empty ``anyOf`` would accept anything).
    """
    if key not in schema:
        return None
    listed = _listed(schema, key)
    if not listed:
        raise SchemaFault(f"{key} must list at least one schema")
    return listed


def _count_values(value: object, stop: int) -> int:
    """How many values ``value`` holds, itself included (counting stops past ``stop``)."""
    n = 0
    todo = [value]
    while todo and n <= stop:
        item = todo.pop()
        n += 1
        if isinstance(item, (list, tuple)):
            todo.extend(item)
        elif isinstance(item, Mapping):
            todo.extend(item.values())
    return n


def run(schema: SchemaNode, value: object, path: str, limit: int, root: Optional[SchemaNode] = None) -> list[str]:
    """At most ``limit`` problems of ``value`` against ``schema`` (``[]`` when valid); never raises.

    A broken schema (or an input too deep or too complex to check) gives one
    problem saying so: the value is refused, never waved through.
    """
    walk = Walk(schema if root is None else root, limit)
    walk.top = value
    try:
        walk.walk(schema, value, path)
    except SchemaFault as exc:
        where = label(path if exc.where is None else exc.where)
        return [f"cannot check {where}: {'the schema is invalid: ' if exc.blames_schema else ''}{exc}"]
    except RecursionError:
        return [f"cannot check {label(path)}: the input nests too deeply for this schema"]
    return walk.out


__all__ = ["describe", "run"]
