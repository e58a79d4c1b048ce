"""Hand-written schemas (class-based and MCP tools): every validation keyword is enforced or refuses.

The shapes are the ones pydantic and MCP servers emit: ``$defs`` and local
``$ref``, ``pattern``, ``uniqueItems``, ``multipleOf``, the combinators. A
schema the validator cannot apply refuses the input (fail closed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import pytest

from loopctl import BareLoop, Tool, ToolContext
from loopctl.testing import ScriptedClient, calls, reply
from loopctl.tools.validation import check, compile_schema


def obj(**props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props}


USER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "user": {"$ref": "#/$defs/User"},
        "id": {"type": "string", "pattern": "^[0-9]+$"},
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
    },
    "required": ["user"],
    "additionalProperties": False,
    "$defs": {
        "User": {
            "type": "object",
            "properties": {"uid": {"type": "integer"}},
            "required": ["uid"],
            "additionalProperties": False,
        }
    },
}


class Lookup(Tool):
    name = "lookup"
    description = "Look up a user by id."

    def __init__(self) -> None:
        self.ran: list[dict[str, Any]] = []

    def input_schema(self) -> Mapping[str, Any]:
        return USER_SCHEMA

    def call(self, input: Mapping[str, Any], ctx: ToolContext) -> str:
        self.ran.append(dict(input))
        return "ran"


def test_ref_pattern_and_unique_items_stop_bad_input_before_the_tool_runs() -> None:
    bad = [
        {"user": {"uid": "not-an-int", "evil": 1}},
        {"user": {"uid": 1}, "id": "../../etc/passwd"},
        {"user": {"uid": 1}, "tags": ["a", "a"]},
        {"user": {"uid": 1}, "id": "123\n"},  # "$" is the end of the text, not "before a final newline"
    ]
    good = {"user": {"uid": 1}, "id": "42", "tags": ["a", "b"]}
    tool = Lookup()
    client = ScriptedClient([calls(*[("lookup", x) for x in [*bad, good]]), reply("done")])
    with BareLoop(client, [tool]) as loop:
        loop.run("go")
    results = client.requests[1].messages[-1].tool_results
    assert [r.output for r in results] == [
        "Invalid input for tool 'lookup': field 'user.uid' must be integer, got string 'not-an-int'; "
        "unknown field 'user.evil' (allowed: uid)",
        "Invalid input for tool 'lookup': field 'id' must match the pattern '^[0-9]+$', got '../../etc/passwd'",
        "Invalid input for tool 'lookup': field 'tags' must have unique items, but items 0 and 1 are equal ('a')",
        "Invalid input for tool 'lookup': field 'id' must match the pattern '^[0-9]+$', got '123\\n'",
        "ran",
    ]
    assert tool.ran == [good]


RECURSIVE: dict[str, Any] = {
    "$ref": "#/definitions/Node",
    "definitions": {
        "Node": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "kids": {"type": "array", "items": {"$ref": "#/definitions/Node"}}},
            "required": ["name"],
        }
    },
}


def test_draft7_definitions_and_recursive_refs_name_the_deep_field() -> None:
    tree = {"name": "a", "kids": [{"name": "b", "kids": [{"name": "c"}, {"name": 5}]}]}
    assert check(RECURSIVE, tree) == "field 'kids[0].kids[1].name' must be string, got integer 5"
    assert check(RECURSIVE, {"name": "a", "kids": [{"name": "b"}]}) is None
    pointer = {"type": "object", "properties": {"a/b": {"type": "integer"}, "c": {"$ref": "#/properties/a~1b"}}}
    assert check(pointer, {"c": "x"}) == "field 'c' must be integer, got string 'x'"


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({**obj(x={"$ref": "#/$defs/A"}), "$defs": {"A": {"$ref": "#/$defs/A"}}}, "a cycle"),
        ({**obj(x={"$ref": "#/$defs/A"}), "$defs": {"A": {"anyOf": [{"$ref": "#/$defs/B"}]}, "B": {"allOf": [{"$ref": "#/$defs/A"}]}}}, "a cycle"),
        (obj(x={"$ref": "https://example.com/user.json"}), "is not a local reference"),
        (obj(x={"$ref": "#/$defs/Missing"}), "points nowhere in the schema"),
        (obj(x={"$ref": "#anchor"}), "names an anchor"),
        (obj(x={"type": "string", "pattern": "(unclosed"}), "pattern '(unclosed' does not compile"),
        (obj(x={"multipleOf": 0}), "multipleOf must be a number greater than 0"),
        (obj(x={"minimum": "5"}), "TypeError"),
        (obj(x={"type": "int"}), "names no JSON type"),  # a typo: it must never accept everything
        (obj(x={"type": ["float", "null"]}), "names no JSON type"),
        (obj(x={"type": []}), "names no JSON type"),
        (obj(x={"anyOf": []}), "anyOf must list at least one schema"),
        (obj(x={"oneOf": []}), "oneOf must list at least one schema"),
        (obj(x={"enum": "rw"}), "enum must be a list"),  # not the letters r and w
    ],
)
def test_a_schema_the_validator_cannot_apply_refuses_the_field_and_says_so(schema: dict[str, Any], says: str) -> None:
    x = "text" if "pattern" in str(schema) else 3
    message = check(schema, {"x": x})
    assert message is not None
    assert message.startswith("cannot check field 'x': the schema is invalid: ") and says in message
    assert check(schema, {}) is None  # a call that never reaches the broken spot is checked as usual
    assert compile_schema(schema)({"x": x}) is False


def test_exponential_and_too_deep_inputs_are_refused_not_hung() -> None:
    doubled = {"type": "object", "allOf": [{"properties": {"c": {"$ref": "#"}}}, {"properties": {"c": {"$ref": "#"}}}]}
    deep: dict[str, Any] = {}
    for _ in range(40):  # 2**40 paths through the schema
        deep = {"c": deep}
    message = check(doubled, deep)
    assert message is not None and "too large or too complex to check" in message
    chain = {"type": "object", "properties": {"c": {"$ref": "#"}}}
    deeper: dict[str, Any] = {}
    for _ in range(400):
        deeper = {"c": deeper}
    message = check(chain, deeper)
    assert message is not None and "nests too deeply" in message and len(message) < 300


@pytest.mark.parametrize(
    ("items", "ok"),
    [
        ([1, True], True),  # JSON's 1 and true differ
        ([0, False], True),
        ([1, 1.0], False),  # ... and 1 and 1.0 are the same number
        ([{"a": 1, "b": [2]}, {"b": [2.0], "a": 1}], False),
        ([[1], [True]], True),
        (["a", "b", None], True),
    ],
)
def test_unique_items_uses_json_equality(items: list[Any], ok: bool) -> None:
    schema = obj(l={"type": "array", "uniqueItems": True})
    assert (check(schema, {"l": items}) is None) is ok
    assert compile_schema(schema)({"l": items}) is ok
    assert check(obj(l={"type": "array", "uniqueItems": False}), {"l": items}) is None


@pytest.mark.parametrize(
    ("value", "factor", "ok"),
    [(0.3, 0.1, True), (0.7, 0.1, True), (0.31, 0.1, False), (10, 5, True), (7, 2, False), (3.0, 1, True),
     (2.5, 0.5, True), (1e308, 0.1, True), (10**30 + 1, 10**30, False), (4.02, 0.01, True), (-0.6, 0.2, True)],
)
def test_multiple_of_is_exact_for_ints_and_decimal_floats(value: float, factor: float, ok: bool) -> None:
    message = check(obj(x={"type": "number", "multipleOf": factor}), {"x": value})
    assert (message is None) is ok
    if not ok:
        assert message is not None and message.startswith("field 'x' must be a multiple of ")


def test_pattern_searches_anywhere_and_never_echoes_a_large_input() -> None:
    assert check(obj(x={"type": "string", "pattern": "[0-9]"}), {"x": "ab1cd"}) is None
    assert check(obj(x={"type": "string", "pattern": "[$]$"}), {"x": "cost $"}) is None  # "$" in a class is literal
    huge = "b" * 1_000_000
    message = check(obj(x={"type": "string", "pattern": "^a"}), {"x": huge, "k" * 100_000: 1})
    assert message is not None and message.startswith("field 'x' must match the pattern '^a', got 'bbb")
    assert len(message) < 200
    closed = {"type": "object", "additionalProperties": False}
    message = check(closed, {"k" * 100_000: 1})
    assert message is not None and len(message) < 200


@pytest.mark.parametrize(
    ("schema", "value", "expected"),
    [
        (obj(x={"const": [1]}), {"x": [True]}, "field 'x' must be [1], got [True]"),
        (obj(x={"const": {"a": 1}}), {"x": {"a": 1.0}}, None),
        (obj(x={"allOf": [{"type": "integer"}, {"minimum": 3}]}), {"x": 2}, "field 'x' must be >= 3, got 2"),
        (obj(x={"oneOf": [{"type": "number"}, {"type": "integer"}]}), {"x": 3},
         "field 'x' must be number or integer, got integer 3 (it matches 2 of the alternatives, not exactly one)"),
        (obj(x={"oneOf": [{"type": "number"}, {"type": "integer"}]}), {"x": 2.5}, None),
        (obj(x={"not": {"type": "null"}}), {"x": None}, "field 'x' must not be null, got None"),
        (obj(x={"if": {"const": "a"}, "then": {"minLength": 3}}), {"x": "a"}, "field 'x' must have at least 3 characters, got 1"),
        (obj(x={"type": "integer", "exclusiveMinimum": 0}), {"x": 0}, "field 'x' must be > 0, got 0"),
        (obj(x={"type": "integer", "minimum": 0, "exclusiveMinimum": True}), {"x": 0}, "field 'x' must be > 0, got 0"),
        (obj(x={"type": "number", "exclusiveMaximum": 1}), {"x": 1.0}, "field 'x' must be < 1, got 1.0"),
        ({"type": "object", "minProperties": 1}, {}, "the input must have at least 1 properties, got 0"),
        ({"type": "object", "maxProperties": 1}, {"a": 1, "b": 2}, "the input must have at most 1 properties, got 2"),
        ({"type": "object", "dependentRequired": {"a": ["b"]}}, {"a": 1}, "missing field 'b' (required when 'a' is given)"),
        ({"type": "object", "dependencies": {"c": {"required": ["d"]}}}, {"c": 1}, "missing required field 'd'"),
        (obj(t={"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False}),
         {"t": ["a", 1, 3]}, "field 't[2]' is not allowed"),
        (obj(t={"type": "array", "items": [{"type": "string"}], "additionalItems": False}), {"t": ["a", 2]},
         "field 't[1]' is not allowed"),
        ({"type": "object", "patternProperties": {"^x_": {"type": "integer"}}, "additionalProperties": False},
         {"x_a": "s", "y": 1}, "field 'x_a' must be integer, got string 's'; unknown field 'y' (allowed: none)"),
        ({"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}, {"Bad": 1},
         "field 'Bad': the name 'Bad' is not allowed (text matching '^[a-z]+$')"),
        (obj(t={"type": "array", "contains": {"const": "go"}}), {"t": ["a"]},
         "field 't' must contain at least 1 item(s) that are 'go', got 0"),
        (obj(x={"type": "string", "format": "email"}), {"x": "not an email"}, None),  # format is an annotation
        (obj(x=False), {"x": 1}, "field 'x' is not allowed"),
    ],
)
def test_each_keyword_is_enforced_and_names_the_field(
    schema: dict[str, Any], value: dict[str, Any], expected: Optional[str]
) -> None:
    assert check(schema, value) == expected
    assert compile_schema(schema)(value) is (expected is None)


def test_a_plain_tool_schema_keeps_the_compiled_fast_path() -> None:
    from loopctl.tools import fastcheck

    assert fastcheck._is_plain(obj(a={"type": "integer", "minimum": 0}, b={"anyOf": [{"type": "string"}, {"type": "null"}]}))
    assert not fastcheck._is_plain(obj(a={"type": "string", "pattern": "x"}))
    assert not fastcheck._is_plain(obj(a={"type": "array", "items": {"$ref": "#/$defs/A"}}))


def test_a_long_key_is_cut_in_every_message_that_names_it() -> None:
    """A model's key may be megabytes (under the argument limit): the message names a few dozen characters."""
    key = "sk-live-" + "S" * 200_000
    by_name = {"type": "object", "additionalProperties": {"type": "object", "required": ["email"]}}
    depends = {"type": "object", "dependentRequired": {key: ["other"]}}
    for schema, value in ((by_name, {key: {}}), (depends, {key: 1})):
        message = check(schema, value)
        assert message is not None and len(message) < 400, (len(message or ""), (message or "")[:200])


