"""Input validation against a tool's JSON Schema: the public face of the validator.

``check(schema, value)`` returns None for valid input, else one message that
names every bad field (``field 'a' must be integer, got string 'x'``), at
most five, so the model can fix everything in one retry. It never raises
and never mutates. Supported keywords (JSON Schema 2020-12, with the
draft-7 spellings ``definitions``, ``dependencies``, array ``items`` plus
``additionalItems``, and draft-4 boolean ``exclusiveMinimum``):

- local ``$ref`` (``#``, ``#/$defs/X``, ``#/definitions/X``, any JSON
  pointer into the schema), applied together with its sibling keywords;
- ``type`` (a name or a list), ``enum``, ``const`` (JSON equality: ``1``
  and ``true`` differ, ``1`` and ``1.0`` are equal);
- ``allOf``, ``anyOf``, ``oneOf`` (exactly one), ``not``, ``if``/``then``/``else``;
- objects: ``properties``, ``required``, ``additionalProperties`` (bool or
  schema; absent means allowed, as JSON Schema says), ``patternProperties``,
  ``propertyNames``, ``minProperties``/``maxProperties``,
  ``dependentRequired``, ``dependentSchemas``;
- arrays: ``items``, ``prefixItems``, ``minItems``/``maxItems``,
  ``uniqueItems``, ``contains``/``minContains``/``maxContains``;
- strings: ``minLength``/``maxLength`` (code points), ``pattern`` (searched
  anywhere in the text, as JSON Schema says; Python's ``re`` dialect, except
  that ``$`` means the very end, never "before a final newline");
- numbers: ``minimum``/``maximum``, ``exclusiveMinimum``/``exclusiveMaximum``,
  ``multipleOf`` (exact: ``0.3`` is a multiple of ``0.1``).

``format`` is an annotation (JSON Schema's default) and is not checked, nor
are ``unevaluatedProperties``/``unevaluatedItems``, ``$dynamicRef`` or
remote refs; other unknown keywords are ignored. A schema the validator
cannot apply (a remote or dangling ``$ref``, a ``$ref`` cycle, a pattern
``re`` cannot compile, a ``multipleOf`` that is not positive) refuses every
value that reaches the broken spot, with a message saying the schema is
invalid: a broken schema never lets input through unchecked. JSON numbers
decode as floats sometimes, so ``3.0`` is an integer; ``True`` is never a
number.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from loopctl.tools.fastcheck import compile_schema
from loopctl.tools.jsonvalues import json_type
from loopctl.tools.walker import describe, run

_MAX_PROBLEMS = 5


def problems(schema: Mapping[str, Any], value: object, root: str = "value") -> list[str]:
    """Every problem (at most five) of a whole value against ``schema``; ``[]`` when valid.

    Paths start at ``root`` (``value.items[2].name``), so a person or a model
    reading the list can find each bad spot.
    """
    return run(schema, value, root, _MAX_PROBLEMS)


def check(schema: Mapping[str, Any], value: object) -> Optional[str]:
    """Validate a tool's whole input; None when valid, else the problems joined by ``"; "``."""
    is_object = type(value) is dict or isinstance(value, Mapping)  # a dict skips the ABC's check
    if not is_object and schema.get("type") == "object":
        return f"input must be an object, got {json_type(value)}"
    out = run(schema, value, "" if is_object else "input", _MAX_PROBLEMS)
    return "; ".join(out) if out else None


def matches(schema: Mapping[str, Any], value: object) -> bool:
    """True when ``value`` satisfies ``schema`` (used to pick a union branch)."""
    return not run(schema, value, "value", 1)


__all__ = ["check", "compile_schema", "describe", "json_type", "matches", "problems"]
