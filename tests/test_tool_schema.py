"""Schemas built by ``@tool`` from type hints: golden dicts, and refusals."""

from __future__ import annotations

import enum
import typing
from typing import Any, Dict, List, Literal, Optional, Union

import attrs
import pytest

from loopctl import ConfigError, ToolContext
from loopctl.messages import ToolSchema
from loopctl.tools import tool


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@attrs.define
class Point:
    """A point on the plane.

    Attributes:
        x: horizontal position.
        y: vertical position.
    """

    x: int
    y: float = 0.0


POINT_SCHEMA = {  # the golden schema of ``Point``
    "type": "object",
    "description": "A point on the plane.",
    "properties": {
        "x": {"type": "integer", "description": "horizontal position."},
        "y": {"type": "number", "description": "vertical position.", "default": 0.0},
    },
    "required": ["x"],
    "additionalProperties": False,
}


@attrs.define
class Shape:
    """A named polygon."""

    name: str
    points: list[Point]
    color: Optional[Color] = None
    tags: list[str] = attrs.field(factory=list)


@attrs.define
class Node:
    """A tree node (recursive: not supported)."""

    children: list[Node]


def prop(annotation: Any, **options: Any) -> dict[str, Any]:
    """The property schema of a one-parameter tool ``f(x: annotation)``."""

    def f(x):  # type: ignore[no-untyped-def]
        """Probe."""

    f.__annotations__ = {"x": annotation}
    t = tool(f, **options)
    return dict(t.schema().input_schema["properties"]["x"])


@pytest.mark.parametrize(
    "annotation, expected",
    [
        (str, {"type": "string"}),
        (int, {"type": "integer"}),
        (float, {"type": "number"}),
        (bool, {"type": "boolean"}),
        (type(None), {"type": "null"}),
        (None, {"type": "null"}),
        (Any, {}),
        (list, {"type": "array"}),
        (dict, {"type": "object"}),
        (Optional[int], {"anyOf": [{"type": "integer"}, {"type": "null"}]}),
        (Union[int, str], {"anyOf": [{"type": "integer"}, {"type": "string"}]}),
        (Union[int, str, None], {"anyOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}]}),
        (list[int], {"type": "array", "items": {"type": "integer"}}),
        (List[str], {"type": "array", "items": {"type": "string"}}),
        (list[Any], {"type": "array"}),
        (list[list[bool]], {"type": "array", "items": {"type": "array", "items": {"type": "boolean"}}}),
        (dict[str, float], {"type": "object", "additionalProperties": {"type": "number"}}),
        (Dict[str, List[int]], {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "integer"}}}),
        (dict[str, Any], {"type": "object"}),
        (Literal["a", "b"], {"type": "string", "enum": ["a", "b"]}),
        (Literal[1, 2, 3], {"type": "integer", "enum": [1, 2, 3]}),
        (Literal["a", 1], {"enum": ["a", 1]}),
        (Literal[True], {"type": "boolean", "enum": [True]}),
        (Color, {"type": "string", "enum": ["red", "green"]}),
        (Level, {"type": "integer", "enum": [1, 2]}),
        (Optional[Color], {"anyOf": [{"type": "string", "enum": ["red", "green"]}, {"type": "null"}]}),
        (typing.Annotated[int, "how many"], {"type": "integer", "description": "how many"}),
        (
            Point,
            POINT_SCHEMA,
        ),
    ],
    ids=repr,
)
def test_annotation_maps_to_golden_schema(annotation: Any, expected: dict[str, Any]) -> None:
    assert prop(annotation) == expected


