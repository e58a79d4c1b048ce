"""Conversation value types: messages, their parts, usage, requests, replies.

Everything here is a frozen, slotted ``attrs`` class and imports nothing of
loopctl. Construction validates what a wrong caller would get wrong (an
unknown role, a tool input that is not a dict) and names the bad value.
Each type converts to and from a JSON-safe dict (``to_dict``/``from_dict``)
so records can cross processes.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional, Union

import attrs

SCHEMA_VERSION = 1


class Role(str, enum.Enum):
    """Who speaks a message; compares equal to the plain strings."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"

    def __str__(self) -> str:
        return self.value


class StopReason(str, enum.Enum):
    """Why the model stopped producing its reply."""

    END_TURN = "end_turn"
    TOOL_CALL = "tool_call"
    MAX_TOKENS = "max_tokens"
    STOP_SEQUENCE = "stop_sequence"

    def __str__(self) -> str:
        return self.value


def _to_role(value: object) -> Role:
    if isinstance(value, Role):
        return value
    try:
        return Role(value)
    except ValueError:
        raise ValueError(
            f"unknown message role {value!r}: expected one of 'system', 'user', 'assistant'"
        ) from None


def _to_stop_reason(value: object) -> StopReason:
    if isinstance(value, StopReason):
        return value
    try:
        return StopReason(value)
    except ValueError:
        names = ", ".join(repr(s.value) for s in StopReason)
        raise ValueError(f"unknown stop reason {value!r}: expected one of {names}") from None


def _check_str(field: str, value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a str, got {type(value).__name__} {value!r:.60}")


@attrs.frozen
class TextPart:
    """Plain text in a message."""

    text: str

    def __attrs_post_init__(self) -> None:
        _check_str("TextPart.text", self.text)


@attrs.frozen
class ThinkingPart:
    """Model reasoning; ``signature`` is kept so providers can replay the block."""

    text: str
    signature: Optional[str] = None


@attrs.frozen
class ToolCallPart:
    """The model asks for one tool call.

    ``invalid`` says why the call cannot run as sent (arguments that are not
    a JSON object, no tool name), in words the model can act on; the call
    then carries ``input == {}`` and is answered with that as a soft error
    result, so the model can fix its call and the run goes on.
    """

    id: str
    name: str
    input: Mapping[str, Any]
    invalid: Optional[str] = None

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.input, Mapping):
            raise TypeError(
                f"ToolCallPart.input for tool {self.name!r} must be a dict, "
                f"got {type(self.input).__name__} {self.input!r:.60}"
            )


@attrs.frozen
class ToolResultPart:
    """The outcome of one tool call, paired with it by ``tool_call_id``."""

    tool_call_id: str
    tool_name: str
    output: str
    is_error: bool = False


Part = Union[TextPart, ThinkingPart, ToolCallPart, ToolResultPart]
_PART_TYPES = (TextPart, ThinkingPart, ToolCallPart, ToolResultPart)


def _to_parts(value: Iterable[Part]) -> tuple[Part, ...]:
    parts = tuple(value)
    for p in parts:
        if not isinstance(p, _PART_TYPES):
            raise TypeError(f"message part must be a part object, got {type(p).__name__} {p!r:.60}")
    return parts


