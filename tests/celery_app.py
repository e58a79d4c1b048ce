"""The Celery app and loop factories that test workers import (``celery -A tests.celery_app``).

A script cannot travel to another process, so the model here is a pure
function of the request: the run's input is ``PLAN {json}`` and the reply to
each request is decided by the plan and by how many assistant turns follow
the latest PLAN message. Plan keys (all optional but ``tag``):

- ``tag``: names the run's Redis signals (``t:<tag>:...``).
- ``turns``: model calls in the run (the last one answers; default 2).
- ``tool``: ``"echo"`` (returns the worker pid) or ``"work"`` (waits ``ms``).
- ``ms``: tool durations, one per turn (cycled).
- ``gate``: turns whose model call waits: it pushes the turn on
  ``t:<tag>:entered`` and waits on ``t:<tag>:release:<turn>`` (bounded).
- ``record``: push every request's turn, steer texts and clock on
  ``t:<tag>:requests`` (JSON).
- ``count``: ``INCR t:<tag>:tools`` per tool call (side-effect witness).
- ``tool: "pay"``: a tool that needs a person's approval; when it runs it
  counts itself and pushes its start clock on ``t:<tag>:paid``.
- ``tool_gate``: turns whose tool call waits: it pushes the turn on
  ``t:<tag>:tool_entered`` and waits on ``t:<tag>:tool_release:<turn>``.
- ``prep_gate``: turns whose request preparation waits (between turns:
  after the previous tool phase, before ``turn_start``): it pushes the turn
  on ``t:<tag>:prep_entered`` and waits on ``t:<tag>:prep_release:<turn>``.
- ``end_gate`` (factory ``make_end_gated_loop``): the run's ``on_run_end``
  observer waits, past the run's ending point and before its end is
  recorded: it pushes 0 on ``t:<tag>:end_entered`` and waits on
  ``t:<tag>:end_release:0``.
- ``cancel_self`` (with ``rid``, the run's id): the last model call cancels
  its own run through the worker's registry, with that reason, and pushes
  what ``cancel`` returned (``"True"``/``"False"``) on ``t:<tag>:cancelled``.

Every gate also sets ``t:<tag>:pid`` to the worker's pid (whom to kill), and
every tool run does ``HINCRBY t:<tag>:ran <tool>:<turn> 1`` (re-run witness).
``fetch`` is the idempotent twin of ``echo``.

Timing is gated by these Redis-visible signals, never by sleeps.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from typing import Any, Dict, List, Optional

import redis
from celery import Celery
from celery import signals as celery_signals

from loopctl import BareLoop, Message, ModelError, ModelRequest, ModelResponse, SessionConfig
from loopctl.contrib.celery import CeleryRunRegistry
from loopctl.testing import ScriptedClient, call, reply
from loopctl.tools import Tool, ToolContext

ENV_URL = "LOOPCTL_TEST_REDIS_URL"
OTEL_FILE_ENV = "LOOPCTL_TEST_OTEL_FILE"  # where make_traced_loop's worker writes its spans
GATE_WAIT_S = 20
HEARTBEAT_INTERVAL = 0.25
HEARTBEAT_TTL = 1.5

_clients: Dict[str, Any] = {}
_clients_lock = threading.Lock()


def signals() -> Any:
    """A Redis client for the test signals (the URL is read from the environment)."""
    url = os.environ.get(ENV_URL, "redis://127.0.0.1:1/0")
    with _clients_lock:
        client = _clients.get(url)
        if client is None:
            client = _clients[url] = redis.Redis.from_url(url, decode_responses=True, socket_timeout=30)
        return client


def plan_text(tag: str, **plan: Any) -> str:
    """The input of a planned run."""
    return "PLAN " + json.dumps({"tag": tag, **plan})


def _plan_of(messages: List[Message]) -> tuple[Dict[str, Any], List[Message]]:
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.role == "user" and m.text.startswith("PLAN "):
            return json.loads(m.text[5:]), messages[i + 1 :]
    raise ModelError("no PLAN message in the request")


def respond(request: ModelRequest) -> ModelResponse:
    """The deterministic model: its reply depends only on the request."""
    plan, after = _plan_of(list(request.messages))
    tag = plan["tag"]
    turn = sum(1 for m in after if m.role == "assistant")
    steers = [m.text for m in after if m.role == "user" and not m.tool_results]
    if plan.get("record"):
        entry = {"turn": turn, "steers": steers, "t": time.monotonic(), "pid": os.getpid()}
        signals().rpush(f"t:{tag}:requests", json.dumps(entry))
    if turn in plan.get("gate", ()):
        r = signals()
        r.set(f"t:{tag}:pid", os.getpid())
        r.rpush(f"t:{tag}:entered", turn)
        if r.blpop([f"t:{tag}:release:{turn}"], timeout=GATE_WAIT_S) is None:
            raise ModelError(f"gate {tag}:{turn} never released")
    turns = int(plan.get("turns", 2))
    if turn >= turns - 1:
        if "cancel_self" in plan:  # the cancel is stored before the run reaches its ending point
            ok = registry.cancel(plan["rid"], plan["cancel_self"])
            signals().rpush(f"t:{tag}:cancelled", str(ok))
        return reply(f"done {tag} turn={turn} steers={len(steers)}")
    ms = plan.get("ms") or [0]
    extra = {"hold": True} if turn in plan.get("tool_gate", ()) else {}
    return call(
        plan.get("tool", "echo"), i=turn, ms=ms[turn % len(ms)], tag=tag, count=bool(plan.get("count")), **extra
    )


def _gate(tag: str, kind: str, turn: int) -> None:
    r = signals()
    r.set(f"t:{tag}:pid", os.getpid())
    r.rpush(f"t:{tag}:{kind}_entered", turn)
    if r.blpop([f"t:{tag}:{kind}_release:{turn}"], timeout=GATE_WAIT_S) is None:
        raise RuntimeError(f"{kind} gate {tag}:{turn} never released")


def _plan_in(text: str) -> Dict[str, Any]:
    """The PLAN of a run's input ({} for any other input)."""
    return json.loads(text[5:]) if text.startswith("PLAN ") else {}


