"""JSON values as JSON Schema sees them: types, equality, multiples, patterns, local refs.

Decoded JSON is Python's ``dict``/``list``/``str``/``int``/``float``/``bool``/
``None`` (and the frozen mappings and lists of ``loopctl.frozen``), and
Python's rules differ from JSON's in places this module owns: ``True == 1``
in Python but not in JSON, ``3.0`` is an integer in JSON, ``0.3`` is a
multiple of ``0.1`` in JSON, and a schema's ``pattern`` is an ECMA-262
regular expression in which ``$`` means the end of the text (Python's ``$``
also matches before a final newline). Nothing here raises for a bad value;
a bad *schema* raises ``SchemaFault``, which the validator turns into a
refusal that says the schema is at fault. ``show`` quotes a value in a
message: bounded, and masked before it is cut.
"""

from __future__ import annotations

import functools
import re
import reprlib
from collections.abc import Mapping, Sequence
from decimal import Decimal
from fractions import Fraction
from typing import Any, Optional, Union
from urllib.parse import unquote

from loopctl.text import masked_head

SchemaNode = Union[Mapping[str, Any], bool]

class _MaskedRepr(reprlib.Repr):
    """``reprlib``'s bounded repr, with every text masked before it is cut.

    A key in a string the repr would cut (or in the repr of something else)
    is masked whole, never shown in part; the frozen mappings and lists of
    ``loopctl.frozen`` are shown as the dicts and lists they are.
    """

    def repr_str(self, x: str, level: int) -> str:
        text = repr(masked_head(x, self.maxstring))
        return text if len(x) <= self.maxstring else text + "..."

    def repr_instance(self, x: object, level: int) -> str:
        if isinstance(x, str):
            return self.repr_str(x, level)
        if isinstance(x, dict):
            return self.repr_dict(x, level)
        if isinstance(x, list):
            return self.repr_list(x, level)
        try:
            text = repr(x)
        except Exception:
            return f"<{type(x).__name__} instance>"
        return text if len(text) <= self.maxother else masked_head(text, self.maxother) + "..."


_SHORT = _MaskedRepr()  # bounded work and text for any container
_SHORT.maxlevel, _SHORT.maxdict, _SHORT.maxlist, _SHORT.maxtuple = 2, 4, 6, 6
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 40, 40, 40


class SchemaFault(Exception):
    """The schema itself is broken where the validator reached (not the input).

    ``where`` is the path of the value being checked when it was found (the
    validator fills it in).
    """

    where: Optional[str] = None
    blames_schema = True


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


#: The type names JSON Schema knows; any other is a broken schema (it refuses, never waves through).
JSON_TYPES = frozenset(("string", "integer", "number", "boolean", "null", "array", "object"))


def is_type(value: object, name: object) -> bool:
    """True when ``value`` is of the JSON type ``name`` (one of ``JSON_TYPES``)."""
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
    return True


def json_key(value: object) -> object:
    """A hashable key equal for two values exactly when they are equal as JSON.

    ``1`` and ``1.0`` share a key, ``1`` and ``True`` do not; object keys'
    order does not matter; arrays compare item by item.
    """
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, (int, float)):
        return ("n", value)  # 1 == 1.0 and hash(1) == hash(1.0)
    if isinstance(value, str) or value is None:
        return ("s", value)
    if isinstance(value, (list, tuple)):
        return ("a", tuple(json_key(v) for v in value))
    if isinstance(value, Mapping):
        return ("o", frozenset((k, json_key(v)) for k, v in value.items()))
    return ("?", id(value))


def same(a: object, b: object) -> bool:
    """JSON equality (``enum``, ``const``): Python's ``==`` except that booleans are not numbers."""
    if type(a) is str or type(b) is str:
        return a == b
    return json_key(a) == json_key(b)


def among(value: object, options: Sequence[object]) -> bool:
    """``enum``: whether ``value`` is JSON-equal to one of ``options`` (the value's key made once)."""
    if type(value) is str:
        return any(type(e) is str and e == value for e in options)
    key = json_key(value)
    return any(type(e) is not str and json_key(e) == key for e in options)


