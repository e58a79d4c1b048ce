"""Every outlet x every producer: text a model, a tool or a server makes never carries a key out.

``test_redaction.py`` feeds the client's own key through each failure path of
the wire. This table feeds a key-shaped string (and the value of a client's
custom header, which looks like no key) through each producer of untrusted
text: the model's reply (streamed in 4-character pieces, so the key is split
across deltas), tool arguments (``tool_input_delta``), a tool's output, a
tool's exception, a typed answer that does not fit, a server's error body.
Every outlet is then searched: the error (str, repr, cause chain, traceback
with locals, pickle, ``error_to_dict``, ``.errors``, ``.raw_text``), every
event as an observer gets it and as ``to_dict()``, ``Run.to_dict()``, the
text streamer, OpenTelemetry spans with content recorded, the registry's
status and events, DEBUG logs, and ``loopctl run --json``.
"""

from __future__ import annotations

import io
import json
import logging
import pickle
import threading
import traceback
from typing import Any, Callable, Optional

import attrs
import pytest
from fakeserver import FakeServer, Item, Reply, Stream, openai_stream
from support import error_chain

from loopctl import BareLoop, LoopError, tool
from loopctl.demo.cli import main as cli_main
from loopctl.hosting.registry import RunRegistry
from loopctl.hosting.serialization import error_to_dict
from loopctl.providers import OpenAIClient

LEAK = "sk-SECRET-1234567"  # key-shaped: masked whoever says it
HEADER_VALUE = "team-SECRET-token-42"  # a client's custom header value: shaped like no key
MARKER = "SECRET"


@attrs.frozen
class Answer:
    """A typed answer."""

    value: int


@tool
def fetch(name: str) -> str:
    """Fetch a record."""
    return f"record for {name}: {LEAK}"


@tool
def explode(name: str) -> str:
    """Always fails."""
    raise ValueError(f"cannot open the vault with {LEAK}")


def _args(value: str) -> str:
    return json.dumps({"name": value})


@attrs.frozen
class Producer:
    """One producer of untrusted text: what the server sends for a run, and what the run has."""

    name: str
    script: Callable[[], list[Item]]
    tools: tuple[Any, ...] = ()
    output_type: Any = None
    fails: bool = False
    cli_argv: Optional[tuple[str, ...]] = None  # None: not a CLI path (its tools are not the demo's)


_TYPED_REPLY = json.dumps({"value": LEAK, LEAK: 1})

PRODUCERS = [
    Producer("the model's reply text", lambda: [Stream(openai_stream(f"your key is {LEAK} and {HEADER_VALUE}."))],
             cli_argv=()),
    Producer("tool arguments (tool_input_delta)", tools=(fetch,),
             script=lambda: [Stream(openai_stream(tool_calls=[("c1", "fetch", _args(LEAK))])),
                             Stream(openai_stream("done"))]),
    Producer("tool arguments to a demo tool (CLI)", cli_argv=(),
             script=lambda: [Stream(openai_stream(tool_calls=[("c1", "add", json.dumps({"a": LEAK, "b": 1}))])),
                             Stream(openai_stream("done"))]),
    Producer("tool output", tools=(fetch,),
             script=lambda: [Stream(openai_stream(tool_calls=[("c1", "fetch", _args("alice"))])),
                             Stream(openai_stream("done"))]),
    Producer("a tool's exception", tools=(explode,),
             script=lambda: [Stream(openai_stream(tool_calls=[("c1", "explode", _args("alice"))])),
                             Stream(openai_stream("done"))]),
    Producer("a typed answer that never fits", output_type=Answer, fails=True,
             script=lambda: [Stream(openai_stream(_TYPED_REPLY)) for _ in range(3)]),
    Producer("a server error body", fails=True, cli_argv=(),
             script=lambda: [Reply(400, {"error": {"message": f"bad request {LEAK} / {HEADER_VALUE}"}})]),
]


def _client(server: FakeServer) -> OpenAIClient:
    return OpenAIClient("m", api_key="sk-test-configured-0000", base_url=f"http://127.0.0.1:{server.port}/v1",
                        extra_headers={"x-team-token": HEADER_VALUE})


def _clean(where: str, text: Any) -> None:
    blob = text if isinstance(text, str) else repr(text)
    lines = [ln[:300] for ln in blob.splitlines() if MARKER in ln]
    assert not lines, f"a secret leaks through {where}: {lines[:3]}"


def _error_outlets(error: LoopError) -> None:
    for e in error_chain(error):
        _clean(f"str() of {type(e).__name__}", str(e))
        _clean(f"repr() of {type(e).__name__}", repr(e))
        for name, value in vars(e).items():
            if name != "run":
                _clean(f"{type(e).__name__}.{name}", repr(value))
    te = traceback.TracebackException(type(error), error, error.__traceback__, capture_locals=True)
    _clean("a traceback with frame locals", "".join(te.format()))
    _clean("the pickled error", pickle.dumps(error).decode("latin-1"))
    _clean("error_to_dict", json.dumps(error_to_dict(error), allow_nan=False))


