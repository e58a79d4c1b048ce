"""Reading a reply into the answer type: parse, validate, convert.

A reply that does not parse or fit gives problems with paths
(``field 'value.items[0].qty' must be integer, got string 'two'``) for the
model to fix when it is asked again. Reading never raises for anything a
model can send: prose, a code fence, a cut-off object, absurd nesting.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import attrs

from loopctl.output.spec import FINAL_TOOL, OutputSpec
from loopctl.text import MAX_JSON_DEPTH, json_depth_exceeds, loads_strict, masked_head
from loopctl.tools.validation import problems

#: Replies nested deeper than this are refused as answers (json's recursion is no judge).
MAX_DEPTH = MAX_JSON_DEPTH
_SHOWN = 200
# How the wire's {"result": ...} wrapper begins.
_WRAPPER_START = re.compile(r'\{\s*"result"\s*:')


@attrs.frozen
class OutputReading:
    """What a reply read as: ``ok`` with ``value``, or ``errors`` to show the model."""

    ok: bool
    value: object = None
    errors: tuple[str, ...] = ()
    text: str = ""


def _fail(text: str, *errors: str) -> OutputReading:
    return OutputReading(False, None, tuple(errors), text)


def _strip_fence(text: str) -> str:
    t = text.strip()
    if t.startswith("```"):
        first_nl = t.find("\n")
        body = t[first_nl + 1 :] if first_nl >= 0 else ""
        if body.rstrip().endswith("```"):
            body = body.rstrip()[:-3]
        return body.strip()
    return t


def _short(text: str) -> str:
    return text if len(text) <= _SHOWN else masked_head(text, _SHOWN) + "..."


def read_reply(spec: OutputSpec, text: str, truncated: bool = False) -> OutputReading:
    """Read a final reply's text (native or prompt mode) into ``spec``'s type.

    The JSON is read strictly (``NaN``, ``Infinity`` and a number too large
    for a float are not JSON numbers), as a tool's arguments are. A text
    answer (a string schema) that is neither a JSON string nor the
    ``{"result": ...}`` wrapper is the reply's text as written: ``42``,
    ``null`` or ``[1] in prose`` are answers too.

    Args:
        spec: the compiled answer type.
        text: the reply's text.
        truncated: the reply stopped at ``max_tokens`` (named in the problem).
    """
    body = _strip_fence(text)
    if not body:
        return _fail(text, "the reply is empty: answer with a JSON value")
    value, problem = _decode(body)
    if spec.schema.get("type") == "string" and not _is_json_text_answer(value, problem, body):
        return read_value(spec, body, text, unwrapped=True)
    if problem is not None:
        cut = " (the reply was cut off at max_tokens; answer more briefly)" if truncated else ""
        return _fail(text, f"{problem}{cut}; it began {_short(body)!r}")
    return read_value(spec, value, text)


def _decode(body: str) -> tuple[object, Optional[str]]:
    """``body`` decoded as strict JSON, or None and the problem."""
    if json_depth_exceeds(body, MAX_DEPTH):
        return None, f"the reply is nested more than {MAX_DEPTH} levels deep"
    try:
        return loads_strict(body), None
    except ValueError as exc:  # NotJSONNumber included: NaN is no answer any outlet can write
        return None, f"the reply is not valid JSON: {exc}"


def _is_json_text_answer(value: object, problem: Optional[str], body: str) -> bool:
    """Whether a reply to a text answer is JSON to read (a string, the wrapper), not the text itself."""
    if problem is not None:
        # The wrapper or a JSON string begun and broken (cut off, a NaN inside) is
        # refused, not taken as prose with a stray quote.
        return body.startswith('"') or _WRAPPER_START.match(body) is not None
    return isinstance(value, str) or (isinstance(value, Mapping) and set(value) == {"result"})


def read_value(spec: OutputSpec, value: object, text: str, unwrapped: bool = False) -> OutputReading:
    """Validate and convert an already decoded value (a final-answer tool's input, say)."""
    if spec.wrapped and not unwrapped:
        if isinstance(value, Mapping) and set(value) == {"result"}:
            value = value["result"]
        # A model that forgot the wrapper but sent a fitting answer is taken at its word.
    found = problems(spec.schema, value)
    if found:
        return _fail(text, *found)
    try:
        converted = spec.convert({"result": value} if spec.wrapped else value)
    except Exception as exc:  # a user's class rejected the fields (its own validators)
        return _fail(text, f"the answer could not be built: {type(exc).__name__}: {_short(str(exc))}")
    return OutputReading(True, converted, (), text)


def read_final_calls(spec: OutputSpec, inputs: Sequence[Mapping[str, Any]]) -> OutputReading:
    """Read the final-answer tool's calls of one reply (tool mode): exactly one is an answer."""
    text = json.dumps(inputs[0], ensure_ascii=False, sort_keys=True) if inputs else ""
    if len(inputs) != 1:
        return _fail(text, f"{FINAL_TOOL} was called {len(inputs)} times in one reply; call it exactly once")
    return read_value(spec, inputs[0], text)


def feedback_text(errors: Sequence[str], mode: str) -> str:
    """The message that asks the model again, listing what was wrong."""
    listed = "\n".join(f"- {e}" for e in errors) or "- (no details)"
    how = (
        f"Call {FINAL_TOOL} again with corrected input."
        if mode == "tool"
        else "Reply again with only the corrected JSON answer."
    )
    return f"Your answer does not fit the required format:\n{listed}\n{how}"


def short_text(text: Optional[str]) -> str:
    """``text`` cut for an error message."""
    return _short(text or "")


__all__ = ["MAX_DEPTH", "OutputReading", "feedback_text", "read_final_calls", "read_reply", "read_value"]
