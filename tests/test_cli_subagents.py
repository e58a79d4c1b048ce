"""``loopctl run --subagent``: arithmetic handed to a ``calculator`` sub-agent, shown indented.

Driven in-process through ``main()`` with in-memory output (as test_cli
does); the offline model decides to delegate because it is given the
``calculator`` tool and no ``add``/``multiply`` of its own.
"""

from __future__ import annotations

import io
import json

from test_cli import _main

from loopctl import BareLoop
from loopctl.demo.delegation import delegating_tools
from loopctl.demo.model import OfflineModel


def test_subagent_tool_calls_show_indented_under_the_parents_call() -> None:
    code, out, _ = _main(["run", "--subagent", "What is (2 + 3) * 4?"])
    assert code == 0
    lines = out.splitlines()
    parent_call = next(i for i, ln in enumerate(lines) if ln.startswith('  > calculator(task="What is (2 + 3) * 4?")'))
    parent_done = next(i for i, ln in enumerate(lines) if ln.startswith("  < calculator:"))
    inner = lines[parent_call + 1 : parent_done]
    assert "    > add(a=2, b=3)" in inner and "    > multiply(a=5, b=4)" in inner
    assert any(ln.startswith("    < add: 5") for ln in inner)
    assert any(ln.startswith("    [calculator] ") for ln in inner)
    assert "(2 + 3) * 4 = 20" in lines[-2]


def test_ask_reaches_the_subagents_calls_and_a_piped_answer_denies_one() -> None:
    code, out, _ = _main(["run", "--subagent", "--ask", "add", "What is 2 + 3?"], stdin=io.StringIO("not now\n"))
    assert code == 0
    assert "[calculator] add(a=2, b=3) needs approval [y/n/reason]" in out
    assert "[denied: [calculator] add(a=2, b=3): not now]" in out
    assert "the user denied this call: not now" in out


def test_json_lines_carry_the_subagent_path() -> None:
    code, out, _ = _main(["run", "--subagent", "--json", "What is 2 + 3?"])
    assert code == 0
    events = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
    paths = {(e["type"], e["subagent"]) for e in events}
    assert ("tool_post", "calculator") in paths and ("tool_post", "") in paths
    assert events[-1]["type"] == "run_end" and events[-1]["subagent"] == ""


def test_the_offline_model_delegates_arithmetic_only_when_it_has_no_tools_for_it() -> None:
    loop = BareLoop(OfflineModel(), delegating_tools(OfflineModel))
    run = loop.run("What is 6 * 7?")
    assert "6 * 7 = 42" in (run.output or "")
    assert [c.name for t in run.turns for c in t.tool_calls] == ["calculator"]
    assert run.usage.total_tokens > run.input_tokens + run.output_tokens  # the sub-agent's tokens