@attrs.frozen
class Message:
    """One message of a conversation: a role and its ordered parts."""

    role: Role = attrs.field(converter=_to_role)
    parts: tuple[Part, ...] = attrs.field(converter=_to_parts, default=())

    @classmethod
    def user(cls, text: str) -> Message:
        """A user message holding ``text``."""
        return cls(Role.USER, (TextPart(text),))

    @classmethod
    def system(cls, text: str) -> Message:
        """A system message holding ``text``."""
        return cls(Role.SYSTEM, (TextPart(text),))

    @classmethod
    def assistant(cls, text: str = "", tool_calls: Iterable[ToolCallPart] = ()) -> Message:
        """An assistant message with optional text and tool calls (text first)."""
        parts: list[Part] = [TextPart(text)] if text else []
        parts.extend(tool_calls)
        return cls(Role.ASSISTANT, tuple(parts))

    @classmethod
    def from_tool_results(cls, results: Iterable[ToolResultPart]) -> Message:
        """ONE user message carrying every result of a turn, in the given order."""
        return cls(Role.USER, tuple(results))

    @property
    def text(self) -> str:
        """The text parts joined with no separator (``""`` when there are none)."""
        return "".join(p.text for p in self.parts if type(p) is TextPart)

    @property
    def tool_calls(self) -> list[ToolCallPart]:
        """The tool-call parts, in order."""
        return [p for p in self.parts if type(p) is ToolCallPart]

    @property
    def tool_results(self) -> list[ToolResultPart]:
        """The tool-result parts, in order."""
        return [p for p in self.parts if type(p) is ToolResultPart]

    @property
    def thinking(self) -> list[ThinkingPart]:
        """The thinking parts, in order."""
        return [p for p in self.parts if type(p) is ThinkingPart]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (round-trips through ``from_dict``)."""
        return {"role": self.role.value, "parts": [part_to_dict(p) for p in self.parts]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Message:
        """Rebuild a message from ``to_dict`` output."""
        return cls(data["role"], tuple(part_from_dict(p) for p in data.get("parts", ())))


def part_to_dict(part: Part) -> dict[str, Any]:
    """A JSON-safe dict for one part, tagged with its ``type``."""
    if type(part) is TextPart:
        return {"type": "text", "text": part.text}
    if type(part) is ThinkingPart:
        return {"type": "thinking", "text": part.text, "signature": part.signature}
    if type(part) is ToolCallPart:
        out = {"type": "tool_call", "id": part.id, "name": part.name, "input": dict(part.input)}
        if part.invalid is not None:
            out["invalid"] = part.invalid
        return out
    if type(part) is ToolResultPart:
        return {
            "type": "tool_result",
            "tool_call_id": part.tool_call_id,
            "tool_name": part.tool_name,
            "output": part.output,
            "is_error": part.is_error,
        }
    raise TypeError(f"not a message part: {part!r:.60}")


def part_from_dict(data: Mapping[str, Any]) -> Part:
    """Rebuild one part from ``part_to_dict`` output."""
    kind = data.get("type")
    if kind == "text":
        return TextPart(data["text"])
    if kind == "thinking":
        return ThinkingPart(data["text"], data.get("signature"))
    if kind == "tool_call":
        return ToolCallPart(data["id"], data["name"], dict(data.get("input") or {}), data.get("invalid"))
    if kind == "tool_result":
        return ToolResultPart(
            data["tool_call_id"], data["tool_name"], data["output"], bool(data.get("is_error"))
        )
    raise ValueError(f"unknown message part type {kind!r}")


@attrs.frozen
class Usage:
    """Token counts a provider reported for one model call."""

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    def to_dict(self) -> dict[str, int]:
        """A JSON-safe dict."""
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Usage:
        """Rebuild from ``to_dict`` output."""
        return cls(int(data.get("input_tokens", 0)), int(data.get("output_tokens", 0)))


@attrs.frozen
class ToolSchema:
    """What the model is told about one tool: name, description, JSON Schema."""

    name: str
    description: str
    input_schema: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": dict(self.input_schema),
        }


@attrs.frozen
class RequestOptions:
    """Per-request options; a client that cannot honour one raises ``ConfigError``.

    Args:
        model: override the client's model for this request.
        max_tokens: cap on the reply's tokens.
        temperature: sampling temperature (a finite number).
        tool_choice: ``"auto"``, ``"none"``, ``"required"`` or a tool name.
        response_format: a JSON Schema the reply must follow.
        extra_body: server-specific fields merged into the request body.
    """

    model: Optional[str] = None
    max_tokens: Optional[int] = None
    temperature: Optional[float] = None
    tool_choice: Optional[str] = None
    response_format: Optional[Mapping[str, Any]] = None
    extra_body: Optional[Mapping[str, Any]] = None

    def is_empty(self) -> bool:
        """True when no option is set."""
        return self == _NO_OPTIONS  # attrs' __eq__: one tuple comparison, and it follows new fields

    def with_model(self, model: Optional[str]) -> RequestOptions:
        """A copy with the model override replaced."""
        return attrs.evolve(self, model=model)


#: A ``RequestOptions`` with nothing set (``is_empty`` compares against it).
_NO_OPTIONS = RequestOptions()


@attrs.frozen
class ModelRequest:
    """Everything one model call sends.

    ``messages`` is the full list sent (transient extras, history, pending);
    ``tools`` are the ``ToolSchema``s advertised (empty when there are none).
    """

    messages: Sequence[Message]
    system: Optional[str] = None
    tools: Sequence[ToolSchema] = ()
    options: Optional[RequestOptions] = None


@attrs.frozen
class ModelResponse:
    """One assembled model reply."""

    message: Message
    stop_reason: StopReason = attrs.field(converter=_to_stop_reason, default=StopReason.END_TURN)
    usage: Optional[Usage] = None
    model: Optional[str] = None


__all__ = [
    "Message",
    "ModelRequest",
    "ModelResponse",
    "Part",
    "RequestOptions",
    "Role",
    "StopReason",
    "TextPart",
    "ThinkingPart",
    "ToolCallPart",
    "ToolResultPart",
    "ToolSchema",
    "Usage",
    "part_from_dict",
    "part_to_dict",
]
