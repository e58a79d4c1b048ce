"""Scaffolding shared by the tests (and the cancel benchmark): gates, recorders, small fakes.

What lives here is what several test files used to define for themselves:
the gate that opens an exact window, the observer that keeps every event,
the ``echo`` tool, thread starts and joins, a settable clock, the model
request and stream collector of the provider tests. Where the copies
differed, the difference is a parameter (``Gate(strict=...)``,
``FakeClock(start)``) or a small subclass in the test file. Test files
import it as ``from support import ...`` (``tests/conftest.py`` puts this
folder on ``sys.path``); ``benchmarks/cancel_latency.py`` imports it as
``tests.support``.

Rules it keeps: it imports only the standard library and ``loopctl`` (no
pytest, no fake server), so both import paths work anywhere; nothing here
sleeps to synchronise — every wait is on an ``Event`` and bounded by
``WAIT``, and reaching that bound is a failure, not a timing.
"""

from __future__ import annotations

import json
import threading
import time
import types
from collections.abc import Iterable, Iterator, Mapping
from functools import partial
from typing import Any, Callable, Optional

from loopctl.context.tokens import HeuristicTokenCounter
from loopctl.demo.tools import AddTool
from loopctl.errors import ModelError
from loopctl.messages import Message, ModelRequest, ModelResponse, ToolSchema
from loopctl.observers import (
    EVENT_METHODS,
    Event,
    Fallback,
    ModelSwitched,
    Observer,
    RunEnd,
    StreamFailure,
    StreamSuccess,
)
from loopctl.providers import AnthropicClient, OpenAIClient
from loopctl.providers.base import StreamAccumulator
from loopctl.tools import Tool, ToolContext

WAIT = 10.0  # a generous bound on every wait; reaching it is a failure, not a timing

# -- gates ------------------------------------------------------------------------------


class Gate:
    """One exact window: the gated code enters, blocks, and waits to be released.

    The gated code (a tool, a scripted model call, a memory lookup...) calls
    ``pass_through()`` on the run's thread; the test waits for it with
    ``wait_entered()`` and lets it go with ``open()``. A release that does not
    come within ``WAIT`` fails the gated code — unless ``strict`` is false,
    when it carries on regardless (the benchmarks' windows, where nobody would
    see the failure of an abandoned run thread).
    """

    def __init__(self, strict: bool = True) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.strict = strict

    def pass_through(self) -> None:
        """Called by the gated code (on the run's thread): signal entry, wait for release."""
        self.entered.set()
        released = self.release.wait(WAIT)
        if self.strict:
            assert released, "gate never released"

    def wait_entered(self) -> None:
        """The test's side: block until the gated code has entered (fails after ``WAIT``)."""
        assert self.entered.wait(WAIT), "gated code never entered"

    def open(self) -> None:
        """Release the gated code (and any later pass through this gate)."""
        self.release.set()


def gated(gate: Gate, response: ModelResponse) -> Callable[[ModelRequest], ModelResponse]:
    """A ``ScriptedClient`` script item: the model call passes through ``gate``, then answers."""

    def item(request: ModelRequest) -> ModelResponse:
        gate.pass_through()
        return response

    return item


class GatedReply:
    """A ``ScriptedClient`` script item: the model call blocks until released, then answers.

    Keeps the request it was called with. A release that does not come
    within ``WAIT`` fails the model call with ``ModelError``.
    """

    def __init__(self, response: ModelResponse) -> None:
        self.response = response
        self.entered = threading.Event()
        self.release = threading.Event()
        self.request: Optional[ModelRequest] = None

    def __call__(self, request: ModelRequest) -> ModelResponse:
        self.request = request
        self.entered.set()
        if not self.release.wait(WAIT):
            raise ModelError("gate never released")
        return self.response

    def wait_entered(self) -> None:
        """Block until the run has reached the gated model call (fails after ``WAIT``)."""
        assert self.entered.wait(WAIT), "the run never reached the gated model call"


