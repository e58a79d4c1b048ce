"""Sub-agents under OpenTelemetry: a sub-agent's run span is a child of the parent's tool span.

Read back from the SDK's in-memory exporter; the ``OTelObserver`` is
registered on the top-level loop only (sub-agents' events reach it through
the parent's observers).
"""

from __future__ import annotations

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from support import WAIT, Gate  # noqa: E402

from loopctl import BareLoop, Cancelled, ToolContext, Usage, tool  # noqa: E402
from loopctl.contrib.otel import OTelObserver  # noqa: E402
from loopctl.testing import ScriptedClient, call, reply  # noqa: E402


def traced() -> tuple[InMemorySpanExporter, OTelObserver]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, OTelObserver(tracer_provider=provider)


def by_name(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def parent_of(span: ReadableSpan) -> int:
    assert span.parent is not None, span.name
    return span.parent.span_id


def test_a_subagents_invoke_agent_span_is_a_child_of_the_parents_execute_tool_span() -> None:
    exporter, observer = traced()
    search = BareLoop(ScriptedClient([reply("found", usage=Usage(1, 1))]))
    research = BareLoop(
        ScriptedClient([call("search", task="s"), reply("researched")]), tools=[search.as_tool("search", "s")]
    )
    root = BareLoop(ScriptedClient([call("research", task="r"), reply("answer")]), tools=[research.as_tool("research", "r")])
    root.register_observer(observer)
    root.run("go")
    spans = list(exporter.get_finished_spans())
    agents = by_name(spans, "invoke_agent")
    assert len(agents) == 3
    top = [s for s in agents if s.parent is None]
    assert len(top) == 1
    root_span = top[0]
    [research_tool] = by_name(spans, "execute_tool research")
    [search_tool] = by_name(spans, "execute_tool search")
    assert parent_of(research_tool) == root_span.context.span_id
    research_span = next(s for s in agents if s.attributes.get("loopctl.subagent") == "research")
    search_span = next(s for s in agents if s.attributes.get("loopctl.subagent") == "research/search")
    assert parent_of(research_span) == research_tool.context.span_id
    assert parent_of(search_tool) == research_span.context.span_id
    assert parent_of(search_span) == search_tool.context.span_id
    # the sub-agent's model calls hang under its own run span, and the trace is one
    chats = [s for s in spans if s.name.startswith("chat ")]
    assert sum(parent_of(c) == search_span.context.span_id for c in chats) == 1
    assert len({s.context.trace_id for s in spans}) == 1
    # the tool span covers the sub-agent's run
    assert research_tool.start_time <= research_span.start_time
    assert research_span.end_time <= research_tool.end_time


def test_a_cancelled_tree_closes_every_span_it_opened() -> None:
    exporter, observer = traced()
    gate = Gate()

    @tool(name="wait_here")
    def wait_here(ctx: ToolContext) -> str:
        """Waits for the cancel."""
        gate.entered.set()
        ctx.cancel.wait(WAIT)
        return "stopped"

    child = BareLoop(ScriptedClient([call("wait_here")]), tools=[wait_here])
    root = BareLoop(ScriptedClient([call("research", task="r")]), tools=[child.as_tool("research", "r")])
    root.register_observer(observer)
    handle = root.start("go")
    gate.wait_entered()
    handle.cancel("stop")
    with pytest.raises(Cancelled):
        handle.result(WAIT)
    spans = list(exporter.get_finished_spans())
    agents = by_name(spans, "invoke_agent")
    assert sorted(s.attributes.get("loopctl.subagent", "") for s in agents) == ["", "research"]
    [tool_span] = by_name(spans, "execute_tool research")
    sub = next(s for s in agents if s.attributes.get("loopctl.subagent") == "research")
    assert parent_of(sub) == tool_span.context.span_id
    assert all(s.attributes.get("loopctl.run.outcome") == "cancelled" for s in agents)