def first_repeat(items: Sequence[object]) -> tuple[int, int]:
    """The positions of the first two JSON-equal items, or ``(-1, -1)`` when all differ."""
    seen: dict[object, int] = {}
    for i, item in enumerate(items):
        key = json_key(item)
        j = seen.setdefault(key, i)
        if j != i:
            return j, i
    return -1, -1


def _exact(number: object) -> Fraction:
    if isinstance(number, int):
        return Fraction(number)
    # The shortest text that reads back as the float: 0.1 is exactly 1/10 here,
    # the number the schema's author and the model wrote.
    return Fraction(Decimal(repr(number)))


def is_multiple(value: Union[int, float], factor: object) -> bool:
    """True when ``value`` is an integer multiple of ``factor`` (``0.3`` of ``0.1`` included).

    Raises:
        SchemaFault: ``factor`` is not a number greater than 0.
    """
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
        raise SchemaFault(f"multipleOf must be a number greater than 0, got {show(factor)}")
    if isinstance(value, int) and isinstance(factor, int):
        return value % factor == 0
    try:
        return (_exact(value) / _exact(factor)).denominator == 1
    except (ValueError, OverflowError, ArithmeticError):  # NaN or an infinity: a multiple of nothing
        return False


def _ecma_anchors(pattern: str) -> str:
    """``pattern`` with each unescaped ``$`` outside a character class made to mean the very end."""
    out: list[str] = []
    in_class = False
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            if ch == "]":
                in_class = False
        elif ch == "[":
            in_class = True
            # A "]" first in a class (or first after "^") is a literal.
            k = i + 1 + (pattern[i + 1 : i + 2] == "^")
            if pattern[k : k + 1] == "]":
                out.append(pattern[i : k + 1])
                i = k + 1
                continue
        elif ch == "$":
            ch = r"\Z"
        out.append(ch)
        i += 1
    return "".join(out)


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> Union[re.Pattern[str], str]:
    try:
        return re.compile(_ecma_anchors(pattern))
    except (re.error, RecursionError, OverflowError) as exc:
        return str(exc)


def regex(pattern: object) -> re.Pattern[str]:
    """The compiled form of a schema's ``pattern`` (cached; use it with ``search``).

    Raises:
        SchemaFault: ``pattern`` is not a str or does not compile.
    """
    if not isinstance(pattern, str):
        raise SchemaFault(f"pattern must be a str, got {show(pattern)}")
    made = _compiled(pattern)
    if isinstance(made, str):
        raise SchemaFault(f"pattern {show(pattern)} does not compile ({made})")
    return made


def resolve(root: SchemaNode, ref: object) -> SchemaNode:
    """The subschema a local ``$ref`` (``#``, ``#/$defs/X``, ``#/definitions/X``, any JSON pointer) names.

    Raises:
        SchemaFault: not a local JSON-pointer ref, or it points nowhere.
    """
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise SchemaFault(f"$ref {show(ref)} is not a local reference ('#/...'): only those are followed")
    pointer = unquote(ref[1:])
    if pointer and not pointer.startswith("/"):
        raise SchemaFault(f"$ref {show(ref)} names an anchor: only JSON pointers ('#/...') are followed")
    node: object = root
    for token in pointer.split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise SchemaFault(f"$ref {show(ref)} points nowhere in the schema")
    if not isinstance(node, (Mapping, bool)):
        raise SchemaFault(f"$ref {show(ref)} points at {json_type(node)}, not a schema")
    return node


def show(value: object, width: int = 40) -> str:
    """``repr(value)`` cut to ``width`` characters (a message never echoes a large input).

    Texts are masked before they are cut, so a key the cut would split is
    masked whole, never half shown.
    """
    if isinstance(value, str):
        text = repr(masked_head(value, width + 1))
    elif isinstance(value, (int, float, bool)) or value is None:
        text = repr(value) if not isinstance(value, int) or value.bit_length() < 200 else f"<a {value.bit_length()}-bit integer>"
    else:
        text = _SHORT.repr(dict(value) if isinstance(value, Mapping) else value)
    return text if len(text) <= width else masked_head(text, width - 3) + "..."


__all__ = [
    "JSON_TYPES",
    "SchemaFault",
    "among",
    "SchemaNode",
    "first_repeat",
    "is_multiple",
    "is_type",
    "json_key",
    "json_type",
    "regex",
    "resolve",
    "same",
    "show",
]