class Echo(Tool):
    """Returns the worker's pid (and counts itself when asked)."""

    name = "echo"
    description = "Echo the call back with the worker's pid."

    def input_schema(self) -> Mapping[str, Any]:
        return {"type": "object", "properties": {}, "additionalProperties": True}

    def call(self, input: Mapping[str, Any], ctx: ToolContext) -> Any:
        tag, turn = input.get("tag"), input.get("i")
        if tag is not None:
            signals().hincrby(f"t:{tag}:ran", f"{self.name}:{turn}", 1)
            if input.get("hold"):
                _gate(str(tag), "tool", int(turn))  # type: ignore[arg-type]
        if input.get("count"):
            signals().incr(f"t:{input['tag']}:tools")
        return {"i": input.get("i"), "pid": os.getpid()}


class Fetch(Echo):
    """``echo``, declared idempotent: a durable run may run it again after a crash."""

    name = "fetch"
    description = "Fetch (idempotent): echo the call back with the worker's pid."
    idempotent = True


class PrepGate:
    """A contributor that holds a turn's request preparation (the test's "between turns")."""

    def contribute(self, ctx: Any) -> None:
        plan = _plan_in(ctx.input)
        if ctx.turn in plan.get("prep_gate", ()):
            _gate(str(plan["tag"]), "prep", int(ctx.turn))
        return None


class EndGate:
    """An observer whose ``on_run_end`` holds a planned run between its ending point and its recorded end."""

    def __init__(self) -> None:
        self._plan: Dict[str, Any] = {}

    def on_run_start(self, event: Any) -> None:
        self._plan = _plan_in(event.input)

    def on_run_end(self, event: Any) -> None:
        if self._plan.get("end_gate"):
            _gate(str(self._plan["tag"]), "end", 0)