def _otel() -> Any:
    otel = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from loopctl.contrib.otel import OTelObserver

    exporter = InMemorySpanExporter()
    provider = otel.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return OTelObserver(tracer_provider=provider, record_content=True), exporter, provider


@pytest.mark.parametrize("producer", PRODUCERS, ids=lambda p: p.name)
def test_no_untrusted_key_reaches_any_outlet(producer: Producer, server: FakeServer,
                                             caplog: pytest.LogCaptureFixture,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from support import Recorder

    caplog.set_level(logging.DEBUG)
    # 1. A run: its error or record, every event, the text streamer, the spans.
    server.push(*producer.script())
    recorder = Recorder()
    streamed: list[str] = []
    observer, exporter, provider = _otel()
    loop = BareLoop(_client(server), list(producer.tools))
    loop.register_observer(recorder)
    loop.register_observer(observer)
    loop.set_text_streamer(streamed.append)
    with loop:
        if producer.fails:
            with pytest.raises(LoopError) as info:
                loop.run("hi", output_type=producer.output_type)
            _error_outlets(info.value)
            run = info.value.run
        else:
            run = loop.run("hi", output_type=producer.output_type)
        _clean("Run.to_dict()", json.dumps(run.to_dict(), allow_nan=False))
        _clean("the Run record's output and turns", repr((run.output, run.turns)))
    events = recorder.snapshot()
    shown = "\n".join(repr(e) for e in events) + json.dumps([e.to_dict() for e in events], allow_nan=False)
    _clean("the events", shown)
    assert "<redacted>" in shown, "the producer's text never reached an event: not this path"
    _clean("the text streamer", "".join(streamed))
    provider.force_flush()
    _clean("the spans", "\n".join(s.to_json() for s in exporter.get_finished_spans()))
    provider.shutdown()

    # 2. The registry: status and events.
    server.push(*producer.script())
    registry = RunRegistry()
    loop = BareLoop(_client(server), list(producer.tools))
    try:
        rid = registry.start(loop, "hi", output_type=producer.output_type)
        try:
            registry.result(rid, timeout=20)
        except LoopError:
            pass
        _clean("RunRegistry.status", json.dumps(registry.status(rid).to_dict(), allow_nan=False))
        _clean("RunRegistry.events", json.dumps([ev for _, ev in registry.events(rid, timeout=5)]))
    finally:
        registry.close()
        loop.close()
    _clean("the DEBUG log", caplog.text)

    # 3. `loopctl run --json`: stdout and stderr.
    if producer.cli_argv is not None:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-configured-0000")
        for _ in range(3):
            server.push(*producer.script())
        out, err = io.StringIO(), io.StringIO()
        argv = ["run", "hi", "--json", "--provider", "openai", "--model", "m",
                "--base-url", f"http://127.0.0.1:{server.port}/v1", *producer.cli_argv]
        code = cli_main(argv, stdin=io.StringIO(""), stdout=out, stderr=err, env={})
        assert (code != 0) == producer.fails, (code, err.getvalue()[-500:])
        assert "<redacted>" in out.getvalue() + err.getvalue()
        _clean("`loopctl run --json` stdout", out.getvalue())
        _clean("`loopctl run --json` stderr", err.getvalue())


def test_the_producer_table_covers_each_producer_of_the_issue() -> None:
    names = " ".join(p.name for p in PRODUCERS)
    for producer in ("reply text", "tool arguments", "tool output", "typed answer", "server error"):
        assert producer in names


def test_a_log_line_quoting_a_key_is_masked_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    log = logging.getLogger("loopctl")
    log.warning("a tool said %s", LEAK)
    try:
        raise ValueError(f"the vault refused {LEAK}")
    except ValueError:
        log.exception("observer raised")
    assert caplog.text.count("<redacted>") >= 2
    _clean("the log", caplog.text)
    formatted = "\n".join(logging.Formatter().format(r) for r in caplog.records)
    _clean("the formatted records (tracebacks included)", formatted)


def test_keys_in_two_calls_arguments_streamed_interleaved_are_both_masked(server: FakeServer) -> None:
    from fakeserver import OA_DONE, oa_chunk
    from support import Recorder

    from loopctl.observers import ToolInputDelta

    args = [_args(f"{LEAK}-{i}") for i in range(2)]
    chunks = [oa_chunk({"tool_calls": [{"index": i, "id": f"c{i}", "type": "function",
                                        "function": {"name": "fetch", "arguments": ""}}]}) for i in range(2)]
    for at in range(0, max(len(a) for a in args), 3):  # the two calls' pieces alternate
        chunks += [oa_chunk({"tool_calls": [{"index": i, "function": {"arguments": a[at:at + 3]}}]})
                   for i, a in enumerate(args) if a[at:at + 3]]
    chunks += [oa_chunk({}, "tool_calls"), OA_DONE]
    server.push(Stream(chunks), Stream(openai_stream("done")))
    recorder = Recorder()
    with BareLoop(_client(server), [fetch]) as loop:
        loop.register_observer(recorder)
        loop.run("hi")
    deltas = recorder.of(ToolInputDelta)
    for i in range(2):
        joined = "".join(d.delta for d in deltas if d.call_id == f"c{i}")
        assert joined == _args("<redacted>"), joined


@tool(requires_approval=True)
def lookup(opts: dict[str, str], note: str) -> str:
    """Look a record up (a person approves each call).

    Args:
        opts: lookup options.
        note: why.
    """
    return "found"


def test_a_key_as_a_mapping_key_or_in_an_approval_is_masked_at_every_outlet() -> None:
    """A model may put a key where a name goes: as a mapping's key, not only its values.

    Also the pending approval's and the decision's JSON forms, which a web
    page serves as they are.
    """
    from support import WAIT

    from loopctl.events import EVENT_METHODS
    from loopctl.observers import ApprovalRequested, Observer
    from loopctl.testing import ScriptedClient, call, reply

    asked = threading.Event()
    seen: list[Any] = []

    class Watch(Observer):
        def record(self, event: Any) -> None:
            seen.append(event)
            if isinstance(event, ApprovalRequested):
                asked.set()

    for method in set(EVENT_METHODS.values()):
        setattr(Watch, method, Watch.record)

    args = {"opts": {LEAK: "v", "plain": LEAK}, "note": f"key {LEAK}"}
    loop = BareLoop(ScriptedClient([call("lookup", **args), reply("done")]), [lookup]).with_observer(Watch())
    reg = RunRegistry()
    try:
        rid = reg.start(loop, "look it up")
        assert asked.wait(WAIT)
        [pending] = reg.pending_approvals(rid)
        assert pending.arguments["opts"][LEAK] == "v"  # the person's object holds what the call runs with
        outlets: dict[str, Any] = {
            "PendingApproval.to_dict": pending.to_dict(),
            "RunStatus.to_dict while pending": reg.status(rid).to_dict(),
        }
        assert pending.to_dict()["arguments"]["opts"] == {"<redacted>": "v", "plain": "<redacted>"}
        assert reg.approve(rid, pending.call_id, by=f"ops {LEAK}")
        run = reg.result(rid, WAIT)
        outlets["Run.to_dict"] = run.to_dict()
        outlets["the turns' records"] = repr(run.turns)
        outlets["the approvals' records"] = repr(run.approvals)
        outlets["ApprovalDecision.to_dict"] = [d.to_dict() for d in run.approvals]
        outlets["RunStatus.to_dict"] = reg.status(rid).to_dict()
        outlets["registry events"] = list(reg.events(rid, timeout=0))
        outlets["observer events"] = [e.to_dict() for e in seen]
    finally:
        reg.close()
    assert run.output == "done"
    for where, value in outlets.items():
        text = value if isinstance(value, str) else json.dumps(value, default=repr)
        assert MARKER not in text, f"a key reaches {where}: {text[:400]}"


def test_the_approval_record_is_kept_masked_while_the_call_and_the_model_get_what_was_given() -> None:
    """``Run.approvals`` is kept masked, as ``Run.output`` and the turns are (their reprs too).

    The decision itself stays whole: the approved call runs with the edited
    arguments the person gave, and the model reads the whole deny reason;
    ``Run.input`` too is kept whole (what the model is given).
    """
    from support import WAIT

    from loopctl.observers import ApprovalRequested, Observer
    from loopctl.testing import ScriptedClient, calls, reply

    asked = threading.Event()
    got: list[str] = []

    class Asked(Observer):
        def on_approval_requested(self, event: ApprovalRequested) -> None:
            asked.set()

    @tool(requires_approval=True, concurrency_safe=True)
    def note(text: str) -> str:
        """Keep a note (a person approves each call).

        Args:
            text: the note.
        """
        got.append(text)
        return "noted"

    script = [calls(("note", {"text": "a"}), ("note", {"text": "b"})), reply(f"done {LEAK}")]
    with BareLoop(ScriptedClient(script), [note]).with_observer(Asked()) as loop:
        handle = loop.start(f"take notes {LEAK}")
        assert asked.wait(WAIT)
        first, second = handle.pending_approvals()
        assert handle.approve(first.call_id, by=f"ops {LEAK}", arguments={"text": f"edited {LEAK}"})
        assert handle.deny(second.call_id, f"user pasted {LEAK}")
        run = handle.result(WAIT)
        results = [r.output for m in loop.conversation() for r in m.tool_results]
    assert got == [f"edited {LEAK}"]  # the call ran with the arguments the person gave
    assert results == ["noted", f"the user denied this call: user pasted {LEAK}"]  # the model reads them whole
    assert run.output == "done <redacted>"
    approved, denied = sorted(run.approvals, key=lambda d: not d.approved)
    assert (approved.by, approved.arguments) == ("ops <redacted>", {"text": "edited <redacted>"})
    assert denied.reason == "user pasted <redacted>"
    assert MARKER not in repr(run.approvals)
    # The input is what the model is given: kept whole, masked at every outlet.
    assert (run.input, run.to_dict()["input"]) == (f"take notes {LEAK}", "take notes <redacted>")
