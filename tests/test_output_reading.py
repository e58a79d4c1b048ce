"""Typed output, the pure part: answer types compile to schemas, replies read into values.

Every type kind SPEC §14 names, and every bad answer the issue lists (prose,
extra or missing fields, wrong types, a truncated object, the final-answer
tool called twice), read without a model.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any, Literal, Optional, TypedDict

import attrs
import pytest

from loopctl.errors import ConfigError
from loopctl.output import OutputSpec, feedback_text, read_final_calls, read_reply


@attrs.frozen
class City:
    """A city and its country.

    Attributes:
        name: the city's name.
        population: people living there.
    """

    name: str
    population: int


@dataclasses.dataclass
class Point:
    """A point on a plane."""

    x: float
    y: float


class Movie(TypedDict):
    title: str
    year: int


class Mood(enum.Enum):
    HAPPY = "happy"
    SAD = "sad"


KINDS = [
    pytest.param(City, '{"name": "Paris", "population": 2100000}', City("Paris", 2100000), id="attrs"),
    pytest.param(Point, '{"x": 1, "y": 2.5}', Point(1.0, 2.5), id="dataclass"),
    pytest.param(Movie, '{"title": "Alien", "year": 1979}', {"title": "Alien", "year": 1979}, id="typeddict"),
    pytest.param(Mood, '{"result": "sad"}', Mood.SAD, id="enum"),
    pytest.param(Literal["yes", "no"], '{"result": "no"}', "no", id="literal"),
    pytest.param(list[City], '{"result": [{"name": "Rome", "population": 3}]}', [City("Rome", 3)], id="list-of-attrs"),
    pytest.param(int, '{"result": 42}', 42, id="int"),
    pytest.param(str, '{"result": "hi"}', "hi", id="str"),
    pytest.param(bool, '{"result": true}', True, id="bool"),
    pytest.param(
        {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
        '{"n": 3}',
        {"n": 3},
        id="json-schema-dict",
    ),
]


@pytest.mark.parametrize(("output_type", "text", "expected"), KINDS)
def test_every_type_kind_reads_a_fitting_reply_into_an_instance(output_type: object, text: str, expected: object) -> None:
    spec = OutputSpec.of(output_type)
    reading = read_reply(spec, text)
    assert reading.ok, reading.errors
    assert reading.value == expected
    assert type(reading.value) is type(expected)


def test_objects_travel_as_they_are_and_other_answers_are_wrapped() -> None:
    assert not OutputSpec.of(City).wrapped
    assert OutputSpec.of(City).wire_schema["properties"]["population"]["description"] == "people living there."
    wrapped = OutputSpec.of(list[City]).wire_schema
    assert wrapped["required"] == ["result"] and wrapped["properties"]["result"]["type"] == "array"


def test_a_model_that_forgot_the_wrapper_is_taken_at_its_word() -> None:
    assert read_reply(OutputSpec.of(int), "42").value == 42
    assert read_reply(OutputSpec.of(str), "plain words, no JSON").value == "plain words, no JSON"


@pytest.mark.parametrize(
    ("output_type", "text", "problem"),
    [
        (float, "NaN", "NaN is not a JSON number"),
        (float, '{"result": Infinity}', "Infinity is not a JSON number"),
        (float, "-Infinity", "-Infinity is not a JSON number"),
        (float, "1e999", "1e999 is too large for a number"),
        (Point, '{"x": 1, "y": NaN}', "NaN is not a JSON number"),
        ({"type": "object", "properties": {"x": {"type": "number"}}}, '{"x": -1e400}', "-1e400 is too large for a number"),
    ],
    ids=["nan", "infinity-wrapped", "minus-infinity", "overflow", "nan-field", "overflow-in-schema-dict"],
)
def test_nan_infinity_and_an_overflowing_number_are_not_json_numbers(
    output_type: object, text: str, problem: str
) -> None:
    reading = read_reply(OutputSpec.of(output_type), text)
    assert not reading.ok
    assert reading.errors == (f"the reply is not valid JSON: {problem}; it began {text!r}",)


@pytest.mark.parametrize(
    "text",
    ["42", "true", "null", "NaN", "[1] Oslo is the capital", '{"city": "Oslo"}', "{braces} in prose",
     '{"result": "Oslo", "also": 1}', "[" * 100 + " deep prose"],
)
def test_a_text_answer_that_reads_as_other_json_is_the_text_as_written(text: str) -> None:
    reading = read_reply(OutputSpec.of(str), text)
    assert reading.ok, reading.errors
    assert reading.value == text
    assert read_reply(OutputSpec.of(str), f"```\n{text}\n```").value == text


def test_a_text_answer_as_a_json_string_or_in_the_wrapper_is_unwrapped() -> None:
    assert read_reply(OutputSpec.of(str), '"quoted"').value == "quoted"
    assert read_reply(OutputSpec.of(str), '{"result": "42"}').value == "42"


def test_a_text_answer_in_a_wrapper_that_does_not_fit_or_parse_is_refused() -> None:
    spec = OutputSpec.of(str)
    assert read_reply(spec, '{"result": 42}').errors == ("field 'value' must be string, got integer 42",)
    cut = read_reply(spec, '{"result": "Oslo is the cap', truncated=True)
    assert not cut.ok and "cut off at max_tokens" in cut.errors[0]
    nan = read_reply(spec, '{ "result" : NaN}')
    assert not nan.ok and "NaN is not a JSON number" in nan.errors[0]
    cut_string = read_reply(spec, '"Oslo is the cap', truncated=True)  # a JSON string begun and cut off
    assert not cut_string.ok and "cut off at max_tokens" in cut_string.errors[0]


def test_a_text_answer_taken_as_written_must_still_fit_its_choices() -> None:
    spec = OutputSpec.of(Literal["yes", "no"])
    assert read_reply(spec, "no").value == "no"
    reading = read_reply(spec, "42")
    assert not reading.ok and "'42'" in reading.errors[0]


def test_a_code_fence_around_the_json_is_accepted() -> None:
    reading = read_reply(OutputSpec.of(City), '```json\n{"name": "Oslo", "population": 7}\n```')
    assert reading.value == City("Oslo", 7)


def test_prose_is_refused_with_the_json_error_and_the_start_of_the_text() -> None:
    reading = read_reply(OutputSpec.of(City), "Paris has about two million people.")
    assert not reading.ok
    assert "not valid JSON" in reading.errors[0] and "Paris has" in reading.errors[0]


def test_extra_missing_and_wrong_typed_fields_are_each_named_with_their_path() -> None:
    reading = read_reply(OutputSpec.of(City), '{"name": 7, "mayor": "x"}')
    text = "\n".join(reading.errors)
    assert not reading.ok
    assert "missing required field 'value.population'" in text
    assert "field 'value.name' must be string" in text
    assert "unknown field 'value.mayor'" in text


def test_nested_paths_name_the_list_index() -> None:
    reading = read_reply(OutputSpec.of(list[City]), '{"result": [{"name": "a", "population": "many"}]}')
    assert reading.errors == ("field 'value[0].population' must be integer, got string 'many'",)


def test_a_truncated_object_says_it_was_cut_off_at_max_tokens() -> None:
    reading = read_reply(OutputSpec.of(City), '{"name": "Par', truncated=True)
    assert not reading.ok and "cut off at max_tokens" in reading.errors[0]


def test_absurd_nesting_is_refused_without_recursion_error() -> None:
    reading = read_reply(OutputSpec.of(dict), "[" * 100_000 + "]" * 100_000)
    assert not reading.ok and "nested more than" in reading.errors[0]


def test_an_empty_reply_is_refused() -> None:
    assert read_reply(OutputSpec.of(City), "  ").errors == ("the reply is empty: answer with a JSON value",)


def test_the_final_answer_tool_called_twice_in_one_reply_is_refused() -> None:
    spec = OutputSpec.of(City)
    one = {"name": "a", "population": 1}
    assert read_final_calls(spec, [one]).value == City("a", 1)
    twice = read_final_calls(spec, [one, one])
    assert not twice.ok and "called 2 times" in twice.errors[0]


def test_a_class_whose_own_validator_rejects_the_fields_is_a_problem_not_a_crash() -> None:
    @attrs.frozen
    class Positive:
        n: int = attrs.field(validator=attrs.validators.gt(0))

    reading = read_reply(OutputSpec.of(Positive), '{"n": -1}')
    assert not reading.ok and "could not be built" in reading.errors[0]


def test_strict_mode_is_used_when_the_schema_allows_and_the_blocker_is_named_when_not() -> None:
    assert OutputSpec.of(City).response_format()["json_schema"]["strict"] is True

    @attrs.frozen
    class WithOptional:
        a: int
        b: Optional[int] = None

    spec = OutputSpec.of(WithOptional)
    assert spec.response_format()["json_schema"]["strict"] is False
    assert spec.strict_problem is not None and "'b'" in spec.strict_problem


def test_unsupported_types_are_refused_naming_the_type() -> None:
    with pytest.raises(ConfigError, match="set"):
        OutputSpec.of(set)


def test_feedback_lists_every_problem_and_says_how_to_answer() -> None:
    text = feedback_text(["missing required field 'value.a'", "x"], "tool")
    assert "- missing required field 'value.a'" in text and "final_answer" in text
    assert "only the corrected JSON" in feedback_text(["x"], "native")


def test_the_final_tool_and_prompt_instructions_carry_the_wire_schema() -> None:
    spec = OutputSpec.of(Point)
    assert spec.final_tool().input_schema == spec.wire_schema
    assert json.dumps(spec.wire_schema, sort_keys=True) in spec.instructions()


@pytest.mark.parametrize(
    "schema",
    [
        {  # definitions at the answer's top, as hand-written schemas keep them
            "type": "array",
            "items": {"$ref": "#/$defs/Item"},
            "$defs": {"Item": {"type": "object", "properties": {"n": {"type": "integer"}, "next": {"$ref": "#/$defs/Item"}},
                               "required": ["n"]}},
        },
        {  # a pointer into the answer itself
            "type": "array",
            "items": {"type": "object", "properties": {"n": {"type": "integer"}, "kids": {"$ref": "#"}}, "required": ["n"]},
        },
        {  # properties named like keywords that hold data
            "type": "array",
            "items": {"type": "object", "properties": {"n": {"type": "integer"}, "default": {"$ref": "#"},
                                                       "enum": {"$ref": "#"}}, "required": ["n"]},
        },
    ],
)
def test_a_wrapped_answers_pointers_still_point_where_they_did(schema: dict[str, Any]) -> None:
    from loopctl.tools.schemacheck import check_schema
    from loopctl.tools.validation import problems

    wire = OutputSpec.of(schema).wire_schema
    check_schema(wire, "the wire schema")  # no pointer leads nowhere
    good = {"result": [{"n": 1, "next": {"n": 2}, "kids": [{"n": 3}], "default": [{"n": 4}], "enum": [{"n": 5}]}]}
    bad = {"result": [{"n": 1, "next": {"n": "two"}, "kids": [{"n": "three"}], "default": [{"n": "four"}],
                       "enum": [{"n": "five"}]}]}
    assert problems(wire, good) == []
    assert problems(wire, bad)  # the nested answer is still checked, not a pointer to nowhere
    assert "$defs" not in wire["properties"]["result"]  # moved to the top, not copied
