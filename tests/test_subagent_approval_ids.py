"""One answer answers one call across a tree of sub-agents, even when call ids repeat."""

from __future__ import annotations

import threading

import pytest

from loopctl import BareLoop, Message, Observer, tool
from loopctl.hosting.registry import RunRegistry
from loopctl.messages import ModelResponse, StopReason, ToolCallPart
from loopctl.testing import ScriptedClient, reply


def _calls(*calls: tuple[str, str, dict[str, str]]) -> ModelResponse:
    return ModelResponse(Message.assistant("", [ToolCallPart(i, n, a) for i, n, a in calls]), StopReason.TOOL_CALL)


class _TwoWaiting(Observer):
    """Sets ``ready`` once two calls of the tree wait for a person."""

    def __init__(self) -> None:
        self.seen = 0
        self.ready = threading.Event()
        self.lock = threading.Lock()

    def on_approval_requested(self, event: object) -> None:
        with self.lock:
            self.seen += 1
            if self.seen == 2:
                self.ready.set()


def _tree(ran: list[tuple[str, str]]) -> tuple[BareLoop, _TwoWaiting]:
    @tool(requires_approval=True)
    def danger(x: str) -> str:
        """Dangerous."""
        ran.append(("danger", x))
        return "boom"

    @tool(requires_approval=True)
    def read(x: str) -> str:
        """Harmless."""
        ran.append(("read", x))
        return "ok"

    # The sub-agent's call and the parent's call share the id "c2".
    sub = BareLoop(ScriptedClient([_calls(("c2", "read", {"x": "r"})), reply("sub done")]), tools=[read])
    parent = BareLoop(
        ScriptedClient([_calls(("c1", "research", {"task": "t"}), ("c2", "danger", {"x": "rm -rf"})), reply("done")]),
        tools=[sub.as_tool("research", "Researches."), danger],
    )
    waiting = _TwoWaiting()
    parent.with_observer(waiting)
    return parent, waiting


@pytest.mark.parametrize("answer", ["approve", "deny"])
def test_an_id_waiting_in_two_runs_of_the_tree_is_never_guessed(answer: str) -> None:
    ran: list[tuple[str, str]] = []
    parent, waiting = _tree(ran)
    with parent:
        handle = parent.start("go")
        assert waiting.ready.wait(10)
        assert sorted((p.call_id, p.tool, p.subagent) for p in handle.pending_approvals()) == [
            ("c2", "danger", ""), ("c2", "read", "research"),
        ]
        with pytest.raises(ValueError, match="more than one run"):
            if answer == "approve":
                handle.approve("c2")
            else:
                handle.deny("c2", "no")
        assert len(handle.pending_approvals()) == 2  # nothing was answered
        # Named, each answer reaches exactly its call.
        assert handle.approve("c2", subagent="research")
        assert [(p.tool, p.subagent) for p in handle.pending_approvals()] == [("danger", "")]
        assert handle.deny("c2", "not today", subagent="")
        assert handle.result(10).output == "done"
    assert ran == [("read", "r")]


def test_the_registry_routes_an_answer_by_its_subagent_path() -> None:
    ran: list[tuple[str, str]] = []
    parent, waiting = _tree(ran)
    with RunRegistry() as registry:
        run_id = registry.start(parent, "go")
        assert waiting.ready.wait(10)
        with pytest.raises(ValueError, match="subagent="):
            registry.approve(run_id, "c2")
        assert registry.deny(run_id, "c2", "no", subagent="research")
        assert registry.approve(run_id, "c2", subagent="")
        assert registry.result(run_id, timeout=10).output == "done"
    parent.close()
    assert ran == [("danger", "rm -rf")]