class Work(Tool):
    """Waits ``ms`` milliseconds (cancel-aware)."""

    name = "work"
    description = "Work for a while."

    def input_schema(self) -> Mapping[str, Any]:
        return {"type": "object", "properties": {}, "additionalProperties": True}

    def call(self, input: Mapping[str, Any], ctx: ToolContext) -> Any:
        if input.get("tag") is not None:
            signals().hincrby(f"t:{input['tag']}:ran", f"{self.name}:{input.get('i')}", 1)
        if input.get("count"):
            signals().incr(f"t:{input['tag']}:tools")
        ms = float(input.get("ms") or 0)
        if ms > 0:
            ctx.cancel.wait(ms / 1000.0)
        return "worked"


class Pay(Tool):
    """A side effect that waits for approval: pushes its start clock on ``t:<tag>:paid``."""

    name = "pay"
    description = "Pay (needs a person's approval)."
    requires_approval = True

    def input_schema(self) -> Mapping[str, Any]:
        return {
            "type": "object",
            "properties": {"i": {"type": "integer"}, "tag": {"type": "string"}},
            "required": ["i", "tag"],
            "additionalProperties": True,
        }

    def call(self, input: Mapping[str, Any], ctx: ToolContext) -> Any:
        signals().rpush(f"t:{input['tag']}:paid", json.dumps({"t": time.monotonic(), "i": input.get("i")}))
        return "paid"


def make_loop(conversation: str, history: List[Message]) -> BareLoop:
    """The test factory: the deterministic model, echo, work and pay tools."""
    client = ScriptedClient([respond] * 100_000, chunk=32)
    return BareLoop.from_history(client, [Echo(), Work(), Pay()], SessionConfig(), history)


def make_durable_loop(conversation: str, history: List[Message]) -> BareLoop:
    """The resume tests' factory: ``make_loop`` plus ``fetch`` and the between-turns gate."""
    client = ScriptedClient([respond] * 100_000, chunk=32)
    loop = BareLoop.from_history(client, [Echo(), Fetch(), Work()], SessionConfig(), history)
    loop.add_contributor(PrepGate())
    return loop


def make_end_gated_loop(conversation: str, history: List[Message]) -> BareLoop:
    """``make_loop`` with the ``EndGate`` observer (plan key ``end_gate``)."""
    loop = make_loop(conversation, history)
    loop.register_observer(EndGate())
    return loop


def make_failing_loop(conversation: str, history: List[Message]) -> BareLoop:
    """A factory that fails once the test lets it: it pushes ``t:<conversation>:factory``, then
    waits for ``t:<conversation>:factory:go`` (at most 10 s) and raises."""
    sig = signals()
    sig.rpush(f"t:{conversation}:factory", "in")
    sig.blpop([f"t:{conversation}:factory:go"], timeout=10)
    raise RuntimeError("the loop factory broke")


def make_timed_loop(conversation: str, history: List[Message]) -> BareLoop:
    """``make_loop`` that also records when its steering slot accepts a push (benchmark)."""
    loop = make_loop(conversation, history)
    steering = loop.steering()
    push = steering.push
    key = f"t:{conversation}:accepted"

    def timed_push(message: Any) -> bool:
        ok = push(message)
        if ok:
            text = message.text if isinstance(message, Message) else str(message)
            signals().rpush(key, json.dumps({"t": time.monotonic(), "text": text}))
        return ok

    steering.push = timed_push  # type: ignore[method-assign]
    return loop


_tracing: List[Any] = []  # [TracerProvider] of this worker, made on first use


def _worker_tracer_provider() -> Any:
    """A tracer provider writing each finished span as one JSON line to ``$LOOPCTL_TEST_OTEL_FILE``."""
    with _clients_lock:
        if not _tracing:
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

            out = open(os.environ[OTEL_FILE_ENV], "a", encoding="utf-8")  # noqa: SIM115 - lives with the worker
            provider = TracerProvider()
            exporter = ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            _tracing.append(provider)
        return _tracing[0]


