"""An answer type compiled once: its JSON Schema, converter and wire forms.

Objects travel as they are. Any other answer (a number, a list, an enum) is
wrapped as ``{"result": ...}`` on the wire, because the native structured
output modes and tool inputs take an object at the top; reading unwraps it.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from typing import Any, Optional

import attrs

from loopctl.errors import ConfigError
from loopctl.messages import ToolSchema
from loopctl.tools.schema import Compiled, compile_annotation, summary, type_name
from loopctl.tools.schemacheck import check_schema
from loopctl.tools.validation import problems

#: How the answer's shape reaches the model: the server's structured output,
#: a final-answer tool, or instructions in the system prompt.
OUTPUT_MODES = ("native", "tool", "prompt")

#: The final-answer tool's name in ``"tool"`` mode.
FINAL_TOOL = "final_answer"

_WRAP_KEY = "result"
# Keywords OpenAI's strict mode accepts; anything else makes us send strict=false.
_STRICT_KEYWORDS = frozenset(
    {"type", "properties", "required", "additionalProperties", "items", "enum", "const",
     "anyOf", "description", "title", "$defs", "$ref"}
)


@attrs.frozen
class OutputSpec:
    """A compiled answer type.

    Attributes:
        type: what the caller asked for (a type, or a JSON Schema dict).
        name: a short name for the schema on the wire (``[A-Za-z0-9_-]``).
        schema: the JSON Schema of the answer itself.
        wrapped: the wire carries ``{"result": answer}`` (non-object answers).
        strict_problem: why OpenAI's strict mode cannot take the schema, or None.
    """

    type: object
    name: str
    description: str
    schema: Mapping[str, Any]
    wrapped: bool
    strict_problem: Optional[str]
    _compiled: Compiled = attrs.field(repr=False)

    @classmethod
    def of(cls, output_type: object) -> OutputSpec:
        """Compile ``output_type``.

        Raises:
            ConfigError: the type is not supported, naming it; a schema dict
                the validator could not apply somewhere, naming the place
                and the bad value.
        """
        if isinstance(output_type, OutputSpec):
            return output_type
        if isinstance(output_type, Mapping):
            schema = copy.deepcopy(dict(output_type))
            # Checked whole now: the validator would only find a broken spot
            # while checking an answer, after the model was asked (and asked again).
            check_schema(schema, "output_type schema")
            compiled = Compiled(schema)
            name = _wire_name(str(schema.get("title") or "answer"))
            description = str(schema.get("description") or "")
        else:
            compiled = compile_annotation(output_type, f"output_type {type_name(output_type)}")
            name = _wire_name(getattr(output_type, "__name__", "") or "answer")
            description = summary(getattr(output_type, "__doc__", None)) if isinstance(output_type, type) else ""
            schema = compiled.schema
        wrapped = schema.get("type") != "object"
        wire = _wrap(schema) if wrapped else schema
        return cls(output_type, name, description, schema, wrapped, _strict_problem(wire, "answer"), compiled)

    @property
    def wire_schema(self) -> dict[str, Any]:
        """The object schema sent to the model (the answer, wrapped when not an object)."""
        return _wrap(self.schema) if self.wrapped else dict(self.schema)

    def response_format(self) -> dict[str, Any]:
        """The OpenAI-style ``json_schema`` response format (strict when the schema allows)."""
        return {
            "type": "json_schema",
            "json_schema": {
                "name": self.name,
                "schema": self.wire_schema,
                "strict": self.strict_problem is None,
            },
        }

    def final_tool(self) -> ToolSchema:
        """The final-answer tool advertised in ``"tool"`` mode."""
        what = f" ({self.description})" if self.description else ""
        return ToolSchema(
            FINAL_TOOL,
            f"Give your final answer{what}. Call this exactly once, when you are done; "
            "its input is the answer.",
            self.wire_schema,
        )

    def instructions(self) -> str:
        """The system-prompt text for ``"prompt"`` mode."""
        return (
            "When you give your final answer, reply with only a JSON value (no prose, no code "
            "fence) that follows this JSON Schema:\n" + json.dumps(self.wire_schema, sort_keys=True)
        )

    def from_json(self, value: object) -> object:
        """The caller's type rebuilt from its JSON form (``records.json_form``).

        A value that does not fit the schema (an older type, a hand-edited
        record) comes back as it is: a stored answer is never lost.
        """
        if value is None or problems(self.schema, value):
            return value
        try:
            return self.convert({_WRAP_KEY: value} if self.wrapped else value)
        except Exception:  # the user's class refused it: keep the JSON
            return value

    def convert(self, value: object) -> object:
        """The validated wire value as the caller's type (unwrapped)."""
        if self.wrapped and isinstance(value, Mapping):
            value = value.get(_WRAP_KEY)
        conv = self._compiled.convert
        return value if conv is None else conv(value)


