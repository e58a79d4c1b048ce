"""Refreshers: a tool source updates the registry before each model turn, never mid-phase."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytest

from loopctl import BareLoop
from loopctl.testing import ScriptedClient, call, reply
from loopctl.tools import Tool, ToolRegistry, tool
from loopctl.tools.base import ToolContext, ToolOutput


@tool
def first() -> str:
    """The tool every run starts with."""
    return "first ran"


@tool
def second() -> str:
    """A tool the source adds during the run."""
    return "second ran"


def test_a_tool_added_by_a_refresher_is_offered_and_callable_at_the_next_turn() -> None:
    registry = ToolRegistry([first])
    seen: list[frozenset[str]] = []

    def source(reg: ToolRegistry) -> None:
        seen.append(reg.name_set())
        if len(seen) == 2:  # the second turn: the source has a new list
            reg.register(second)
            reg.unregister("first")

    registry.add_refresher(source)
    client = ScriptedClient([call("first"), call("second"), call("first"), reply("end")])
    with BareLoop(client, registry) as loop:
        run = loop.run("go")
    assert run.output == "end"
    assert [[t.name for t in r.tools] for r in client.requests] == [["first"], ["second"], ["second"], ["second"]]
    results = [(r.tool_name, r.output, r.is_error) for m in loop.conversation() for r in m.tool_results]
    assert results == [
        ("first", "first ran", False),
        ("second", "second ran", False),
        ("first", "tool 'first' is not available", True),  # gone from the list: the brain says so
    ]
    assert len(seen) == 4  # once per model turn


def test_a_refresher_that_raises_is_logged_and_the_run_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    registry = ToolRegistry([first])

    def broken(reg: ToolRegistry) -> None:
        raise RuntimeError("source down")

    registry.add_refresher(broken)
    with caplog.at_level(logging.ERROR, logger="loopctl"):
        with BareLoop(ScriptedClient([call("first"), reply("ok")]), registry) as loop:
            assert loop.run("go").output == "ok"
    assert "tool refresher" in caplog.text and "source down" in caplog.text


def test_unregister_says_whether_there_was_a_tool() -> None:
    registry = ToolRegistry([first])
    assert registry.unregister("first") and not registry.unregister("first")
    assert registry.schemas() == ()


def test_the_name_set_is_shared_until_the_tools_change_and_follows_every_change() -> None:
    registry = ToolRegistry([first])
    names = registry.name_set()
    assert registry.name_set() is names  # cached: every run of the loop shares one
    registry.register(second)
    assert registry.name_set() == {"first", "second"}
    registry.unregister("first")
    assert registry.name_set() == {"second"}
    assert not registry.unregister("first")  # nothing removed: the cached set stays right
    assert registry.name_set() == {"second"}


def test_a_source_replacing_its_gated_tool_keeps_the_gate_and_the_application_may_lift_its_own() -> None:
    class Sourced(Tool):
        def __init__(self, source: object, description: str) -> None:
            self.name, self.description, self.source = "pay", description, source

        def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
            return ToolOutput("paid")

    server = object()
    registry = ToolRegistry([Sourced(server, "v1")])
    registry.get("pay").requires_approval = True  # type: ignore[union-attr]
    v2 = registry.register(Sourced(server, "v2"))
    assert v2.requires_approval and registry.has_approval_tools
    registry.unregister("pay")
    registry.register(Sourced(None, "local"))
    registry.get("pay").requires_approval = True  # type: ignore[union-attr]
    assert not registry.register(Sourced(None, "local, ungated")).requires_approval
