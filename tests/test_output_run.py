"""Typed answers through the driver: every answer type kind, every bad answer, the registry.

Offline (``ScriptedClient``, the demo model); the wire forms against the
fake HTTP servers are in ``test_output_wire.py``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from output_types import CITY_SCHEMA, Cities, City, Color, Mood, Movie, Note, Point
from support import Recorder

from loopctl import BareLoop, ConfigError, OutputValidationError, RunConfig, RunRegistry
from loopctl.demo.model import OfflineModel
from loopctl.demo.tools import demo_tools
from loopctl.hosting.serialization import event_from_dict
from loopctl.messages import Message, ModelResponse, StopReason, ToolCallPart
from loopctl.observers import OutputValidationFailed, TextDelta
from loopctl.records import Run
from loopctl.testing import ScriptedClient, call, reply
from loopctl.tools import tool


@pytest.mark.parametrize(
    ("output_type", "answer", "expected"),
    [
        (City, '{"name": "Oslo", "population": 700000}', City("Oslo", 700000)),
        (Point, '{"x": 1.5, "y": -2}', Point(1.5, -2.0)),
        (Movie, '{"title": "Heat", "year": 1995}', {"title": "Heat", "year": 1995}),
        (Color, '{"result": "green"}', Color.GREEN),
        (Mood, '{"result": "sad"}', "sad"),
        (Cities, '{"result": [{"name": "A", "population": 1}]}', [City("A", 1)]),
        (int, '{"result": 42}', 42),
        (float, '{"result": 2.5}', 2.5),
        (str, '{"result": "plain words"}', "plain words"),
        (bool, '{"result": true}', True),
        (CITY_SCHEMA, '{"name": "Rome", "population": 3}', {"name": "Rome", "population": 3}),
    ],
    ids=["attrs", "dataclass", "typeddict", "enum", "literal", "list", "int", "float", "str", "bool", "schema"],
)
def test_every_type_kind_comes_back_as_a_validated_value(output_type: Any, answer: str, expected: Any) -> None:
    client = ScriptedClient([reply(answer)])
    with BareLoop(client) as loop:
        run = loop.run("answer", output_type=output_type)
    assert run.output_value == expected
    assert type(run.output_value) is type(expected)
    assert run.output == answer
    fmt = client.requests[0].options.response_format  # ScriptedClient prefers native
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["schema"]["type"] == "object"


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ("The city is Oslo, population 700k.", "not valid JSON"),
        ('{"name": "Oslo", "population": 1, "mayor": "x"}', "mayor"),
        ('{"name": "Oslo"}', "population"),
        ('{"name": "Oslo", "population": "many"}', "population"),
    ],
    ids=["prose", "extra-field", "missing-field", "wrong-type"],
)
def test_a_bad_answer_is_sent_back_with_its_problems_and_the_next_one_is_taken(bad: str, problem: str) -> None:
    client = ScriptedClient([reply(bad), reply('{"name": "Oslo", "population": 700000}')])
    rec = Recorder()
    with BareLoop(client) as loop:
        loop.register_observer(rec)
        run = loop.run("city?", output_type=City)
    assert run.output_value == City("Oslo", 700000)
    assert run.turn_count == 2
    failed = [e for e in rec.snapshot() if isinstance(e, OutputValidationFailed)]
    assert len(failed) == 1 and failed[0].attempt == 1 and failed[0].max_attempts == 3
    assert any(problem in e for e in failed[0].errors), failed[0].errors
    # The second request carries the model's bad answer and the problems, as a user message.
    second = client.requests[1].messages
    assert second[-2].text == bad
    assert second[-1].role.value == "user" and problem in second[-1].text
    # The event's JSON form names the failure and round-trips.
    data = json.loads(json.dumps(failed[0].to_dict()))
    assert data["type"] == "output_validation_failed"
    assert event_from_dict(data) == failed[0]


def test_a_truncated_object_names_max_tokens_and_exhausted_retries_fail_the_run() -> None:
    cut = reply('{"name": "Os')
    cut = type(cut)(cut.message, StopReason.MAX_TOKENS)
    client = ScriptedClient([cut, cut])
    rec = Recorder()
    with BareLoop(client) as loop:
        loop.register_observer(rec)
        with pytest.raises(OutputValidationError) as info:
            loop.run("city?", RunConfig(output_retries=1), output_type=City)
    err = info.value
    assert err.raw_text == '{"name": "Os'
    assert any("max_tokens" in e for e in err.errors)
    assert err.run is not None and err.run.output_value is None and err.run.turn_count == 2
    attempts = [(e.attempt, e.max_attempts) for e in rec.snapshot() if isinstance(e, OutputValidationFailed)]
    assert attempts == [(1, 2), (2, 2)]


@pytest.mark.parametrize("mode", ["native", "prompt"])
@pytest.mark.parametrize("bad", ['{"result": NaN}', "Infinity", "1e999"])
def test_a_non_finite_number_is_answered_with_its_problem_in_every_text_mode(mode: str, bad: str) -> None:
    client = ScriptedClient([reply(bad), reply('{"result": 2.5}')])
    with BareLoop(client) as loop:
        run = loop.run("0/0?", RunConfig(output_mode=mode), output_type=float)
    assert run.output_value == 2.5 and run.turn_count == 2
    assert run.to_dict()["output_value"] == 2.5
    again = client.requests[1].messages[-1]
    assert again.role.value == "user" and ("not a JSON number" in again.text or "too large" in again.text)


def test_a_non_finite_number_with_no_retries_left_fails_the_run_in_the_registry_too() -> None:
    loop = BareLoop(ScriptedClient([reply("NaN")]))
    with RunRegistry() as reg:
        rid = reg.start(loop, "0/0?", RunConfig(output_retries=0), output_type=float)
        with pytest.raises(OutputValidationError) as info:
            reg.result(rid, timeout=10)
        status = reg.status(rid)
    loop.close()
    assert info.value.errors == ("the reply is not valid JSON: NaN is not a JSON number; it began 'NaN'",)
    assert status.state == "failed" and status.output_value is None


@pytest.mark.parametrize("mode", ["native", "prompt"])
@pytest.mark.parametrize("answer", ["42", "null", "[1] Oslo is the capital", "{braces} in prose"])
def test_a_text_answer_that_looks_like_json_is_taken_as_written(mode: str, answer: str) -> None:
    client = ScriptedClient([reply(answer)])
    with BareLoop(client) as loop:
        run = loop.run("q", RunConfig(output_mode=mode, output_retries=0), output_type=str)
    assert run.output_value == answer and run.turn_count == 1


def test_retries_zero_fails_on_the_first_bad_answer() -> None:
    client = ScriptedClient([reply("nope")])
    with BareLoop(client) as loop, pytest.raises(OutputValidationError):
        loop.run("x", RunConfig(output_retries=0), output_type=int)
    assert len(client.requests) == 1


@pytest.mark.parametrize("bad_type", [
    object, set, complex, {"type": 3}, {"type": "nonsense"},
    {"type": "object", "properties": {"n": {"type": "integr"}}},  # only an answer with n would reach it
])
def test_an_unsupported_type_is_a_config_error_before_anything_is_sent(bad_type: Any) -> None:
    client = ScriptedClient([reply("{}")])
    with BareLoop(client) as loop:
        with pytest.raises(ConfigError, match="output_type"):
            loop.run("x", output_type=bad_type)
        with pytest.raises(ConfigError, match="output_type"):
            loop.start("x", output_type=bad_type)
        assert not loop.is_running
        assert loop.run("plain").output == "{}"  # the loop is still usable
    assert len(client.requests) == 1 and client.requests[0].options is None


def test_a_schema_dict_is_checked_whole_and_its_fault_named_by_place_and_value() -> None:
    client = ScriptedClient([reply('{"result": 1}')])
    schema = {"type": "object", "properties": {"n": {"type": "array", "items": {"type": "integr"}}}}
    with BareLoop(client) as loop, pytest.raises(ConfigError) as info:
        loop.run("x", output_type=schema)
    assert str(info.value) == (
        "output_type schema is not a valid JSON Schema: at #/properties/n/items/type, "
        "type 'integr' names no JSON type (array, boolean, integer, null, number, object, string)")
    assert client.requests == []


def test_tool_mode_with_scripted_final_answer_calls_and_tools_before_it() -> None:
    @tool
    def population(name: str) -> int:
        """Look up a population."""
        return 700000

    client = ScriptedClient(
        [
            call("population", name="Oslo"),
            # Twice in one reply: both calls are answered, the final one with the problem.
            ModelResponse(
                Message.assistant(
                    "",
                    (
                        ToolCallPart("f1", "final_answer", {"name": "Oslo", "population": 1}),
                        ToolCallPart("f2", "final_answer", {"name": "Oslo", "population": 2}),
                    ),
                ),
                StopReason.TOOL_CALL,
            ),
            call("final_answer", name="Oslo", population=700000),
        ]
    )
    rec = Recorder()
    with BareLoop(client, [population]) as loop:
        loop.register_observer(rec)
        run = loop.run("city?", RunConfig(output_mode="tool"), output_type=City)
    assert run.output_value == City("Oslo", 700000)
    first = client.requests[0]
    assert [t.name for t in first.tools] == ["population", "final_answer"]
    assert first.options.tool_choice == "required" and first.options.response_format is None
    results = client.requests[2].messages[-1].parts
    assert [(p.tool_call_id, p.is_error) for p in results] == [("f1", True), ("f2", True)]
    assert "called 2 times" in results[0].output
    failed = [e for e in rec.snapshot() if isinstance(e, OutputValidationFailed)]
    assert len(failed) == 1 and "2 times" in failed[0].errors[0]
    # The answer's text reached observers as text deltas (its tool-input deltas).
    streamed = "".join(e.delta for e in rec.snapshot() if isinstance(e, TextDelta) and e.turn == 2)
    assert json.loads(streamed) == {"name": "Oslo", "population": 700000}
    # No final_answer call is left in the history: it became the reply's text.
    assert not loop.conversation()[-1].tool_calls and json.loads(loop.conversation()[-1].text)["population"] == 700000


def test_prompt_mode_puts_the_instructions_in_the_system_prompt() -> None:
    from loopctl import SessionConfig

    client = ScriptedClient([reply('{"result": 7}')])
    with BareLoop(client, config=SessionConfig(system_prompt="Be brief.")) as loop:
        run = loop.run("n?", RunConfig(output_mode="prompt"), output_type=int)
    assert run.output_value == 7
    req = client.requests[0]
    assert req.system.startswith("Be brief.\n\n") and '"result"' in req.system
    assert req.options is None and [t.name for t in req.tools] == []


def test_a_tool_named_final_answer_is_refused_in_tool_mode() -> None:
    @tool
    def final_answer(x: int) -> int:
        """A tool that collides."""
        return x

    with BareLoop(ScriptedClient([]), [final_answer]) as loop, pytest.raises(ConfigError, match="final_answer"):
        loop.run("x", RunConfig(output_mode="tool"), output_type=int)


def test_the_next_run_without_output_type_is_plain_text_again() -> None:
    client = ScriptedClient([reply('{"result": 1}'), reply("plain")])
    with BareLoop(client) as loop:
        assert loop.run("a", output_type=int).output_value == 1
        run = loop.run("b")
    assert run.output == "plain" and run.output_value is None
    assert client.requests[1].options is None


@pytest.mark.parametrize("mode", ["native", "tool"])
def test_the_offline_demo_model_fills_the_schema_from_its_answer(mode: str) -> None:
    with BareLoop(OfflineModel(), demo_tools()) as loop:
        run = loop.run("What is 12 + 30?", RunConfig(output_mode=mode), output_type=City)
        assert run.output_value.population == 42
        assert "42" in run.output_value.name
        assert loop.run("multiply 6 by 7", output_type=int).output_value == 42


def test_run_record_carries_the_json_form_and_rebuilds_it_where_the_type_imports() -> None:
    from loopctl.output import rebuild_value

    with BareLoop(ScriptedClient([reply('{"result": [{"name": "A", "population": 1}]}')])) as loop:
        run = loop.run("x", output_type=Cities)
    data = json.loads(json.dumps(run.to_dict()))
    assert data["output_value"] == [{"name": "A", "population": 1}]
    back = Run.from_dict(data)
    assert back.output_value == [{"name": "A", "population": 1}]  # list[...] has no import path
    assert rebuild_value(City, {"name": "B", "population": 2}) == City("B", 2)
    assert rebuild_value(City, {"name": "B"}) == {"name": "B"}  # does not fit: kept as JSON
    assert rebuild_value(Color, "red") is Color.RED
    assert rebuild_value(Note, {"text": "t", "tag": None}) == Note("t")


def test_registry_runs_typed_and_its_status_carries_the_json_form() -> None:
    client = ScriptedClient([reply("no"), reply('{"name": "Oslo", "population": 5}')])
    loop = BareLoop(client)
    with RunRegistry() as reg:
        rid = reg.start(loop, "city?", output_type=City)
        run = reg.result(rid, timeout=10)
        status = reg.status(rid)
        events = [e for _, e in reg.events(rid, timeout=5)]
    loop.close()
    assert run.output_value == City("Oslo", 5)
    assert status.state == "completed" and status.output_value == {"name": "Oslo", "population": 5}
    assert json.loads(json.dumps(status.to_dict()))["output_value"]["population"] == 5
    assert [e["type"] for e in events].count("output_validation_failed") == 1


def _cli(argv: list[str]) -> tuple[int, str, str]:
    import io

    from loopctl.demo.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = main(argv, stdin=io.StringIO(""), stdout=out, stderr=err, env={})
    return code, out.getvalue(), err.getvalue()


def test_cli_output_schema_prints_the_validated_object(tmp_path: Any) -> None:
    schema = tmp_path / "answer.json"
    schema.write_text(json.dumps({
        "type": "object",
        "properties": {"answer": {"type": "integer"}, "why": {"type": "string"}},
        "required": ["answer", "why"],
        "additionalProperties": False,
    }))
    code, out, err = _cli(["run", "--output-schema", str(schema), "What is 12 + 30?"])
    assert code == 0, err
    objects = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(objects) == 1, out  # the validated object, once (the raw reply text is not echoed)
    assert objects[0]["answer"] == 42 and "42" in objects[0]["why"]
    code, out, err = _cli(["run", "--json", "--output-schema", str(schema), "What is 12 + 30?"])
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[-1]["type"] == "output_value" and lines[-1]["value"]["answer"] == 42


def test_cli_output_schema_that_is_missing_or_not_an_object_is_a_usage_error(tmp_path: Any) -> None:
    bad = tmp_path / "list.json"
    bad.write_text("[1, 2]")
    for path in (str(tmp_path / "missing.json"), str(bad)):
        code, out, err = _cli(["run", "--output-schema", path, "x"])
        assert code == 2 and out == "" and f"--output-schema {path}" in err


def test_cli_output_schema_the_run_would_refuse_is_a_usage_error_before_any_model_call(tmp_path: Any) -> None:
    bad = tmp_path / "bad_type.json"
    bad.write_text('{"type": "nonsense"}')
    code, out, err = _cli(["run", "--output-schema", str(bad), "What is 2 + 3?"])
    assert code == 2 and out == "", err  # no tool call, no answer, no summary: the model was never asked
    assert f"--output-schema {bad}: output_type schema is not a valid JSON Schema: at #/type, type 'nonsense'" in err


def test_the_cli_view_says_when_an_answer_does_not_fit() -> None:
    import io

    from loopctl.demo.view import Console, LiveView

    out = io.StringIO()
    view = LiveView(Console(out, io.StringIO(), color=False, tty=False), streaming=True)
    view.on_output_validation_failed(OutputValidationFailed("s", "r", 0, ("field 'x' is missing",), 1, 3))
    view.on_output_validation_failed(OutputValidationFailed("s", "r", 2, ("not valid JSON",), 3, 3))
    lines = out.getvalue().splitlines()
    assert lines == [
        "  [answer does not fit: field 'x' is missing; asking again (1/3)]",
        "  [answer does not fit: not valid JSON; giving up (3/3)]",
    ]


def test_a_request_routed_to_a_fallback_model_keeps_the_answer_shape() -> None:
    from loopctl import ModelError, RequestOptions
    from loopctl.fallback import FallbackManager

    client = ScriptedClient([ModelError("primary down"), reply('{"result": 3}')], model="primary")
    fb = FallbackManager("primary", ["backup"], trip_threshold=0)
    with BareLoop(client).with_fallback(fb) as loop:
        loop.set_request_options(RequestOptions(temperature=0.5))
        with pytest.raises(ModelError):
            loop.run("n?", output_type=int)
        run = loop.run("n?", output_type=int)
    assert run.output_value == 3
    opts = client.requests[1].options
    assert opts.model == "backup" and opts.temperature == 0.5
    assert opts.response_format["json_schema"]["schema"]["required"] == ["result"]


def test_output_type_through_run_config_and_start_and_the_argument_wins() -> None:
    rome = '{"name": "Rome", "population": 3}'
    client = ScriptedClient([reply('{"name": "Oslo", "population": 7}'), reply(rome), reply('{"result": 5}')])
    with BareLoop(client) as loop:
        assert loop.run("a", RunConfig(output_type=City)).output_value == City("Oslo", 7)
        assert loop.start("b", output_type=City).result(10).output_value == City("Rome", 3)
        # The keyword argument overrides the config's type for that run.
        assert loop.run("c", RunConfig(output_type=City), output_type=int).output_value == 5


def test_a_class_made_by_exec_d_code_is_an_answer_type() -> None:
    # Its module is in no sys.modules (a docs snippet, a notebook cell runner):
    # Python 3.9's get_type_hints looked it up there and failed.
    namespace: dict[str, Any] = {"__name__": "made_by_exec"}
    exec(
        "import attrs\n@attrs.frozen\nclass Town:\n    name: str\n    population: int\n",
        namespace,
    )
    town = namespace["Town"]
    assert town.__module__ == "made_by_exec"
    with BareLoop(ScriptedClient([reply('{"name": "Hamar", "population": 31000}')])) as loop:
        assert loop.run("town?", output_type=town).output_value == town("Hamar", 31000)