def make_traced_loop(conversation: str, history: List[Message]) -> BareLoop:
    """``make_loop`` with an ``OTelObserver`` exporting the worker's spans to a file."""
    from loopctl.contrib.otel import OTelObserver

    loop = make_loop(conversation, history)
    OTelObserver(tracer_provider=_worker_tracer_provider()).instrument(loop)
    return loop


def make_traced_durable_loop(conversation: str, history: List[Message]) -> BareLoop:
    """``make_durable_loop`` with an ``OTelObserver`` attached by ``register_observer`` (not ``instrument``)."""
    from loopctl.contrib.otel import OTelObserver

    loop = make_durable_loop(conversation, history)
    loop.register_observer(OTelObserver(tracer_provider=_worker_tracer_provider()))
    return loop


def make_forgetful_loop(conversation: str, history: List[Message]) -> BareLoop:
    """A broken factory that ignores the history (the worker must refuse it)."""
    return make_loop(conversation, [])


def make_offline_loop(conversation: str, history: List[Message]) -> BareLoop:
    """The offline demo model and its tools (typed answers: it fills the asked-for schema)."""
    from loopctl.demo.model import OfflineModel
    from loopctl.demo.tools import demo_tools

    return BareLoop.from_history(OfflineModel(), demo_tools(), SessionConfig(), history)


def make_app(url: str) -> Any:
    """A Celery app on the Redis at ``url`` (broker only; results are not stored)."""
    app = Celery("loopctl_tests", broker=url, set_as_current=False)
    app.conf.update(
        worker_prefetch_multiplier=1,
        task_acks_late=False,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=2,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        task_default_queue="celery",
    )
    return app


def make_registry(app: Any, url: str, factory: str = "tests.celery_app:make_loop", **kw: Any) -> CeleryRunRegistry:
    """A registry with the test timings (heartbeat 0.25 s, lapse after 1.5 s)."""
    kw.setdefault("heartbeat_interval", HEARTBEAT_INTERVAL)
    kw.setdefault("heartbeat_ttl", HEARTBEAT_TTL)
    return CeleryRunRegistry(app, url, factory, **kw)


REDIS_URL: Optional[str] = os.environ.get(ENV_URL)
app = make_app(REDIS_URL or "redis://127.0.0.1:1/0")
# The worker's registry: the task finds it by prefix (constructing it connects nothing).
registry = make_registry(
    app,
    REDIS_URL or "redis://127.0.0.1:1/0",
    drain_timeout=float(os.environ.get("LOOPCTL_TEST_DRAIN_S", "30")),
)


def _say_draining(how: object = None, **_: object) -> None:
    # Connected after loopctl's own receiver (made with the registry above), so
    # it runs after it: the tests release a gated call only once this line
    # shows the worker draining (a release before the signal was handled
    # would let the run pass its boundary on the leaving worker). os.write:
    # this runs in a signal handler, and Celery redirects sys.stdout.
    if how == "Warm":
        os.write(1, f"test-worker: warm shutdown, draining={registry._host.draining.is_set()}\n".encode())


celery_signals.worker_shutting_down.connect(_say_draining, weak=False)

# The workers' registry whose conversations live in the Redis session store
# (tests/test_sessions_celery.py); prefix and store must match the starter's.
SESSION_PREFIX = "loopsess"


def make_session_registry(app: Any, url: str) -> CeleryRunRegistry:
    """A registry keeping conversations in a ``RedisSessionStore`` on ``url``."""
    from loopctl.sessions import RedisSessionStore

    return make_registry(app, url, prefix=SESSION_PREFIX, session_store=RedisSessionStore(url))


session_registry = make_session_registry(app, REDIS_URL or "redis://127.0.0.1:1/0")
