"""Input validation and conversion before the call: exact soft-error texts."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Literal, Optional, Union

import attrs
import pytest

from loopctl import Tool, ToolContext, ToolOutput
from loopctl.tools import tool
from loopctl.tools.validation import check, describe


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


@attrs.define
class Point:
    """A point."""

    x: int
    y: int = 0


def make_recorder() -> tuple[Any, list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    @tool
    def paint(
        name: str,
        count: int,
        ratio: float,
        color: Color,
        mode: Literal["fill", "stroke"],
        at: Point,
        path: list[Point],
        weights: dict[str, float],
        note: Optional[str] = None,
        flag: bool = False,
        either: Union[int, Color, None] = None,
    ) -> str:
        """Paint something."""
        seen.append(
            dict(
                name=name, count=count, ratio=ratio, color=color, mode=mode, at=at,
                path=path, weights=weights, note=note, flag=flag, either=either,
            )
        )
        return "ok"

    return paint, seen


GOOD: dict[str, Any] = {
    "name": "n",
    "count": 2,
    "ratio": 1,
    "color": "green",
    "mode": "fill",
    "at": {"x": 1, "y": 2},
    "path": [{"x": 3.0}],
    "weights": {"a": 2},
}


def invoke(t: Tool, input: Mapping[str, Any]) -> ToolOutput:
    return t.invoke(input, None)  # type: ignore[arg-type]


def test_valid_input_is_converted_to_the_declared_types() -> None:
    paint, seen = make_recorder()
    out = invoke(paint, {**GOOD, "either": "red"})
    assert out == ToolOutput("ok")
    (args,) = seen
    assert args["color"] is Color.GREEN
    assert args["at"] == Point(1, 2)
    assert args["path"] == [Point(3, 0)]
    assert type(args["path"][0].x) is int  # 3.0 from JSON becomes int
    assert type(args["ratio"]) is float and args["ratio"] == 1.0
    assert args["weights"] == {"a": 2.0} and type(args["weights"]["a"]) is float
    assert args["either"] is Color.RED
    assert args["note"] is None and args["flag"] is False


def test_union_picks_the_first_matching_branch() -> None:
    paint, seen = make_recorder()
    invoke(paint, {**GOOD, "either": 7})
    assert seen[-1]["either"] == 7


@pytest.mark.parametrize(
    "change, message",
    [
        ({"count": "two"}, "field 'count' must be integer, got string 'two'"),
        ({"count": True}, "field 'count' must be integer, got boolean True"),
        ({"count": 2.5}, "field 'count' must be integer, got number 2.5"),
        ({"ratio": "1"}, "field 'ratio' must be number, got string '1'"),
        ({"name": None}, "field 'name' must be string, got null None"),
        ({"color": "blue"}, "field 'color' must be one of 'red', 'green', got 'blue'"),
        ({"mode": "paint"}, "field 'mode' must be one of 'fill', 'stroke', got 'paint'"),
        ({"at": [1, 2]}, "field 'at' must be object, got array [1, 2]"),
        ({"at": {"y": 1}}, "missing required field 'at.x' (integer)"),
        ({"at": {"x": "1"}}, "field 'at.x' must be integer, got string '1'"),
        ({"at": {"x": 1, "z": 0}}, "unknown field 'at.z' (allowed: x, y)"),
        ({"path": [{"x": 1}, {"x": "b"}]}, "field 'path[1].x' must be integer, got string 'b'"),
        ({"weights": {"a": "heavy"}}, "field 'weights.a' must be number, got string 'heavy'"),
        ({"note": 5}, "field 'note' must be string or null, got integer 5"),
        ({"flag": "yes"}, "field 'flag' must be boolean, got string 'yes'"),
        ({"either": "blue"}, "field 'either' must be integer or one of 'red', 'green' or null, got string 'blue'"),
        ({"extra": 1}, "unknown field 'extra' (allowed: name, count, ratio, color, mode, at, path, weights, note, flag, either)"),
    ],
    ids=lambda v: repr(v)[:40],
)
def test_violation_is_a_soft_error_naming_field_and_type(change: dict[str, Any], message: str) -> None:
    paint, seen = make_recorder()
    out = invoke(paint, {**GOOD, **change})
    assert out == ToolOutput.error(f"Invalid input for tool 'paint': {message}")
    assert seen == []  # the tool was not called


def test_missing_required_fields_are_all_named_in_order() -> None:
    paint, seen = make_recorder()
    out = invoke(paint, {"name": "n", "count": 1, "ratio": 1.0, "color": "red", "mode": "fill", "weights": {}})
    assert out.text == (
        "Invalid input for tool 'paint': missing required field 'at' (object); "
        "missing required field 'path' (array)"
    )
    assert seen == []


def test_non_object_input_is_refused() -> None:
    paint, _ = make_recorder()
    assert invoke(paint, [1, 2]).text == "Invalid input for tool 'paint': input must be an object, got array"  # type: ignore[arg-type]


def test_at_most_five_problems_are_reported() -> None:
    @tool
    def many(a: int, b: int, c: int, d: int, e: int, f: int, g: int) -> None:
        """Many."""

    out = invoke(many, {})
    assert out.text.count("missing required field") == 5


def test_extra_fields_reach_var_keyword_converted() -> None:
    got: dict[str, Any] = {}

    @tool
    def collect(a: int, **rest: Color) -> str:
        """Collect."""
        got.update(rest, a=a)
        return "ok"

    assert invoke(collect, {"a": 1, "p": "red"}) == ToolOutput("ok")
    assert got == {"a": 1, "p": Color.RED}
    assert invoke(collect, {"a": 1, "p": "pink"}).text == (
        "Invalid input for tool 'collect': field 'p' must be one of 'red', 'green', got 'pink'"
    )


def test_attrs_validator_failure_is_an_invalid_input_error() -> None:
    @attrs.define
    class Positive:
        """Positive."""

        n: int = attrs.field(validator=attrs.validators.gt(0))

    @tool
    def f(p: Positive) -> str:
        """F."""
        return "ran"

    out = invoke(f, {"p": {"n": -1}})
    assert out.is_error
    assert out.text.startswith("Invalid input for tool 'f': ValueError: ")


def test_context_parameter_is_injected_and_cannot_be_sent() -> None:
    got: list[Any] = []

    @tool
    def f(a: int, ctx: ToolContext) -> str:
        """F."""
        got.append(ctx)
        return "ok"

    marker = object()
    assert f.invoke({"a": 1}, marker) == ToolOutput("ok")  # type: ignore[arg-type]
    assert got == [marker]
    assert "ctx" not in f.schema().input_schema["properties"]
    assert f.invoke({"a": 1, "ctx": 3}, marker).text == (  # type: ignore[arg-type]
        "Invalid input for tool 'f': unknown field 'ctx' (allowed: a)"
    )


class StatefulCounter(Tool):
    """A class-based tool: its hand-written schema drives validation."""

    name = "counter"
    description = "Count by a step."

    def __init__(self) -> None:
        self.total = 0

    def input_schema(self) -> Mapping[str, Any]:
        return {
            "type": "object",
            "properties": {"step": {"type": "integer", "minimum": 1, "maximum": 10}},
            "required": ["step"],
        }

    def call(self, input: Mapping[str, Any], ctx: ToolContext) -> Any:
        self.total += input["step"]
        return {"total": self.total}


def test_class_based_tool_is_validated_against_its_schema() -> None:
    t = StatefulCounter()
    assert invoke(t, {"step": 2}) == ToolOutput('{"total": 2}')
    assert invoke(t, {"step": 3, "note": "extra allowed: no additionalProperties"}) == ToolOutput('{"total": 5}')
    assert invoke(t, {"step": 0}).text == "Invalid input for tool 'counter': field 'step' must be >= 1, got 0"
    assert invoke(t, {"step": 11}).text == "Invalid input for tool 'counter': field 'step' must be <= 10, got 11"
    assert invoke(t, {}).text == "Invalid input for tool 'counter': missing required field 'step' (integer)"
    assert t.total == 5


def test_schema_checker_keywords() -> None:
    assert check({"type": "object", "properties": {"s": {"type": "string", "minLength": 2}}}, {"s": "a"}) == (
        "field 's' must have at least 2 characters, got 1"
    )
    assert check({"type": "object", "properties": {"l": {"type": "array", "maxItems": 1}}}, {"l": [1, 2]}) == (
        "field 'l' must have at most 1 items, got 2"
    )
    assert check({"type": "object", "properties": {"c": {"const": "x"}}}, {"c": "y"}) == "field 'c' must be 'x', got 'y'"
    assert check({"type": "object", "properties": {"n": {"type": ["integer", "null"]}}}, {"n": None}) is None
    # JSON's 1 and true differ even though Python's 1 == True.
    assert check({"type": "object", "properties": {"e": {"enum": [1]}}}, {"e": True}) == (
        "field 'e' must be one of 1, got True"
    )
    assert describe({"oneOf": [{"type": "integer"}, {"enum": ["a"]}]}) == "integer or one of 'a'"


def _random_value(rng: Any, depth: int = 0) -> Any:
    kinds = ["str", "int", "float", "intfloat", "bool", "none", "enum"] + (["list", "dict"] if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "str":
        return rng.choice(["", "a", "red", "green", "fill", "x" * 12])
    if kind == "int":
        return rng.randrange(-3, 12)
    if kind == "float":
        return rng.choice([0.5, -1.25, 2.0])
    if kind == "intfloat":
        return float(rng.randrange(0, 4))
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "none":
        return None
    if kind == "enum":
        return rng.choice(["stroke", 1, True])
    if kind == "list":
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["name", "count", "ratio", "color", "mode", "at", "path", "weights", "x", "y", "step", "zz"]
    return {rng.choice(keys): _random_value(rng, depth + 1) for _ in range(rng.randrange(5))}


def test_fast_validator_accepts_exactly_what_check_accepts() -> None:
    import random

    from loopctl.tools.validation import compile_schema

    paint, _ = make_recorder()
    schemas = [
        paint.schema().input_schema,
        StatefulCounter().input_schema(),
        {"type": "object", "properties": {"x": {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": "string"}}]}}},
        {"type": "object", "additionalProperties": {"type": "number", "minimum": 0}},
        {"type": "object", "properties": {"x": {"type": ["string", "null"], "maxLength": 3}, "y": {"const": 1}}},
        {"type": "object", "properties": {"path": {"type": "array", "minItems": 1, "items": {"enum": [1, True, "stroke"]}}}},
    ]
    rng = random.Random(7)
    agreed = {True: 0, False: 0}
    for schema in schemas:
        fast = compile_schema(schema)
        for _ in range(3000):
            value = _random_value(rng)
            if rng.random() < 0.5:  # start from a valid input and perturb one field
                value = {**GOOD, **(value if isinstance(value, dict) else {})}
            ok = check(schema, value) is None
            assert fast(value) == ok, (schema, value)
            agreed[ok] += 1
    assert agreed[True] > 100 and agreed[False] > 100  # both sides were exercised
