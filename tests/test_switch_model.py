"""``BareLoop.switch_model(name)``: a manual model switch between runs (SPEC §8).

True when the client accepted the name, and the next request goes to that
model; ``on_model_switched(from, to)`` exactly once per change (never for
the same name); False, with nothing changed, for a client that has no
``set_model`` or refuses; ``ConfigError`` for an empty name and while a run
is in flight; with a ``FallbackManager`` the new name becomes the primary
(breaker reset, requests routed to it). One test goes over real HTTP to
check the wire: the ``model`` field of the request body.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

import pytest
from fakeserver import FakeServer, Stream, openai_stream
from support import WAIT, Recorder

from loopctl import BareLoop, ConfigError, ModelError
from loopctl.fallback import FallbackManager
from loopctl.messages import ModelRequest, ModelResponse
from loopctl.observers import ModelSwitched
from loopctl.providers import OpenAIClient, StreamHandler
from loopctl.testing import ScriptedClient, call, reply
from loopctl.tools import Tool, ToolContext


class Provider:
    """The fake model behind a ScriptedClient: serves the routed model, like a real API.

    A request goes to ``request.options.model`` when set, else to the
    client's model. Models in ``down`` fail; every request is logged as
    ``(model the request went to, the client's model, options.model)``.
    """

    def __init__(self, client_model: Callable[[], str], down: tuple[str, ...] = ()) -> None:
        self.client_model = client_model
        self.down = set(down)
        self.log: list[tuple[str, str, Optional[str]]] = []

    def __call__(self, request: ModelRequest) -> ModelResponse:
        override = request.options.model if request.options is not None else None
        model = override or self.client_model()
        self.log.append((model, self.client_model(), override))
        if model in self.down:
            raise ModelError(f"{model} is down")
        r = reply(f"served by {model}")
        return ModelResponse(r.message, r.stop_reason, r.usage, model)

    @property
    def targets(self) -> list[str]:
        return [t for t, _, _ in self.log]


def scripted(model: str = "alpha", down: tuple[str, ...] = (), n: int = 20) -> tuple[ScriptedClient, Provider]:
    client = ScriptedClient([], model=model)
    provider = Provider(lambda: client.model, down)
    client.extend([provider] * n)
    return client, provider


def new_loop(client: Any, mode: str = "non_streaming") -> tuple[BareLoop, Recorder]:
    rec = Recorder()
    loop = BareLoop(client).with_observer(rec)
    loop.set_turn_mode(mode)
    if mode == "streaming":
        loop.set_stream_handler(StreamHandler.passthrough())
    return loop, rec


# -- a plain switch --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["non_streaming", "streaming"])
def test_switch_returns_true_and_the_next_request_goes_to_the_new_model(mode: str) -> None:
    client, provider = scripted("alpha")
    loop, rec = new_loop(client, mode)
    with loop:
        assert loop.run("one").output == "served by alpha"
        assert loop.switch_model("beta") is True
        assert client.model == "beta"
        assert loop.run("two").output == "served by beta"
        assert loop.run("three").output == "served by beta"
    assert provider.targets == ["alpha", "beta", "beta"]
    # The client itself was switched: no per-request override is needed.
    assert [o for _, _, o in provider.log] in ([None] * 3, [None, "beta", "beta"])
    assert rec.served() == ["alpha", "beta", "beta"]
    assert rec.switches() == [("alpha", "beta")]


def test_model_switched_fires_once_per_change_and_never_for_the_same_name() -> None:
    client, _ = scripted("alpha")
    loop, rec = new_loop(client)
    with loop:
        assert loop.switch_model("beta") is True
        assert rec.switches() == [("alpha", "beta")]
        assert loop.switch_model("beta") is True  # accepted, but nothing changed
        assert rec.switches() == [("alpha", "beta")]
        assert loop.switch_model("gamma") is True
        assert loop.switch_model("alpha") is True
        loop.run("x")
        loop.run("y")  # runs on the switched model add no switch of their own
    assert rec.switches() == [("alpha", "beta"), ("beta", "gamma"), ("gamma", "alpha")]
    assert all(e.session_id == loop.session.id for e in rec.of(ModelSwitched))
    assert rec.served() == ["alpha", "alpha"]


def test_switch_over_http_changes_the_model_in_the_request_body() -> None:
    with FakeServer() as server:
        client = OpenAIClient("gpt-a", api_key="sk-test-0000000000", base_url=server.openai_url)
        server.push(Stream(openai_stream("from a", model="gpt-a")), Stream(openai_stream("from b", model="gpt-b")))
        loop, rec = new_loop(client, "streaming")
        with loop:
            assert loop.run("one").output == "from a"
            assert loop.switch_model("gpt-b") is True
            assert client.model == "gpt-b"
            assert loop.run("two").output == "from b"
        assert [r.json["model"] for r in server.requests] == ["gpt-a", "gpt-b"]
        assert rec.switches() == [("gpt-a", "gpt-b")]
        assert rec.served() == ["gpt-a", "gpt-b"]


# -- refusals ---------------------------------------------------------------------------------


class NoSetModel:
    """A client with ``model``, ``complete`` and ``stream`` but no ``set_model``."""

    def __init__(self, inner: ScriptedClient) -> None:
        self.inner = inner

    @property
    def model(self) -> str:
        return self.inner.model

    def complete(self, request: ModelRequest) -> ModelResponse:
        return self.inner.complete(request)

    def stream(self, request: ModelRequest) -> Any:
        return self.inner.stream(request)


class Refuses(NoSetModel):
    """A client whose ``set_model`` says no."""

    def __init__(self, inner: ScriptedClient) -> None:
        super().__init__(inner)
        self.asked: list[str] = []

    def set_model(self, name: str) -> bool:
        self.asked.append(name)
        return False


@pytest.mark.parametrize("kind", [NoSetModel, Refuses], ids=["no_set_model", "set_model_false"])
def test_a_client_that_cannot_switch_returns_false_and_nothing_changes(kind: type) -> None:
    inner, provider = scripted("alpha", down=("alpha",))
    client = kind(inner)
    clock = [0.0]
    fb = FallbackManager("alpha", ["backup"], trip_threshold=1, clock=lambda: clock[0])
    loop, rec = new_loop(client)
    loop.set_fallback(fb)
    with loop:
        with pytest.raises(ModelError):
            loop.run("trips the breaker")
        assert fb.state == "fallback"
        assert loop.switch_model("beta") is False
        assert client.model == "alpha"
        assert fb.primary == "alpha" and fb.state == "fallback"  # not reset, not re-pointed
        assert loop.run("still on the backup").output == "served by backup"
    if isinstance(client, Refuses):
        assert client.asked == ["beta"]
    assert provider.targets == ["alpha", "backup"]
    assert ("alpha", "beta") not in rec.switches()
    assert all(to != "beta" for _, to in rec.switches())


@pytest.mark.parametrize("bad", ["", " ", "\t\n", None, 3])
def test_an_empty_or_non_str_name_raises_config_error(bad: Any) -> None:
    client, _ = scripted("alpha")
    loop, rec = new_loop(client)
    with loop:
        with pytest.raises(ConfigError) as info:
            loop.switch_model(bad)
        assert repr(bad) in str(info.value)
        assert client.model == "alpha"
        assert loop.run("x").output == "served by alpha"
    assert rec.switches() == []


class Gated(Tool):
    name = "gated"
    description = "Blocks until released."

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def call(self, input: Any, ctx: ToolContext) -> str:
        self.entered.set()
        assert self.release.wait(WAIT), "tool never released"
        return "released"


@pytest.mark.parametrize("phase", ["model_call", "tool_call"])
def test_switching_while_a_run_is_in_flight_raises_and_changes_nothing(phase: str) -> None:
    entered = threading.Event()
    release = threading.Event()
    tool = Gated()

    def gated_model(request: ModelRequest) -> ModelResponse:
        entered.set()
        assert release.wait(WAIT), "model call never released"
        return reply("answered")

    script: list[Any] = [gated_model] if phase == "model_call" else [call("gated"), reply("answered")]
    client = ScriptedClient(script, model="alpha")
    fb = FallbackManager("alpha", ["backup"])
    rec = Recorder()
    loop = BareLoop(client, [tool]).with_observer(rec).with_fallback(fb)
    with loop:
        handle = loop.start("in flight")
        gate_entered, gate_release = (entered, release) if phase == "model_call" else (tool.entered, tool.release)
        try:
            assert gate_entered.wait(WAIT)
            with pytest.raises(ConfigError, match="in flight"):
                loop.switch_model("beta")
            assert client.model == "alpha" and fb.primary == "alpha"
        finally:
            gate_release.set()
        assert handle.result(WAIT).output == "answered"
        assert rec.switches() == []
        assert rec.served()[-1] == "alpha"
        assert loop.switch_model("beta") is True  # allowed again once the run ended
    assert rec.switches() == [("alpha", "beta")]


# -- with a FallbackManager ----------------------------------------------------------------------


def test_with_fallback_the_new_name_becomes_the_primary() -> None:
    client, provider = scripted("alpha")
    fb = FallbackManager("alpha", ["backup"])
    loop, rec = new_loop(client)
    loop.set_fallback(fb)
    with loop:
        loop.run("one")
        assert loop.switch_model("gamma") is True
        assert fb.primary == "gamma" and fb.state == "primary"
        assert fb.fallbacks == ("backup",)
        loop.run("two")
        loop.run("three")
    assert provider.targets == ["alpha", "gamma", "gamma"]
    assert rec.served() == ["alpha", "gamma", "gamma"]
    assert rec.switches() == [("alpha", "gamma")]  # routing to it adds no second event


def test_switching_while_tripped_resets_the_breaker_and_routes_to_the_new_primary() -> None:
    clock = [0.0]
    client, provider = scripted("alpha", down=("alpha",))
    fb = FallbackManager("alpha", ["backup"], trip_threshold=1, clock=lambda: clock[0])
    loop, rec = new_loop(client)
    loop.set_fallback(fb)
    with loop:
        with pytest.raises(ModelError, match="alpha is down"):
            loop.run("trips")
        assert loop.run("on the backup").output == "served by backup"
        assert fb.state == "fallback"
        assert loop.switch_model("gamma") is True
        assert fb.primary == "gamma" and fb.state == "primary"  # the breaker was reset
        assert loop.run("on the new primary").output == "served by gamma"
        assert loop.run("and again").output == "served by gamma"
        assert fb.state == "primary"
    assert provider.targets == ["alpha", "backup", "gamma", "gamma"]
    # The switched client is not overridden back to anything else.
    assert [o for _, _, o in provider.log][2:] in ([None, None], ["gamma", "gamma"])
    assert rec.served() == ["backup", "gamma", "gamma"]
    switches = rec.switches()
    assert switches[0] == ("alpha", "backup")  # routing to the backup
    assert [to for _, to in switches] == ["backup", "gamma"]  # one event per change


def test_model_switched_events_chain_from_the_model_that_was_serving() -> None:
    clock = [0.0]
    client, _ = scripted("alpha", down=("alpha",))
    fb = FallbackManager("alpha", ["backup"], trip_threshold=1, clock=lambda: clock[0])
    loop, rec = new_loop(client)
    loop.set_fallback(fb)
    with loop:
        with pytest.raises(ModelError):
            loop.run("trips")
        loop.run("on the backup")
        loop.switch_model("gamma")
        loop.run("on the new primary")
    # Each change starts where the previous one ended: alpha -> backup -> gamma.
    assert rec.switches() == [("alpha", "backup"), ("backup", "gamma")]
