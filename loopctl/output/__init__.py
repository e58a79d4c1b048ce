"""Typed output: the schema of an answer type, its wire forms, and reading a
reply into a validated value.

Pure: no IO, no threads. ``OutputSpec.of(T)`` compiles an answer type (an
attrs class, a dataclass, a ``TypedDict``, an ``Enum`` or ``Literal``,
``list[...]`` of those, ``int``/``float``/``str``/``bool``, or a JSON Schema
dict) with the same machinery as tool schemas; ``read_reply`` turns a
reply's text into that type or into a list of problems the model is shown
when it is asked again.
"""

from __future__ import annotations

from loopctl.output.check import OutputCheck
from loopctl.output.reading import (
    OutputReading,
    feedback_text,
    read_final_calls,
    read_reply,
    read_value,
)
from loopctl.output.spec import FINAL_TOOL, OUTPUT_MODES, OutputSpec, rebuild_value

__all__ = [
    "FINAL_TOOL",
    "OUTPUT_MODES",
    "OutputCheck",
    "OutputReading",
    "OutputSpec",
    "feedback_text",
    "read_final_calls",
    "read_reply",
    "read_value",
    "rebuild_value",
]
