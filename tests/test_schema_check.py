"""A schema checked whole before it is used: every fault the validator would meet, named by its place.

``check_schema`` (``loopctl.tools.schemacheck``) is what typed answers go
through before anything is sent; the validator itself only meets a broken
spot when an input reaches it.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

import pytest
from output_types import City, Color, Movie, Note, Point

from loopctl import ConfigError
from loopctl.demo.tools import demo_tools
from loopctl.tools import tool
from loopctl.tools.schemacheck import check_schema, schema_fault
from loopctl.tools.validation import check

NO_TYPE = "names no JSON type (array, boolean, integer, null, number, object, string)"


@pytest.mark.parametrize(("schema", "where", "words"), [
    ({"type": "nonsense"}, "#/type", f"type 'nonsense' {NO_TYPE}"),
    ({"type": "object", "properties": {"n": {"type": "integr"}}}, "#/properties/n/type", "type 'integr'"),
    ({"type": []}, "#/type", "type []"),
    ({"type": ["string", 3]}, "#/type", "type ['string', 3]"),
    ({"items": {"items": [{"type": "string"}, {"type": "int"}]}}, "#/items/items/1/type", "type 'int'"),
    ({"prefixItems": [{"anyOf": [{"type": "float"}]}]}, "#/prefixItems/0/anyOf/0/type", "type 'float'"),
    ({"$defs": {"A": {"type": "bogus"}}}, "#/$defs/A/type", "type 'bogus'"),
    ({"properties": {"a/b~": {"type": "zz"}}}, "#/properties/a~1b~0/type", "type 'zz'"),
    ({"dependencies": {"a": ["b"], "c": {"type": "z"}}}, "#/dependencies/c/type", "type 'z'"),
    ({"contains": {"minimum": "x"}}, "#/contains/minimum", "minimum must be a finite number, got string 'x'"),
    ({"properties": {"a": 3}}, "#/properties/a", "a schema must be an object or a bool, got integer 3"),
    ({"properties": []}, "#/properties", "properties must be an object, got array []"),
    ({"enum": "abc"}, "#/enum", "enum must be a list, got string 'abc'"),
    ({"enum": []}, "#/enum", "enum must list at least one value"),
    ({"required": "a"}, "#/required", "required must be a list, got string 'a'"),
    ({"required": ["a", 1]}, "#/required/1", "required must list property names, got 1"),
    ({"dependentRequired": {"a": "b"}}, "#/dependentRequired/a", "must list property names, got 'b'"),
    ({"anyOf": []}, "#/anyOf", "anyOf must list at least one schema"),
    ({"oneOf": {}}, "#/oneOf", "oneOf must list at least one schema"),
    ({"prefixItems": {}}, "#/prefixItems", "prefixItems must be a list of schemas"),
    ({"minLength": -1}, "#/minLength", "minLength must be a whole number >= 0, got -1"),
    ({"maxItems": 2.5}, "#/maxItems", "maxItems must be a whole number >= 0, got 2.5"),
    ({"minimum": float("nan")}, "#/minimum", "minimum must be a finite number, got number nan"),
    ({"exclusiveMaximum": "1"}, "#/exclusiveMaximum", "exclusiveMaximum must be a finite number"),
    ({"multipleOf": 0}, "#/multipleOf", "multipleOf must be a finite number greater than 0, got 0"),
    ({"uniqueItems": "yes"}, "#/uniqueItems", "uniqueItems must be true or false, got 'yes'"),
    ({"pattern": "("}, "#/pattern", "pattern '(' does not compile"),
    ({"patternProperties": {"(": {}}}, "#/patternProperties/(", "pattern '(' does not compile"),
    ({"$ref": "#/$defs/A"}, "#/$ref", "$ref '#/$defs/A' points nowhere in the schema"),
    ({"$ref": "https://example.com/s.json"}, "#/$ref", "is not a local reference"),
    ({"$ref": "#"}, "#/$ref", "$ref '#' leads back to itself without reading any input (a cycle)"),
    ({"anyOf": [{"type": "null"}, {"$ref": "#"}]}, "#/anyOf/1/$ref", "$ref '#' leads back to itself"),
    ({"$defs": {"A": {"allOf": [{"$ref": "#/$defs/B"}]}, "B": {"not": {"$ref": "#/$defs/A"}}},
      "properties": {"x": {"$ref": "#/$defs/A"}}}, "/$ref", "leads back to itself"),
])
def test_a_broken_spot_anywhere_is_named_with_its_place_and_value(schema: dict[str, Any], where: str, words: str) -> None:
    found = schema_fault(schema)
    assert found is not None
    assert found[0].endswith(where) and words in found[1], found
    with pytest.raises(ConfigError) as info:
        check_schema(schema, "output_type schema")
    assert str(info.value).startswith(f"output_type schema is not a valid JSON Schema: at {found[0]}, ")


TREE: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}},
    "required": ["name"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("schema", [
    True,
    False,
    {},
    TREE,
    {"$defs": {"User": {"type": "object", "properties": {"uid": {"type": "integer"}}}},
     "type": "object", "properties": {"user": {"$ref": "#/$defs/User"}}},
    {"definitions": {"N": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"next": {"$ref": "#/definitions/N"}}}]}},
     "$ref": "#/definitions/N"},
    {"type": ["integer", "null"], "minimum": 0, "exclusiveMaximum": 10.5, "multipleOf": 0.5},
    {"type": "number", "minimum": 0, "exclusiveMinimum": True},  # the draft-4 flag
    {"type": "array", "items": [{"type": "string"}], "additionalItems": False, "minItems": 1.0},
    {"type": "string", "pattern": "^[a-z]+$", "format": "email", "x-anything": {"type": "not checked"}},
    {"if": {"type": "string"}, "then": {"minLength": 1}, "else": False},
    {"type": "object", "patternProperties": {"^x-": {"type": "string"}}, "propertyNames": {"maxLength": 8},
     "dependentRequired": {"a": ["b"]}, "dependentSchemas": {"c": {"required": ["d"]}}},
    {"type": "array", "contains": {"const": 1}, "minContains": 1, "maxContains": 2, "uniqueItems": True},
])
def test_schemas_the_validator_can_apply_pass(schema: Any) -> None:
    assert schema_fault(schema) is None
    check_schema(schema, "s")


def test_a_schema_that_holds_itself_through_an_item_is_recursive_not_broken() -> None:
    node: dict[str, Any] = {"type": "array"}
    node["items"] = node  # a Python object, not JSON: each level reads one more item
    assert schema_fault(node) is None
    loop: dict[str, Any] = {"type": "array"}
    loop["allOf"] = [loop]  # the same value, for ever
    assert schema_fault(loop) == ("#/allOf/0", "the schema contains itself without reading any input (a cycle)")


def test_a_deep_schema_is_checked_without_recursion() -> None:
    schema: dict[str, Any] = {}
    node = schema
    for _ in range(20_000):
        node["items"] = {}
        node = node["items"]
    node["type"] = "str"
    found = schema_fault(schema)
    assert found is not None and "type 'str'" in found[1] and found[0].endswith("...")  # the pointer is cut


def test_every_fault_found_here_is_one_the_validator_refuses_at() -> None:
    # The checker runs ahead of the validator: where the validator would
    # refuse a value because the schema is broken, the checker says so first.
    for schema, value in [
        ({"type": "object", "properties": {"n": {"type": "integr"}}}, {"n": 1}),
        ({"$ref": "#"}, 1),
        ({"properties": {"a": {"pattern": "("}}}, {"a": "x"}),
        ({"anyOf": []}, 1),
        ({"multipleOf": -1}, 2),
    ]:
        assert schema_fault(schema) is not None
        problem = check(schema, value)
        assert problem is not None and "the schema is invalid" in problem, (schema, problem)


def test_the_schemas_made_from_type_hints_pass() -> None:
    @tool
    def plan(city: City, at: Point, notes: list[Note], movie: Optional[Movie], color: Color,
             mood: Literal["happy", "sad"] = "happy", counts: Optional[dict[str, int]] = None) -> str:
        """Plan a trip."""
        return ""

    assert schema_fault(plan.input_schema()) is None
    for made in demo_tools():  # hand-written ones
        assert schema_fault(made.input_schema()) is None, made.name
