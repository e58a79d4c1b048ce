"""Bad bytes from tools never kill a run (issue 15, item 6, the tool side).

A tool's text is made clean where the output is made: a lone surrogate
becomes U+FFFD (history, records, events and every provider see the same
clean text), a NaN or infinity in a returned value becomes a JSON string,
and a huge result still goes through (cut by the output-limit middleware
when one is installed). The run-level tests speak real HTTP to the fake
server and parse the bytes it received strictly.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import attrs
import pytest
from fakeserver import FakeServer, Stream, anthropic_stream, openai_stream
from support import Recorder

from loopctl import BareLoop, SessionConfig, ToolOutput, tool
from loopctl.observers import ToolPost
from loopctl.providers import AnthropicClient, OpenAIClient
from loopctl.tools import OutputLimitMiddleware, ToolMiddleware, ToolPipelineBuilder
from loopctl.tools.base import clean_text, to_output

KEY = "sk-test-tool-bytes"


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"not strict JSON: {name}")


def strict_json(text: Any) -> Any:
    """Parse as RFC 8259 JSON: NaN/Infinity tokens raise, bytes must be UTF-8."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")  # strict: a surrogate's bytes would raise here
    return json.loads(text, parse_constant=_refuse_constant)


def _oa_client(server: FakeServer) -> OpenAIClient:
    return OpenAIClient("gpt-test", api_key=KEY, base_url=server.openai_url)


def _an_client(server: FakeServer) -> AnthropicClient:
    return AnthropicClient("claude-test", api_key=KEY, base_url=server.url)


def _oa_result(body: Any) -> str:
    msg = [m for m in body["messages"] if m["role"] == "tool"]
    assert len(msg) == 1
    return str(msg[0]["content"])


def _an_result(body: Any) -> str:
    blocks = [b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]]
    results = [b for b in blocks if b.get("type") == "tool_result"]
    assert len(results) == 1
    content = results[0]["content"]
    if isinstance(content, list):
        return "".join(part["text"] for part in content)
    return str(content)


PROVIDERS: dict[str, tuple[Callable[[FakeServer], Any], Callable[..., list[bytes]], Callable[[Any], str]]] = {
    "openai": (_oa_client, openai_stream, _oa_result),
    "anthropic": (_an_client, anthropic_stream, _an_result),
}


def run_tool_through(server: FakeServer, provider: str, fn: Any, **loop_kw: Any) -> tuple[Any, BareLoop, Recorder, str]:
    """One tool call then a final reply, over real HTTP; returns (run, loop, recorder, sent result)."""
    make_client, make_stream, result_of = PROVIDERS[provider]
    server.push(
        Stream(make_stream(tool_calls=[("call_1", fn.name, "{}")])),
        Stream(make_stream("done")),
    )
    rec = Recorder()
    loop = BareLoop(make_client(server), [fn], config=loop_kw.get("config", SessionConfig()))
    loop.register_observer(rec)
    if "pipeline" in loop_kw:
        loop.set_pipeline(loop_kw["pipeline"])
    try:
        run = loop.run("use the tool")
    finally:
        loop.close()
    assert len(server.requests) == 2
    body = strict_json(server.requests[1].body)
    return run, loop, rec, result_of(body)


@tool
def lone_surrogate() -> str:
    """Return text holding a lone surrogate."""
    return "\ud800x"


@tool
def nan_value() -> float:
    """Return NaN."""
    return float("nan")


@tool
def inf_in_dict() -> dict[str, float]:
    """Return an infinity inside an object."""
    return {"x": float("inf")}


@tool
def huge() -> str:
    """Return five megabytes."""
    return "y" * 5_000_000


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_lone_surrogate_from_a_tool_is_replaced_and_the_run_completes(server: FakeServer, provider: str) -> None:
    run, loop, rec, sent = run_tool_through(server, provider, lone_surrogate)
    assert run.output == "done"
    assert sent == "\ufffdx"
    # The same clean text everywhere the result went.
    results = [r for m in loop.conversation() for r in m.tool_results]
    assert [r.output for r in results] == ["\ufffdx"]
    assert [e.output for e in rec.of(ToolPost)] == ["\ufffdx"]
    json.dumps(run.to_dict(), ensure_ascii=False).encode("utf-8")  # would raise on a surrogate
    for event in rec.snapshot():
        json.dumps(event.to_dict(), ensure_ascii=False).encode("utf-8")


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
@pytest.mark.parametrize(
    ("fn", "expected"),
    [(nan_value, "NaN"), (inf_in_dict, {"x": "Infinity"})],
    ids=["nan", "inf-in-dict"],
)
def test_nan_and_infinity_from_a_tool_are_sent_as_strict_json(
    server: FakeServer, provider: str, fn: Any, expected: Any
) -> None:
    run, _, _, sent = run_tool_through(server, provider, fn)
    assert run.output == "done"
    assert strict_json(sent) == expected