def test_required_as_a_string_refuses_instead_of_reading_it_letter_by_letter() -> None:
    schema = {"type": "object", "required": "path"}
    for value in ({"path": 1}, {"p": 1, "a": 1, "t": 1, "h": 1}):
        message = check(schema, value)
        assert message is not None and "required must be a list" in message
        assert compile_schema(schema)(value) is False


def test_nan_within_no_bound_on_either_path() -> None:
    nan = float("nan")
    for schema in ({"type": "number", "minimum": 0, "maximum": 100}, {"exclusiveMinimum": 0},
                   {"exclusiveMaximum": 0}, {"maximum": 1}):
        assert check(obj(pct=schema), {"pct": nan}) is not None, schema
        assert compile_schema(obj(pct=schema))({"pct": nan}) is False, schema


def test_nan_or_infinity_anywhere_in_parsed_arguments_is_refused() -> None:
    from types import MappingProxyType

    from loopctl.providers.base import tool_call_part

    for args in ({"xs": (float("nan"),)}, {"x": MappingProxyType({"y": float("inf")})}, {"x": [[(-float("inf"),)]]}):
        part = tool_call_part("c1", "t", args)
        assert part.invalid is not None and "NaN and infinities" in part.invalid, args


def test_an_enum_reads_the_value_once_not_once_per_option(monkeypatch: pytest.MonkeyPatch) -> None:
    import loopctl.tools.jsonvalues as jsonvalues

    calls_made = [0]
    real = jsonvalues.json_key

    def counting(value: object) -> object:
        calls_made[0] += 1
        return real(value)

    monkeypatch.setattr(jsonvalues, "json_key", counting)
    value = {"level": list(range(2_000))}
    schema = obj(level={"enum": list(range(100))})
    assert check(schema, value) is not None
    assert compile_schema(schema)(value) is False
    assert calls_made[0] < 10_000  # about (2,000 + 100) per path; once per option would be 200,000