def rebuild_value(output_type: object, value: object) -> object:
    """A stored answer's JSON form as ``output_type`` where it can be built, else as it is.

    For an answer that crossed a process boundary (``Run.from_dict``): a
    schema dict or an unimportable type (None) leaves it as JSON.
    """
    if output_type is None or value is None or isinstance(output_type, Mapping):
        return value
    try:
        spec = OutputSpec.of(output_type)
    except ConfigError:
        return value
    return spec.from_json(value)


def _wrap(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``{"result": schema}`` as an object schema, its local ``$ref`` pointers still pointing where they did.

    The answer's ``$defs`` (``definitions``) move to the top, where a
    ``#/$defs/...`` pointer looks and where providers expect them; any other
    local pointer gains the wrapper's path.
    """
    inner = dict(schema)
    defs = {key: inner.pop(key) for key in _DEFS_KEYS if key in inner}
    return {
        "type": "object",
        "properties": {_WRAP_KEY: _moved_refs(inner)},
        "required": [_WRAP_KEY],
        "additionalProperties": False,
        **{key: _moved_refs(value) for key, value in defs.items()},
    }


_DEFS_KEYS = ("$defs", "definitions")
# Keywords whose value holds data, not schemas: a "$ref" key in there is a value.
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})
# Keywords whose value maps names to schemas: the names are not keywords.
_NAMED_SCHEMAS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def _moved_refs(node: Any) -> Any:
    """Schema ``node`` with each local ``$ref`` outside the definitions prefixed by the wrapper's path."""
    if isinstance(node, list):
        return [_moved_refs(item) for item in node]
    if not isinstance(node, Mapping):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str):
            out[key] = _moved_ref(value)
        elif key in _DATA_KEYWORDS:
            out[key] = value
        elif key in _NAMED_SCHEMAS and isinstance(value, Mapping):
            out[key] = {name: _moved_refs(sub) for name, sub in value.items()}
        else:
            out[key] = _moved_refs(value)
    return out


def _moved_ref(ref: str) -> str:
    if ref != "#" and not ref.startswith("#/"):
        return ref  # not a pointer into this schema
    if any(ref.startswith(f"#/{key}/") for key in _DEFS_KEYS):
        return ref
    return f"#/properties/{_WRAP_KEY}{ref[1:]}"


def _wire_name(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64]
    return cleaned or "answer"


def _strict_problem(schema: object, path: str) -> Optional[str]:
    """The first construct OpenAI's strict mode refuses, named with its path; None if none."""
    if not isinstance(schema, Mapping):
        return None
    for key in schema:
        if key not in _STRICT_KEYWORDS and key != "default":
            return f"{path}: keyword {key!r} is not allowed in strict mode"
    if schema.get("type") == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        if schema.get("additionalProperties", True) is not False:
            return f"{path}: an object that allows extra keys is not allowed in strict mode"
        missing = [k for k in props if k not in (schema.get("required") or ())]
        if missing:
            return f"{path}: optional property {missing[0]!r} (strict mode needs every property required)"
        for k, sub in props.items():
            found = _strict_problem(sub, f"{path}.{k}")
            if found:
                return found
    if "default" in schema:
        return f"{path}: keyword 'default' is not allowed in strict mode"
    items = schema.get("items")
    if items is not None:
        found = _strict_problem(items, f"{path}[]")
        if found:
            return found
    for i, branch in enumerate(schema.get("anyOf") or ()):
        found = _strict_problem(branch, f"{path}(anyOf {i})")
        if found:
            return found
    return None


__all__ = ["FINAL_TOOL", "OUTPUT_MODES", "OutputSpec", "rebuild_value"]
