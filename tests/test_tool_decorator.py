"""``@tool`` options, return conversion, exceptions, the registry, class-based tools."""

from __future__ import annotations

import enum
import logging
import sys
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any, Optional

import attrs
import pytest

from loopctl import BareLoop, ConfigError, Tool, ToolContext, ToolError, ToolOutput, ToolRegistry
from loopctl.testing import ScriptedClient, call, reply
from loopctl.tools import FunctionTool, tool


class Mood(enum.Enum):
    HAPPY = "happy"


@attrs.define
class Report:
    """A report."""

    title: str
    mood: Mood
    scores: list[int]


def test_bare_decorator_uses_function_name_and_docstring() -> None:
    @tool
    def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: the key.
        """
        return key

    assert isinstance(lookup, Tool) and isinstance(lookup, FunctionTool)
    assert lookup.name == "lookup"
    assert lookup.description == "Look a key up."
    assert (lookup.concurrency_safe, lookup.read_only, lookup.timeout) == (False, False, None)
    assert lookup.resource_key({"key": "a"}) is None
    assert lookup("direct") == "direct"  # still callable as a function
    assert lookup.__wrapped__.__name__ == "lookup"


def test_options_are_applied() -> None:
    @tool(name="fetch_url", description="Fetch a URL.", concurrency_safe=True, read_only=True,
          resource_key="net", timeout=2.5)
    def fetch(url: str) -> str:
        """Ignored docstring."""
        return url

    assert fetch.name == "fetch_url"
    assert fetch.description == "Fetch a URL."
    assert fetch.concurrency_safe and fetch.read_only and fetch.is_concurrency_safe({"url": "x"})
    assert fetch.timeout == 2.5
    assert fetch.resource_key({"url": "x"}) == "net"
    assert fetch.schema().name == "fetch_url"


def test_callable_resource_key_sees_the_input() -> None:
    @tool(concurrency_safe=True, resource_key=lambda inp: f"file:{inp['path']}")
    def write(path: str, text: str) -> str:
        """Write a file."""
        return "ok"

    assert write.resource_key({"path": "/a", "text": ""}) == "file:/a"
    # A key function that fails gives a key of its own tool, never an exception.
    assert write.resource_key({}) == "\x00unkeyable:write"


@pytest.mark.parametrize(
    "options, message",
    [
        ({"timeout": 0}, "timeout must be a finite positive number of seconds, got 0"),
        ({"timeout": "5"}, "timeout must be a finite positive number of seconds, got '5'"),
        ({"resource_key": 3}, "resource_key must be a str or a callable(input), got 3"),
        ({"name": ""}, "the tool name must be a non-empty str, got ''"),
    ],
)
def test_bad_options_fail_at_decoration(options: dict[str, Any], message: str) -> None:
    def f(a: int) -> None:
        """F."""

    with pytest.raises(ConfigError) as info:
        tool(**options)(f)
    assert message in str(info.value)


def test_missing_description_fails_at_decoration() -> None:
    def undocumented(a: int) -> None:
        pass

    with pytest.raises(ConfigError, match=r"tool 'undocumented': a tool needs a description"):
        tool(undocumented)
    assert tool(description="Given.")(undocumented).description == "Given."


def test_async_function_is_refused() -> None:
    async def f(a: int) -> None:
        """F."""

    with pytest.raises(ConfigError, match="must be synchronous"):
        tool(f)


# -- return values --------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [
        ("plain text", ToolOutput("plain text")),
        ("", ToolOutput("")),
        (ToolOutput("given"), ToolOutput("given")),
        (ToolOutput.error("soft"), ToolOutput("soft", True)),
        ({"a": [1, 2], "b": None}, ToolOutput('{"a": [1, 2], "b": null}')),
        ([1, "x"], ToolOutput('[1, "x"]')),
        (42, ToolOutput("42")),
        (None, ToolOutput("null")),
        (True, ToolOutput("true")),
        ("héllo", ToolOutput("héllo")),
        ({"k": "é"}, ToolOutput('{"k": "é"}')),
        (Report("t", Mood.HAPPY, [1]), ToolOutput('{"title": "t", "mood": "happy", "scores": [1]}')),
        ({"mood": Mood.HAPPY, "p": PurePosixPath("/a/b")}, ToolOutput('{"mood": "happy", "p": "/a/b"}')),
        ({3, 1, 2}, ToolOutput("[1, 2, 3]")),
        (object, ToolOutput(str(object))),  # not JSON-able: str()
    ],
    ids=repr,
)
def test_return_value_conversion(value: Any, expected: ToolOutput) -> None:
    @tool
    def give() -> Any:
        """Give."""
        return value

    assert give.invoke({}, None) == expected  # type: ignore[arg-type]


def test_tool_error_is_a_soft_error_naming_the_tool() -> None:
    @tool
    def fragile() -> str:
        """Fragile."""
        raise ToolError("disk full")

    assert fragile.invoke({}, None) == ToolOutput.error("Tool 'fragile' failed: disk full")  # type: ignore[arg-type]


def test_any_exception_is_a_soft_error_naming_tool_and_exception() -> None:
    @tool
    def broken(n: int) -> float:
        """Broken."""
        return 1 / n

    assert broken.invoke({"n": 0}, None) == ToolOutput.error(  # type: ignore[arg-type]
        "Tool 'broken' raised ZeroDivisionError: division by zero"
    )


def test_exceptions_and_tool_errors_do_not_end_the_run() -> None:
    calls_seen: list[str] = []

    @tool
    def flaky(mode: str) -> str:
        """Flaky."""
        calls_seen.append(mode)
        if mode == "tool_error":
            raise ToolError("nope")
        if mode == "crash":
            raise KeyError("k")
        return "fine"

    client = ScriptedClient(
        [call("flaky", mode="tool_error"), call("flaky", mode="crash"), call("flaky", mode="ok"), reply("done")]
    )
    with BareLoop(client, [flaky]) as loop:
        run = loop.run("go")
    assert run.output == "done"
    assert calls_seen == ["tool_error", "crash", "ok"]
    results = [m.tool_results[0] for m in loop.conversation() if m.tool_results]
    assert [(r.output, r.is_error) for r in results] == [
        ("Tool 'flaky' failed: nope", True),
        ("Tool 'flaky' raised KeyError: 'k'", True),
        ("fine", False),
    ]


def test_context_fields_reach_the_tool() -> None:
    seen: list[ToolContext] = []

    @tool
    def where(ctx: ToolContext) -> str:
        """Where am I."""
        seen.append(ctx)
        return str(ctx.temp_dir)

    client = ScriptedClient([call("where"), reply("done")])
    with BareLoop(client, [where]) as loop:
        loop.tool_extras["user"] = "ada"
        run = loop.run("go", run_id="run-7")
        (ctx,) = seen
        assert ctx.session_id == loop.session.id
        assert ctx.run_id == "run-7"
        assert ctx.turn == 0
        assert ctx.call_id == run.turns[0].tool_calls[0].id
        assert ctx.extras == {"user": "ada"}
        assert ctx.temp_dir is not None and ctx.temp_dir.name == f"loopctl-{loop.session.id}"
        assert ctx.temp_dir.is_dir()
        assert not ctx.cancel.is_cancelled()
    assert not ctx.temp_dir.exists()  # close() removed it


# -- registry ---------------------------------------------------------------------------


def _named(name: str, text: str) -> FunctionTool:
    def f() -> str:
        """A tool."""
        return text

    return tool(name=name)(f)


def test_registry_replaces_by_name_in_place(caplog: pytest.LogCaptureFixture) -> None:
    reg = ToolRegistry([_named("b", "1"), _named("a", "2"), _named("c", "3")])
    replacement = _named("a", "new")
    with caplog.at_level(logging.WARNING, logger="loopctl"):
        reg.register(replacement)
    assert "tool 'a' replaced in registry" in caplog.text
    assert [s.name for s in reg.schemas()] == ["b", "a", "c"]  # position kept
    assert reg.names() == ["a", "b", "c"]  # sorted
    assert reg.get("a") is replacement
    assert reg.get("zzz") is None
    assert "a" in reg and len(reg) == 3


def test_registry_refuses_non_tools() -> None:
    def plain() -> None:
        """Plain."""

    with pytest.raises(TypeError, match="register\\(\\) takes a Tool, got function"):
        ToolRegistry().register(plain)  # type: ignore[arg-type]


class Counter(Tool):
    """A stateful class-based tool."""

    name = "counter"
    description = "Add to a running total."
    concurrency_safe = False

    def __init__(self, start: int = 0) -> None:
        self.total = start

    def input_schema(self) -> Mapping[str, Any]:
        return {
            "type": "object",
            "properties": {"by": {"type": "integer"}},
            "required": ["by"],
            "additionalProperties": False,
        }

    def call(self, input: Mapping[str, Any], ctx: ToolContext) -> Any:
        self.total += input["by"]
        return f"total={self.total}"


def test_class_based_tool_keeps_state_across_calls_in_a_run() -> None:
    counter = Counter(10)
    client = ScriptedClient([call("counter", by=1), call("counter", by=5), call("counter", by="x"), reply("done")])
    with BareLoop(client, [counter]) as loop:
        loop.run("go")
    outputs = [m.tool_results[0].output for m in loop.conversation() if m.tool_results]
    assert outputs == [
        "total=11",
        "total=16",
        "Invalid input for tool 'counter': field 'by' must be integer, got string 'x'",
    ]
    assert counter.total == 16
    assert counter.schema().input_schema["required"] == ["by"]


def test_base_tool_without_call_is_a_soft_error() -> None:
    class Lazy(Tool):
        name = "lazy"
        description = "Does nothing."

    assert Lazy().invoke({}, None).text == (  # type: ignore[arg-type]
        "Tool 'lazy' raised NotImplementedError: tool 'lazy' does not implement call()"
    )


def test_optional_context_parameter_is_injected() -> None:
    @tool
    def f(ctx: Optional[ToolContext] = None) -> str:
        """F."""
        return "got" if ctx is not None else "none"

    assert f.schema().input_schema["properties"] == {}
    assert f.invoke({}, object()).text == "got"  # type: ignore[arg-type]


@pytest.mark.skipif(sys.version_info < (3, 10), reason="'X | None' needs Python 3.10")
def test_pep604_optional_context_parameter_is_injected_either_way_round() -> None:
    @tool
    def f(x: int, ctx: ToolContext | None = None) -> str:
        """F."""
        return "got" if ctx is not None else "none"

    @tool
    def g(ctx: None | ToolContext = None) -> str:
        """G."""
        return "got" if ctx is not None else "none"

    assert list(f.schema().input_schema["properties"]) == ["x"]
    assert g.schema().input_schema["properties"] == {}
    assert f.invoke({"x": 1}, object()).text == "got"  # type: ignore[arg-type]
    assert g.invoke({}, object()).text == "got"  # type: ignore[arg-type]
    assert f.invoke({"x": 1, "ctx": {}}, object()).text == (  # type: ignore[arg-type]
        "Invalid input for tool 'f': unknown field 'ctx' (allowed: x)"
    )


def test_rst_literals_and_roles_in_a_docstring_reach_the_model_as_markdown() -> None:
    @tool
    def fetch(path: str, mode: str = "r") -> str:
        """Read ``path`` (a :class:`~pathlib.Path` works too) and return its text.

        Args:
            path: the file; ``~`` is not expanded.
            mode: ``"r"`` or ``"rb"``.
        """
        return path

    schema = fetch.schema()
    assert schema.description == "Read `path` (a `pathlib.Path` works too) and return its text."
    props = schema.input_schema["properties"]
    assert props["path"]["description"] == "the file; `~` is not expanded."
    assert props["mode"]["description"] == '`"r"` or `"rb"`.'
    assert "``" not in repr(schema)