def test_huge_result_is_cut_by_the_output_limit_and_the_run_completes(server: FakeServer) -> None:
    pipeline = ToolPipelineBuilder().with_middleware(OutputLimitMiddleware(20_000))
    run, _, _, sent = run_tool_through(server, "openai", huge, pipeline=pipeline)
    assert run.output == "done"
    assert len(sent) == 20_000 and sent.endswith("[truncated]")


def test_huge_result_without_a_limit_still_goes_through(server: FakeServer) -> None:
    # No window policy: five megabytes is more than the default window holds.
    run, _, _, sent = run_tool_through(server, "openai", huge, config=SessionConfig(context_window=0))
    assert run.output == "done"
    assert len(sent) == 5_000_000


def test_a_middleware_cannot_smuggle_a_surrogate_past_the_output(server: FakeServer) -> None:
    class Forge(ToolMiddleware):
        def dispatch(self, ctx: Any, next: Any) -> ToolOutput:
            next(ctx)
            return ToolOutput("forged \udfff", is_error=True)

    pipeline = ToolPipelineBuilder().with_middleware(Forge())
    run, _, _, sent = run_tool_through(server, "openai", nan_value, pipeline=pipeline)
    assert run.output == "done"
    assert sent == "forged \ufffd"


def test_exception_text_with_a_surrogate_becomes_a_clean_soft_error(server: FakeServer) -> None:
    @tool
    def boom() -> str:
        """Raise with a surrogate in the message."""
        raise RuntimeError("bad \udc80 byte")

    run, _, _, sent = run_tool_through(server, "openai", boom)
    assert run.output == "done"
    assert "bad \ufffd byte" in sent and "RuntimeError" in sent


# -- unit level -------------------------------------------------------------------------


def test_clean_text_replaces_lone_halves_and_joins_a_split_pair() -> None:
    assert clean_text("ok") == "ok"
    assert clean_text("caf\u00e9") == "caf\u00e9"
    assert clean_text("\ud800") == "\ufffd"
    assert clean_text("a\udc00b\ud800") == "a\ufffdb\ufffd"
    assert clean_text("\ud83d\ude00") == "\U0001f600"  # a high+low pair is one character
    assert clean_text("\ud83d\ude00\ud83d") == "\U0001f600\ufffd"


def test_tool_output_is_clean_however_it_is_made() -> None:
    assert ToolOutput("x\ud800").text == "x\ufffd"
    assert ToolOutput.error("\udfffe").text == "\ufffde"
    assert to_output("\ud800").text == "\ufffd"
    assert to_output(["\ud800"]).text == '["\ufffd"]'
    assert ToolOutput("x\ud800") == ToolOutput("x\ufffd")


@attrs.frozen
class Reading:
    value: float
    unit: str


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (float("nan"), "NaN"),
        (float("inf"), "Infinity"),
        (float("-inf"), "-Infinity"),
        ([1.5, float("nan"), None], [1.5, "NaN", None]),
        ((float("inf"),), ["Infinity"]),
        ({"a": {"b": [float("-inf")]}}, {"a": {"b": ["-Infinity"]}}),
        ({float("nan"): 1}, {"NaN": 1}),
        (Reading(float("nan"), "C"), {"value": "NaN", "unit": "C"}),
        ({"fine": 2.5, "n": 3, "t": True}, {"fine": 2.5, "n": 3, "t": True}),
    ],
)
def test_returned_values_are_encoded_as_strict_json(value: Any, expected: Any) -> None:
    out = to_output(value)
    assert not out.is_error
    assert strict_json(out.text) == expected


def test_a_circular_value_still_falls_back_to_its_str() -> None:
    loop: list[Any] = [float("nan")]
    loop.append(loop)
    assert to_output(loop).text == str(loop)