def test_nested_attrs_classes_compile_recursively() -> None:
    assert prop(Shape) == {
        "type": "object",
        "description": "A named polygon.",
        "properties": {
            "name": {"type": "string"},
            "points": {"type": "array", "items": POINT_SCHEMA},
            "color": {
                "anyOf": [{"type": "string", "enum": ["red", "green"]}, {"type": "null"}],
                "default": None,
            },
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["name", "points"],
        "additionalProperties": False,
    }


def test_whole_tool_schema_is_golden() -> None:
    @tool(concurrency_safe=True)
    def search(
        query: str,
        ctx: ToolContext,
        limit: int = 10,
        mode: Literal["fast", "deep"] = "fast",
        color: Color = Color.RED,
        since: Optional[str] = None,
    ) -> list[str]:
        """Search the index.

        Finds documents that match.

        Args:
            query: what to look for.
            limit: the most results
                to return.
            mode: how hard to look.

        Returns:
            The matching titles.
        """
        return []

    assert search.schema() == ToolSchema(
        "search",
        "Search the index.\n\nFinds documents that match.",
        {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "what to look for."},
                "limit": {"type": "integer", "description": "the most results to return.", "default": 10},
                "mode": {"type": "string", "enum": ["fast", "deep"], "description": "how hard to look.", "default": "fast"},
                "color": {"type": "string", "enum": ["red", "green"], "default": "red"},
                "since": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
    )


def test_required_follows_parameter_order_and_defaults_are_optional() -> None:
    @tool
    def f(z: int, a: str, m: bool, k: int = 1, b: Optional[int] = None) -> None:
        """F."""

    schema = f.schema().input_schema
    assert schema["required"] == ["z", "a", "m"]
    assert list(schema["properties"]) == ["z", "a", "m", "k", "b"]


def test_none_default_makes_the_parameter_optional_on_every_python() -> None:
    @tool
    def f(x: int = None) -> None:  # type: ignore[assignment]
        """F."""

    assert f.schema().input_schema["properties"]["x"] == {
        "anyOf": [{"type": "integer"}, {"type": "null"}],
        "default": None,
    }


def test_var_keyword_lets_the_schema_accept_extra_fields() -> None:
    @tool
    def loose(a: int, **rest: Any) -> None:
        """Loose."""

    @tool
    def typed_rest(a: int, **rest: int) -> None:
        """Typed rest."""

    assert loose.schema().input_schema["additionalProperties"] is True
    assert typed_rest.schema().input_schema["additionalProperties"] == {"type": "integer"}


def test_sphinx_param_descriptions_are_read() -> None:
    @tool
    def f(a: int, b: str) -> None:
        """Do f.

        :param a: the first.
        :param str b: the second.
        """

    props = f.schema().input_schema["properties"]
    assert f.description == "Do f."
    assert props["a"]["description"] == "the first."
    assert props["b"]["description"] == "the second."


def test_python39_style_string_annotations_resolve() -> None:
    # This module uses ``from __future__ import annotations``: every hint is a string.
    @tool
    def f(a: list[int], b: Dict[str, List[Point]], c: Optional[Level] = None) -> None:
        """F."""

    props = f.schema().input_schema["properties"]
    assert props["a"] == {"type": "array", "items": {"type": "integer"}}
    assert props["b"]["additionalProperties"]["items"]["properties"]["x"]["type"] == "integer"
    assert props["c"]["anyOf"][0] == {"type": "integer", "enum": [1, 2]}


# -- refusals at decoration time -----------------------------------------------------


@pytest.mark.parametrize(
    "annotation, fragment",
    [
        (set[int], "unsupported type set[int]"),
        (tuple[int, int], "unsupported type tuple[int, int]"),
        (bytes, "unsupported type bytes"),
        (object, "unsupported type object"),
        (dict[int, str], "dict keys must be str"),
        (list[set[int]], "parameter 'x' (list item): unsupported type set[int]"),
        (Literal[1.5j], "Literal values must be str, int, float, bool or None"),  # type: ignore[valid-type]
        (Node, "refers to itself"),
    ],
    ids=repr,
)
def test_unsupported_annotation_fails_at_decoration(annotation: Any, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        prop(annotation)
    assert fragment in str(info.value)
    assert "tool 'f'" in str(info.value)


def test_missing_annotation_is_refused() -> None:
    def f(a, b: int):  # type: ignore[no-untyped-def]
        """F."""

    with pytest.raises(ConfigError, match=r"tool 'f', parameter 'a': has no type annotation"):
        tool(f)


def test_method_self_gets_a_hint_to_subclass_tool() -> None:
    class Holder:
        def f(self, a: int) -> None:
            """F."""

    with pytest.raises(ConfigError, match=r"parameter 'self'.*subclass Tool"):
        tool(Holder.f)


def test_undefined_name_in_a_string_hint_is_refused_clearly() -> None:
    def f(a: Undefined) -> None:  # type: ignore[name-defined]  # noqa: F821
        """F."""

    with pytest.raises(ConfigError, match=r"tool 'f': cannot evaluate the type hints: name 'Undefined'"):
        tool(f)


def test_positional_only_and_var_positional_are_refused() -> None:
    def star(*items: int) -> None:
        """F."""

    with pytest.raises(ConfigError, match=r"keyword arguments only"):
        tool(star)


def test_empty_enum_is_refused() -> None:
    class Empty(enum.Enum):
        pass

    with pytest.raises(ConfigError, match="has no members"):
        prop(Empty)
