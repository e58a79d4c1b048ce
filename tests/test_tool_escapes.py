"""A ``BaseException`` from a tool is handled the same alone and in a parallel wave.

``KeyboardInterrupt`` cancels the run ("interrupted"); ``SystemExit`` and
``GeneratorExit`` are soft errors naming the exception; never an empty
success, never "internal error".
"""

from __future__ import annotations

from typing import Any

import pytest
from support import join_threads

from loopctl import BareLoop, Cancelled, ParallelDispatch, RunConfig, Tool, ToolContext
from loopctl.testing import ScriptedClient, calls, reply

WAVE = RunConfig(parallel=ParallelDispatch("parallel", 4))


class Raises(Tool):
    name = "boom"
    description = "Raises what it is given."
    concurrency_safe = True

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def call(self, input: Any, ctx: ToolContext) -> str:
        raise self.exc


class Fine(Tool):
    name = "fine"
    description = "Answers."
    concurrency_safe = True

    def call(self, input: Any, ctx: ToolContext) -> str:
        return "fine"


def script(shape: str) -> list[Any]:
    first = calls(("boom", {})) if shape == "alone" else calls(("boom", {}), ("fine", {}))
    return [first, reply("went on"), reply("next run")]


@pytest.mark.parametrize("shape", ["alone", "wave"])
@pytest.mark.parametrize("exc", [SystemExit(3), GeneratorExit("closed")], ids=["SystemExit", "GeneratorExit"])
def test_system_exit_and_generator_exit_are_soft_errors_naming_them(shape: str, exc: BaseException) -> None:
    client = ScriptedClient(script(shape))
    with BareLoop(client, [Raises(exc), Fine()]) as loop:
        assert loop.run("go", WAVE).output == "went on"
    results = client.requests[1].messages[-1].tool_results
    boom = results[0]
    assert boom.is_error and type(exc).__name__ in boom.output and "boom" in boom.output
    if shape == "wave":
        assert (results[1].output, results[1].is_error) == ("fine", False)
    join_threads("loopctl-", check=False)


@pytest.mark.parametrize("shape", ["alone", "wave"])
def test_keyboard_interrupt_in_a_tool_cancels_the_run(shape: str) -> None:
    client = ScriptedClient(script(shape)[:1] + [reply("next run")])
    with BareLoop(client, [Raises(KeyboardInterrupt()), Fine()]) as loop:
        with pytest.raises(Cancelled) as info:
            loop.run("go", WAVE)
        assert info.value.reason == "interrupted"
        assert len(client.requests) == 1  # the model never got an (empty) result
        assert not loop.is_cancelled()
        assert loop.run("again", WAVE).output == "next run"  # one cancel, one run
    join_threads("loopctl-", check=False)
