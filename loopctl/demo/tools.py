"""The demo tools the ``loopctl`` command gives its agent: add, multiply, lookup.

They are ordinary ``Tool`` subclasses with hand-written JSON Schemas and
validation, so they double as an example of a stateful tool. All three are
read-only and concurrency-safe, so calls of one turn run in parallel.
``lookup`` reads a small bundled table (approximate figures, for demos
only). A ``delay`` makes every call wait that long first — on the run's
cancel signal, never ``time.sleep`` — so a demo or a terminal test has time
to type guidance or press Ctrl-C while a tool is running.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional, Union

from loopctl.tools.base import Tool, ToolContext, ToolError

Number = Union[int, float]

#: Fields every row of ``TABLE`` has, in display order.
FIELDS: tuple[str, ...] = ("capital", "population", "area_km2", "currency", "continent")

#: The bundled lookup table: country -> field -> value (approximate, mid-2020s).
TABLE: dict[str, dict[str, Union[str, int]]] = {
    "France": {"capital": "Paris", "population": 68_400_000, "area_km2": 551_695,
               "currency": "euro", "continent": "Europe"},
    "Germany": {"capital": "Berlin", "population": 84_500_000, "area_km2": 357_588,
                "currency": "euro", "continent": "Europe"},
    "Spain": {"capital": "Madrid", "population": 48_600_000, "area_km2": 505_990,
              "currency": "euro", "continent": "Europe"},
    "Italy": {"capital": "Rome", "population": 58_900_000, "area_km2": 302_068,
              "currency": "euro", "continent": "Europe"},
    "Japan": {"capital": "Tokyo", "population": 124_500_000, "area_km2": 377_975,
              "currency": "yen", "continent": "Asia"},
    "India": {"capital": "New Delhi", "population": 1_428_600_000, "area_km2": 3_287_263,
              "currency": "rupee", "continent": "Asia"},
    "Brazil": {"capital": "Brasilia", "population": 203_100_000, "area_km2": 8_515_767,
               "currency": "real", "continent": "South America"},
    "Canada": {"capital": "Ottawa", "population": 40_100_000, "area_km2": 9_984_670,
               "currency": "Canadian dollar", "continent": "North America"},
    "Kenya": {"capital": "Nairobi", "population": 55_100_000, "area_km2": 580_367,
              "currency": "Kenyan shilling", "continent": "Africa"},
    "Australia": {"capital": "Canberra", "population": 26_600_000, "area_km2": 7_692_024,
                  "currency": "Australian dollar", "continent": "Oceania"},
}


def format_number(value: Number) -> str:
    """A number as the tools print it: integral values without a decimal point."""
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e16:
            return str(int(value))
        return f"{value:.12g}"
    return str(value)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _DemoTool(Tool):
    """Shared plumbing: the optional cancel-aware delay."""

    concurrency_safe = True
    read_only = True

    def __init__(self, delay: float = 0.0) -> None:
        if not _is_number(delay) or delay < 0:
            raise ValueError(f"delay must be a number >= 0, got {delay!r}")
        self.delay = float(delay)

    def _pause(self, ctx: ToolContext) -> None:
        if self.delay > 0 and ctx.cancel.wait(self.delay):
            raise ToolError("cancelled while running")


class _BinaryTool(_DemoTool):
    """A tool over two numbers ``a`` and ``b``."""

    verb = ""

    def input_schema(self) -> Mapping[str, Any]:
        """Two required numbers ``a`` and ``b``."""
        return {
            "type": "object",
            "properties": {
                "a": {"type": "number", "description": "the first number"},
                "b": {"type": "number", "description": "the second number"},
            },
            "required": ["a", "b"],
            "additionalProperties": False,
        }

    def validate(self, input: Mapping[str, Any]) -> Optional[str]:
        """Both ``a`` and ``b`` must be present and numbers (not booleans)."""
        for key in ("a", "b"):
            if key not in input:
                return f"missing required field {key!r}"
            if not _is_number(input[key]):
                return f"field {key!r} must be a number, got {input[key]!r:.40}"
        extra = sorted(set(input) - {"a", "b"})
        if extra:
            return f"unexpected field {extra[0]!r}"
        return None

    def compute(self, a: Number, b: Number) -> Number:
        """The operation itself."""
        raise NotImplementedError

    def call(self, input: Mapping[str, Any], ctx: ToolContext) -> str:
        """Wait the optional delay, then compute."""
        self._pause(ctx)
        return format_number(self.compute(input["a"], input["b"]))


class AddTool(_BinaryTool):
    """``add(a, b)``: the sum of two numbers."""

    name = "add"
    description = "Add two numbers and return the sum. Subtract by adding a negative number."

    def compute(self, a: Number, b: Number) -> Number:
        """``a + b``."""
        return a + b


class MultiplyTool(_BinaryTool):
    """``multiply(a, b)``: the product of two numbers."""

    name = "multiply"
    description = "Multiply two numbers and return the product."

    def compute(self, a: Number, b: Number) -> Number:
        """``a * b``."""
        return a * b


class LookupTool(_DemoTool):
    """``lookup(name, field)``: one fact about a country from a small bundled table."""

    name = "lookup"

    def __init__(
        self, table: Optional[Mapping[str, Mapping[str, Union[str, int]]]] = None, delay: float = 0.0
    ) -> None:
        super().__init__(delay)
        self.table: dict[str, dict[str, Union[str, int]]] = {
            k: dict(v) for k, v in (table if table is not None else TABLE).items()
        }
        fields: list[str] = []
        for row in self.table.values():
            fields.extend(f for f in row if f not in fields)
        self.fields = tuple(fields)
        self.description = (
            "Look up one fact about a country in a small table (approximate figures). "
            f"Fields: {', '.join(self.fields)}; population is a head count, area in km2."
        )

    def input_schema(self) -> Mapping[str, Any]:
        """``name`` and ``field``, each one of the table's values."""
        return {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": sorted(self.table), "description": "the country"},
                "field": {"type": "string", "enum": list(self.fields), "description": "the fact"},
            },
            "required": ["name", "field"],
            "additionalProperties": False,
        }

    def validate(self, input: Mapping[str, Any]) -> Optional[str]:
        """Both fields present, strings, and known to the table (case-insensitive)."""
        for key in ("name", "field"):
            if key not in input:
                return f"missing required field {key!r}"
            if not isinstance(input[key], str):
                return f"field {key!r} must be a string, got {input[key]!r:.40}"
        if self._row_key(input["name"]) is None:
            known = ", ".join(sorted(self.table))
            return f"field 'name' has unknown value {input['name']!r:.40} (known: {known})"
        if input["field"].lower() not in self.fields:
            return (
                f"field 'field' has unknown value {input['field']!r:.40} "
                f"(known: {', '.join(self.fields)})"
            )
        return None

    def _row_key(self, name: str) -> Optional[str]:
        wanted = name.strip().lower()
        return next((k for k in self.table if k.lower() == wanted), None)

    def call(self, input: Mapping[str, Any], ctx: ToolContext) -> str:
        """Wait the optional delay, then read the table."""
        self._pause(ctx)
        key = self._row_key(input["name"])
        if key is None:  # validate() normally catches this
            raise ToolError(f"no entry for {input['name']!r}")
        value = self.table[key].get(input["field"].lower())
        if value is None:
            raise ToolError(f"{key} has no field {input['field']!r}")
        return value if isinstance(value, str) else format_number(value)


def demo_tools(delay: float = 0.0) -> list[Tool]:
    """Fresh ``add``, ``multiply`` and ``lookup`` tools.

    Args:
        delay: seconds each call waits (on the cancel signal) before answering.
    """
    return [AddTool(delay), MultiplyTool(delay), LookupTool(delay=delay)]


DEMO_TOOL_NAMES: Sequence[str] = ("add", "multiply", "lookup")

__all__ = [
    "DEMO_TOOL_NAMES",
    "FIELDS",
    "TABLE",
    "AddTool",
    "LookupTool",
    "MultiplyTool",
    "demo_tools",
    "format_number",
]
