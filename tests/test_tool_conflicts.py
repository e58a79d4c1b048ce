"""No silent replacement: local and MCP tools (real MCP servers) never swap behind the user's back."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from support import WAIT

from loopctl import BareLoop, tool
from loopctl.observers import ApprovalRequested, Observer
from loopctl.testing import ScriptedClient, call, reply
from loopctl.tools import ToolConflict, ToolRegistry

pytest.importorskip("mcp")  # the [mcp] extra needs Python >= 3.10

from loopctl.contrib.mcp import MCPServer  # noqa: E402

NAMES = str(Path(__file__).resolve().parent / "mcp_servers" / "names_server.py")


def names_server(names: str, name: str = "names") -> MCPServer:
    return MCPServer.stdio(sys.executable, [NAMES, "--names", names], name=name)


def local_transfer(requires_approval: bool) -> Any:
    @tool(requires_approval=requires_approval)
    def transfer(amount: int = 0) -> str:
        """Move money.

        Args:
            amount: how much.
        """
        return f"local transfer {amount}"

    return transfer


def test_an_mcp_tool_named_like_a_local_tool_is_refused_at_attach_naming_both() -> None:
    local = local_transfer(requires_approval=False)
    registry = ToolRegistry([local])
    with names_server("transfer,quote") as server:
        with pytest.raises(ToolConflict) as info:
            server.attach(registry)
    text = str(info.value)
    assert "local tool 'transfer'" in text and "<MCPTool 'transfer' of 'names'>" in text
    assert registry.names() == ["transfer"] and registry.get("transfer") is local  # nothing registered


def test_a_prefix_keeps_both_and_override_replaces_only_a_tool_without_approval() -> None:
    plain, gated = local_transfer(False), local_transfer(True)
    with names_server("transfer") as server:
        prefixed = ToolRegistry([gated])
        assert server.attach(prefixed, "bank_") == ["bank_rename", "bank_transfer"]
        assert prefixed.get("transfer") is gated
        replaced = ToolRegistry([plain])
        server.sync(replaced, override=True)
        assert replaced.get("transfer") is not plain and replaced.get("transfer").source is server  # type: ignore[union-attr]
        kept = ToolRegistry([gated])
        with pytest.raises(ToolConflict, match="requires approval and can never be replaced"):
            server.sync(kept, override=True)
        assert kept.get("transfer") is gated


@pytest.mark.parametrize("names", ["a.b,a_b", "weather/today,weather:today"])
def test_two_server_names_mapping_to_one_loopctl_name_are_refused_unless_overridden(names: str) -> None:
    first, second = names.split(",")
    with names_server(names) as server:
        registry = ToolRegistry()
        with pytest.raises(ToolConflict) as info:
            server.attach(registry, "x_")
        assert repr(first) in str(info.value) and "MCPTool" in str(info.value)
        assert registry.names() == []
        server.sync(registry, override=True)  # the first listed keeps the name
        [mapped] = [t for t in registry if t.name != "rename"]
        assert mapped.remote_name == first  # type: ignore[attr-defined]


def test_two_servers_offering_one_name_conflict_unless_one_is_prefixed() -> None:
    with names_server("quote", "one") as one, names_server("quote", "two") as two:
        registry = ToolRegistry()
        one.attach(registry)
        with pytest.raises(ToolConflict, match="'one'"):
            two.attach(registry)
        two.attach(registry, "two_")
        assert registry.get("quote").server is one  # type: ignore[union-attr]
        assert registry.get("two_quote").server is two  # type: ignore[union-attr]


class Asked(Observer):
    def __init__(self) -> None:
        self.asked = threading.Event()
        self.tools: list[str] = []

    def on_approval_requested(self, event: ApprovalRequested) -> None:
        self.tools.append(event.tool)
        self.asked.set()


def test_a_server_renaming_its_tools_between_turns_never_replaces_a_local_tool() -> None:
    gated = local_transfer(True)
    script = [call("rename", names="transfer,quote2"), call("transfer", amount=7), reply("done")]
    with names_server("quote") as server:
        loop = BareLoop(ScriptedClient(script), [gated])
        server.attach(loop.tools)
        asked = Asked()
        loop.register_observer(asked)
        with loop:
            h = loop.start("move money")
            assert asked.asked.wait(WAIT)
            assert asked.tools == ["transfer"]  # the local, approval-gated tool: it asks
            assert h.approve(h.pending_approvals()[0].call_id) is True
            run = h.result(WAIT)
        assert loop.tools.get("transfer") is gated
        assert "quote2" in loop.tools and "quote" not in loop.tools  # the new list was read
    outputs = [r.output for m in loop.conversation() for r in m.tool_results]
    assert outputs == ["renamed", "local transfer 7"]
    assert [d.tool for d in run.approvals] == ["transfer"]


def local_search() -> Any:
    @tool
    def search(amount: int = 0) -> str:
        """Search here.

        Args:
            amount: how many.
        """
        return f"local search {amount}"

    return search


def test_override_covers_only_the_names_colliding_at_attach_and_a_dropped_name_gives_the_tool_back() -> None:
    search, transfer = local_search(), local_transfer(False)
    script = [
        call("rename", names="search,transfer"), call("transfer", amount=7),
        call("rename", names="other"), call("search", amount=2), reply("done"),
    ]
    with names_server("search") as server:
        loop = BareLoop(ScriptedClient(script), [search, transfer])
        assert server.attach(loop.tools, override=True) == ["rename", "search"]
        assert loop.tools.get("search").source is server  # type: ignore[union-attr]
        with loop:
            loop.run("go")
        # transfer was never offered to the server: the rename neither took nor removed it;
        # search was, until the server dropped it: the local search is back.
        assert loop.tools.get("transfer") is transfer and loop.tools.get("search") is search
        assert loop.tools.names() == ["other", "rename", "search", "transfer"]
    outputs = [r.output for m in loop.conversation() for r in m.tool_results]
    assert outputs == ["renamed", "local transfer 7", "renamed", "local search 2"]


UPDATED = [call("rename", names="transfer", note=" Now faster."), call("transfer", amount=5), reply("done")]
# The server drops the tool, then lists it again: a new tool object, no longer an update.
DROPPED_AND_BACK = [
    call("rename", names="other"), call("rename", names="transfer", note=" Now faster."), call("transfer", amount=5),
    reply("done"),
]


@pytest.mark.parametrize("script", [UPDATED, DROPPED_AND_BACK], ids=["updated", "dropped-and-listed-again"])
def test_a_gate_set_on_a_server_tool_survives_the_server_updating_that_tool(script: list[Any]) -> None:
    with names_server("transfer") as server:
        loop = BareLoop(ScriptedClient(script), ToolRegistry())
        server.attach(loop.tools)
        gated = loop.tools.get("transfer")
        assert gated is not None
        gated.requires_approval, gated.approval_timeout = True, 60.0
        asked = Asked()
        loop.register_observer(asked)
        with loop:
            h = loop.start("move money")
            assert asked.asked.wait(WAIT)
            assert h.deny(h.pending_approvals()[0].call_id, "no") is True
            h.result(WAIT)
        updated = loop.tools.get("transfer")
        assert updated is not gated and "Now faster." in updated.description  # type: ignore[union-attr]
        assert updated.requires_approval and updated.approval_timeout == 60.0  # type: ignore[union-attr]
    outputs = [r.output for m in loop.conversation() for r in m.tool_results]
    assert outputs == ["renamed"] * (len(script) - 2) + ["the user denied this call: no"]
