"""Typed answers on the driver's side: the mode a run asks in, and its requests.

A run with ``RunConfig.output_type`` compiles the type once when it is
launched (a bad type is a ``ConfigError`` before anything is sent) and
picks how the answer's shape reaches the model: ``RunConfig.output_mode``
or the client's first ``output_modes`` entry (a client without the
attribute gets ``"tool"``, which any server that speaks tools can follow).
Each request of the run is then shaped for that mode: ``"native"`` sets
``response_format``, ``"tool"`` adds the ``final_answer`` tool and asks
for a tool call, ``"prompt"`` appends the instructions to the system prompt.
The reading and the re-asking are the machine's (``OutputCheck``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import attrs

from loopctl.config import RunConfig
from loopctl.errors import ConfigError
from loopctl.messages import ModelRequest, RequestOptions, ToolSchema
from loopctl.output import FINAL_TOOL, OUTPUT_MODES, OutputCheck, OutputSpec

#: The mode a client without ``output_modes`` gets: any tool-calling server follows it.
DEFAULT_MODE = "tool"


def client_output_mode(client: object) -> str:
    """The client's preferred mode: the first of its ``output_modes``, else ``"tool"``."""
    modes = getattr(client, "output_modes", None)
    if isinstance(modes, (tuple, list)) and modes and modes[0] in OUTPUT_MODES:
        return str(modes[0])
    return DEFAULT_MODE


def answer_check(config: RunConfig, client: object, tool_names: frozenset[str]) -> Optional[OutputCheck]:
    """The run's ``OutputCheck``, or None when it wants plain text.

    Raises:
        ConfigError: the answer type is not supported, or a tool of the loop
            is named like the final-answer tool in ``"tool"`` mode.
    """
    if config.output_type is None:
        return None
    spec = OutputSpec.of(config.output_type)
    mode = config.output_mode or client_output_mode(client)
    if mode == "tool" and FINAL_TOOL in tool_names:
        raise ConfigError(
            f"a tool is named {FINAL_TOOL!r}, which output_mode 'tool' needs for the answer; "
            "rename the tool or pick another output_mode"
        )
    return OutputCheck(spec, mode, config.output_retries)


def shape_options(check: Optional[OutputCheck], options: Optional[RequestOptions]) -> Optional[RequestOptions]:
    """The loop's request options with what the answer's mode needs merged in."""
    if check is None:
        return options
    base = options if options is not None else RequestOptions()
    if check.mode == "native":
        return attrs.evolve(base, response_format=check.spec.response_format())
    if check.mode == "tool":
        # Other tools may still be called first; a bare text reply is not an answer.
        return attrs.evolve(base, tool_choice="required")
    return options


def answer_tools(check: Optional[OutputCheck], schemas: Sequence[ToolSchema]) -> Sequence[ToolSchema]:
    """The tools advertised: the loop's, plus ``final_answer`` in ``"tool"`` mode."""
    if check is None or check.mode != "tool":
        return schemas
    return (*schemas, check.spec.final_tool())


def answer_system(check: Optional[OutputCheck], system: Optional[str]) -> Optional[str]:
    """The system prompt, with the answer's instructions appended in ``"prompt"`` mode."""
    if check is None or check.mode != "prompt":
        return system
    text = check.spec.instructions()
    return f"{system}\n\n{text}" if system else text


def shape_request(check: Optional[OutputCheck], request: ModelRequest) -> ModelRequest:
    """``request`` with the final-answer tool or the instructions added (options are merged earlier)."""
    if check is None or check.mode == "native":
        return request
    if check.mode == "tool":
        return attrs.evolve(request, tools=answer_tools(check, request.tools))
    return attrs.evolve(request, system=answer_system(check, request.system))


__all__ = [
    "DEFAULT_MODE",
    "answer_check",
    "answer_system",
    "answer_tools",
    "client_output_mode",
    "shape_options",
    "shape_request",
]