class GatedAdd(AddTool):
    """The demo ``add`` tool, holding each call until ``gate`` is set (at most 10 s)."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self.gate = gate

    def call(self, input: Any, ctx: ToolContext) -> str:
        assert self.gate.wait(10)
        return super().call(input, ctx)


# -- observing a run ----------------------------------------------------------------------


class Recorder(Observer):
    """Every event, thread-safely, in arrival order, with when and on which thread it came.

    ``events``, ``times`` (``time.perf_counter()`` at arrival) and ``threads``
    (the emitting thread's name) are parallel lists; ``run_ended`` is set by
    each ``RunEnd``. Read them under ``lock`` while a run may still emit, or
    use the accessors, which do (the model ones tell the fallback / switch
    story: who served, who failed, which switches happened).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[Event] = []
        self.times: list[float] = []
        self.threads: list[str] = []
        self.run_ended = threading.Event()
        for name in EVENT_METHODS.values():
            setattr(self, name, self._record)

    def _record(self, event: Event) -> None:
        with self.lock:
            self.events.append(event)
            self.times.append(time.perf_counter())
            self.threads.append(threading.current_thread().name)
        if isinstance(event, RunEnd):
            self.run_ended.set()

    def clear(self) -> None:
        """Forget everything recorded so far."""
        with self.lock:
            self.events.clear()
            self.times.clear()
            self.threads.clear()

    def types(self) -> list[type]:
        """The classes of the events so far, in order."""
        with self.lock:
            return [type(e) for e in self.events]

    def snapshot(self) -> list[Event]:
        """A copy of the events so far."""
        with self.lock:
            return list(self.events)

    def of(self, kind: type) -> list[Any]:
        """The events so far that are instances of ``kind``, in order."""
        with self.lock:
            return [e for e in self.events if isinstance(e, kind)]

    def count(self, kind: type) -> int:
        """How many events so far are instances of ``kind``."""
        return len(self.of(kind))

    def fallbacks(self) -> list[tuple[str, str]]:
        """``(from_model, to_model)`` of each ``Fallback`` so far."""
        return [(e.from_model, e.to_model) for e in self.of(Fallback)]

    def switches(self) -> list[tuple[str, str]]:
        """``(from_model, to_model)`` of each ``ModelSwitched`` so far."""
        return [(e.from_model, e.to_model) for e in self.of(ModelSwitched)]

    def served(self) -> list[str]:
        """The model of each ``StreamSuccess`` so far (who served each call)."""
        return [e.model for e in self.of(StreamSuccess)]

    def failed(self) -> list[str]:
        """The model of each ``StreamFailure`` so far."""
        return [e.model for e in self.of(StreamFailure)]


# -- tools and other fakes ---------------------------------------------------------------


class Echo(Tool):
    """``echo(x)`` answers ``echo:<x>``; counts its calls and keeps every context it got.

    ``hook(input, ctx)``, when given, runs inside each call before the answer
    (a gate, a probe of the context, a slow phase...).
    """

    name = "echo"
    description = "Echo."

    def __init__(self, hook: Optional[Callable[[Any, ToolContext], None]] = None) -> None:
        self.hook = hook
        self.calls = 0
        self.contexts: list[ToolContext] = []

    def call(self, input: Any, ctx: ToolContext) -> str:
        self.calls += 1
        self.contexts.append(ctx)
        if self.hook is not None:
            self.hook(input, ctx)
        return f"echo:{input.get('x')}"


class Echoed(Tool):
    """``echo`` that answers ``"echoed"`` whatever its input."""

    name = "echo"
    description = "Echo back."

    def call(self, input: Any, ctx: ToolContext) -> Any:
        return "echoed"


class CountingCounter(HeuristicTokenCounter):
    """The heuristic token counter, counting how many messages it was asked to count."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def count_message(self, message: Message) -> int:
        self.calls += 1
        return super().count_message(message)


class FakeClock:
    """A clock the test sets: calling it returns ``now`` (``start`` at first; assign to move it)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


# -- threads ----------------------------------------------------------------------------


def run_in_thread(fn: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    """Start ``fn`` on a new thread: (the thread, the list that will hold what it raised).

    The caller joins the thread and checks the list.
    """
    errors: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # surfaced by the caller
            errors.append(exc)

    t = threading.Thread(target=target)
    t.start()
    return t, errors


def run_in_threads(fn: Callable[..., None], args: Iterable[tuple[Any, ...]]) -> list[BaseException]:
    """Run ``fn(*a)`` on one thread for each ``a`` in ``args``, all at once; join every one
    (no timeout) and return what they raised."""
    started = [run_in_thread(partial(fn, *a)) for a in args]
    for t, _ in started:
        t.join()
    return [exc for _, errors in started for exc in errors]


def join_threads(*prefixes: str, check: bool = True) -> None:
    """Join every live thread whose name starts with one of ``prefixes`` (``WAIT`` s each).

    With ``check``, a thread still alive afterwards fails the test.
    """
    for t in threading.enumerate():
        if t.name.startswith(prefixes):
            t.join(WAIT)
            if check:
                assert not t.is_alive(), f"{t.name} did not exit"


def run_thread_prefix(run_id: str) -> str:
    """The name prefix of the body thread of the run ``run_id``."""
    return f"loopctl-run-{run_id[:12]}"


def join_run_threads(*run_ids: str, check: bool = True) -> None:
    """Wait for the body threads of ``run_ids`` to exit (an abandoned one, once released)."""
    join_threads(*(run_thread_prefix(r) for r in run_ids), check=check)


def join_loop_threads(loop: Any) -> None:
    """Wait for the body threads of every run ``loop`` has had to exit."""
    join_run_threads(*(run.id for run in loop.session.runs))


# -- data -------------------------------------------------------------------------------


def texts(messages: Iterable[Any]) -> list[str]:
    """The text of each message, given as ``Message`` objects or as their dicts."""
    out: list[str] = []
    for m in messages:
        d = m if isinstance(m, dict) else m.to_dict()
        out.append("".join(p.get("text", "") for p in d["parts"]))
    return out


def via_json(data: Any) -> Any:
    """``data`` after a round trip through JSON text."""
    return json.loads(json.dumps(data))


# -- provider clients -------------------------------------------------------------------

TOOL_SCHEMAS = (
    ToolSchema("read_file", "Read a file.", {"type": "object", "properties": {"path": {"type": "string"}}}),
    ToolSchema("grep", "Search.", {"type": "object", "properties": {"pattern": {"type": "string"}}}),
)


def hi_request(**kw: Any) -> ModelRequest:
    """``ModelRequest`` of one user message "hi" and the system prompt "Be brief."."""
    return ModelRequest([Message.user("hi")], "Be brief.", **kw)


def collect_stream(client: Any, request: ModelRequest) -> tuple[list[Any], Any]:
    """Stream ``request`` through ``client``: (every event, the assembled response).

    The stream is closed however the read ends.
    """
    acc = StreamAccumulator()
    events = []
    stream = client.stream(request)
    try:
        for ev in stream:
            events.append(ev)
            acc.feed(ev)
    finally:
        stream.close()
    return events, acc.build()


def error_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception in its ``__cause__`` / ``__context__`` chain, each once.

    An exception group's members are walked too. The tests walk the chain on
    their own, not with loopctl's scrubbing walk, so a walk the library gets
    wrong cannot hide a leak from them.
    """
    seen: set[int] = set()
    todo: list[Optional[BaseException]] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__, *getattr(e, "exceptions", ())]


def reachable_texts(root: object, depth: int = 6) -> Iterator[str]:
    """Every str (and bytes, as text) reachable from ``root`` through attributes, mappings and sequences.

    Bounded by ``depth`` and each object once: what a debugger, a logging
    formatter or an error tracker could read off an exception (a ``requests``
    error's request headers, a ``UnicodeError``'s text, a decoder's document).
    """
    seen: set[int] = set()
    todo: list[tuple[object, int]] = [(root, 0)]
    while todo:
        obj, level = todo.pop()
        if isinstance(obj, str):
            yield obj
            continue
        if isinstance(obj, (bytes, bytearray)):
            yield bytes(obj).decode("latin-1")
            continue
        if level > depth or id(obj) in seen or isinstance(obj, (type, types.ModuleType, types.FunctionType)):
            continue
        seen.add(id(obj))
        nxt = level + 1
        if isinstance(obj, Mapping):
            todo += [(x, nxt) for kv in obj.items() for x in kv]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo += [(x, nxt) for x in obj]
        if isinstance(obj, BaseException):
            todo += [(x, nxt) for x in obj.args]
            if isinstance(obj, UnicodeError):
                todo.append((getattr(obj, "object", None), nxt))
        try:
            fields = vars(obj)
        except TypeError:
            fields = {}
        todo += [(x, nxt) for x in fields.values()]
        for name in getattr(type(obj), "__slots__", ()):
            todo.append((getattr(obj, name, None), nxt))


# -- clients of the fake model server (tests/fakeserver.py) ------------------------------------

#: The API key the wire tests give their clients (key-shaped: masking tests look for it).
WIRE_KEY = "sk-test-abcdef0123456789"
#: ``StreamHandler`` arguments for retries without waits.
FAST_RETRIES: dict[str, float] = dict(base_delay=0.0, jitter=0.0, rate_limit_delay=0.0)


def openai_at(server: Any, **kw: Any) -> OpenAIClient:
    """An ``OpenAIClient`` of the fake server (``server.openai_url``), keyed with ``WIRE_KEY``."""
    return OpenAIClient("gpt-test", api_key=WIRE_KEY, base_url=server.openai_url, **kw)


def anthropic_at(server: Any, **kw: Any) -> AnthropicClient:
    """An ``AnthropicClient`` of the fake server, keyed with ``WIRE_KEY``."""
    return AnthropicClient("claude-test", api_key=WIRE_KEY, base_url=server.url, **kw)
