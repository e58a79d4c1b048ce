"""One way to configure a loop: chained ``with_*`` calls.

The in-place names the docs taught first are thin aliases (they return
None and configure exactly what their ``with_*`` form does); the other
``set_*`` names of earlier releases warn with a ``DeprecationWarning`` that
names the replacement, then configure the loop the same way. The loop's
public surface is the ``with_*`` chain plus those aliases, nothing else.
"""

from __future__ import annotations

import warnings

import pytest

from loopctl import BareLoop, ConfigError, RequestOptions
from loopctl.driver.old_names import DEPRECATED_SETTERS
from loopctl.hooks import HookExecutor
from loopctl.testing import ScriptedClient, reply

ALIASES = {
    "register_observer": "with_observer",
    "set_turn_mode": "with_turn_mode",
    "set_memory": "with_memory",
    "add_contributor": "with_contributor",
    "set_stream_handler": "with_stream_handler",
    "set_text_streamer": "with_text_streamer",
}


def _loop() -> BareLoop:
    return BareLoop(ScriptedClient([reply("ok")]))


def test_every_with_call_returns_the_loop_so_they_chain() -> None:
    loop = _loop()
    options = RequestOptions(max_tokens=7)
    hooks = HookExecutor([])
    out = loop.with_turn_mode("non_streaming").with_request_options(options).with_hook_executor(hooks)
    assert out is loop
    assert loop._parts.turn_mode == "non_streaming"
    assert loop._parts.request_options is options
    assert loop._parts.hooks is hooks


def test_the_taught_aliases_return_none_and_configure_like_their_with_form() -> None:
    loop = _loop()
    assert loop.set_turn_mode("non_streaming") is None
    assert loop._parts.turn_mode == "non_streaming"
    streamed: list[str] = []
    assert loop.set_text_streamer(streamed.append) is None
    assert loop._parts.text_streamer == streamed.append
    with pytest.raises(ConfigError, match="'sideways'"):
        loop.set_turn_mode("sideways")


@pytest.mark.parametrize("old", sorted(DEPRECATED_SETTERS))
def test_an_old_setter_warns_naming_its_replacement(old: str) -> None:
    loop = _loop()
    with pytest.warns(DeprecationWarning, match=rf"{old}\(\) is deprecated; use {DEPRECATED_SETTERS[old]}\(\)"):
        setter = getattr(loop, old)
    assert callable(setter)


def test_an_old_setter_still_configures_the_loop_and_returns_none() -> None:
    loop = _loop()
    options = RequestOptions(max_tokens=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert loop.set_request_options(options) is None
        with pytest.raises(ConfigError, match="RequestOptions"):
            loop.set_request_options("not options")
    assert loop._parts.request_options is options


def test_an_old_setter_after_the_first_run_is_refused_like_its_with_form() -> None:
    loop = _loop()
    loop.run("hi")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(ConfigError, match=r"with_reflector\(\) must be called before the first run"):
            loop.set_reflector(object())


def test_an_unknown_attribute_is_still_an_attribute_error_naming_it() -> None:
    loop = _loop()
    with pytest.raises(AttributeError, match="set_colour"):
        loop.set_colour  # noqa: B018
    assert getattr(loop, "nothing_here", None) is None


def test_the_public_surface_is_the_with_chain_plus_the_taught_aliases() -> None:
    public = [n for n in dir(BareLoop) if not n.startswith("_")]
    setters = {n for n in public if n.startswith(("set_", "add_")) or n == "register_observer"}
    assert setters == set(ALIASES)
    for alias, target in ALIASES.items():
        assert target in public, alias
    assert not set(DEPRECATED_SETTERS) & set(public)
    assert len(public) <= 53, sorted(public)
