"""Every configurable count, number and flag refuses a bad value with a ``ConfigError`` naming it.

The sweep reads each constructor's parameters (an attrs class's field
types, else the signature's annotations): every ``int``, ``float`` or
``bool`` parameter is fed values it must refuse, so a new one without a
check fails here. A refusal is a ``ConfigError`` whose message names the
class, the field and the value (``checks.shown``: an int of thousands of
digits as its sign and digit count); a value that may be valid (a huge
count, a huge duration, which is clamped) may pass, but never raises
anything else.
"""

from __future__ import annotations

import inspect
import math
import re
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

import attrs
import pytest

from loopctl import RunConfig, RunRegistry, SessionConfig
from loopctl.checks import SHOWN_LIMIT, shown
from loopctl.config import ParallelDispatch
from loopctl.context import (
    ContextManager,
    GoalReminder,
    HeuristicTokenCounter,
    InMemoryStore,
    SqliteMemoryStore,
    SummarizingCompactor,
    TruncatingCompactor,
)
from loopctl.demo.model import OfflineModel
from loopctl.detection import ConvergenceDetector, LoopDetector
from loopctl.errors import ConfigError
from loopctl.fallback import FallbackManager
from loopctl.providers import AnthropicClient, OpenAIClient
from loopctl.providers.stream_handler import StreamHandler
from loopctl.sessions import SQLiteSessionStore
from loopctl.tools.health import ToolHealthRegistry
from loopctl.tools.middleware import OutputLimitMiddleware, TimeoutMiddleware, UnknownToolMiddleware
from loopctl.tools.recovery import ExponentialBackoffRecovery

HUGE = 10**5000  # past the float range, and past the digits Python turns into a str
URL = "http://127.0.0.1:9"


class Case(NamedTuple):
    cls: type
    make: Callable[..., object]  # make(tmp_path, **field) builds one with that field set


def _celery_registry(tmp: Path, **kw: Any) -> object:
    from loopctl.contrib.celery import CeleryRunRegistry

    try:  # "no-colon" is refused after every other argument passed its check: nothing connects
        return CeleryRunRegistry(None, "redis://127.0.0.1:9/0", "no-colon", **kw)
    except ConfigError as exc:
        if "loop_factory" not in str(exc):
            raise
        return None


CASES: list[Case] = [
    Case(SessionConfig, lambda tmp, **kw: SessionConfig(**kw)),
    Case(RunConfig, lambda tmp, **kw: RunConfig(**kw)),
    Case(ParallelDispatch, lambda tmp, **kw: ParallelDispatch(**kw)),
    Case(StreamHandler, lambda tmp, **kw: StreamHandler(**kw)),
    Case(ContextManager, lambda tmp, **kw: ContextManager(TruncatingCompactor(), **kw)),
    Case(TruncatingCompactor, lambda tmp, **kw: TruncatingCompactor(**kw)),
    Case(SummarizingCompactor, lambda tmp, **kw: SummarizingCompactor(**kw)),
    Case(HeuristicTokenCounter, lambda tmp, **kw: HeuristicTokenCounter(**kw)),
    Case(GoalReminder, lambda tmp, **kw: GoalReminder(**kw)),
    Case(InMemoryStore, lambda tmp, **kw: InMemoryStore(**kw)),
    Case(SqliteMemoryStore, lambda tmp, **kw: SqliteMemoryStore(tmp / "memory.db", **kw)),
    Case(SQLiteSessionStore, lambda tmp, **kw: SQLiteSessionStore(tmp / "sessions.db", **kw)),
    Case(LoopDetector, lambda tmp, **kw: LoopDetector(**kw)),
    Case(ConvergenceDetector, lambda tmp, **kw: ConvergenceDetector(**kw)),
    Case(FallbackManager, lambda tmp, **kw: FallbackManager("a", ["b"], **kw)),
    Case(ToolHealthRegistry, lambda tmp, **kw: ToolHealthRegistry(**kw)),
    Case(ExponentialBackoffRecovery, lambda tmp, **kw: ExponentialBackoffRecovery(**kw)),
    Case(TimeoutMiddleware, lambda tmp, **kw: TimeoutMiddleware(**kw)),
    Case(OutputLimitMiddleware, lambda tmp, **kw: OutputLimitMiddleware(**{"max_chars": 10, **kw})),
    Case(UnknownToolMiddleware, lambda tmp, **kw: UnknownToolMiddleware(**kw)),
    Case(RunRegistry, lambda tmp, **kw: RunRegistry(**kw)),
    Case(OpenAIClient, lambda tmp, **kw: OpenAIClient("m", api_key="k", base_url=URL, **kw)),
    Case(AnthropicClient, lambda tmp, **kw: AnthropicClient("m", api_key="k", base_url=URL, **kw)),
    Case(OfflineModel, lambda tmp, **kw: OfflineModel(**kw)),
]
try:  # the [celery] extra: redis-py and Celery (neither connects before its arguments are checked)
    from loopctl.contrib.celery import CeleryRunRegistry
    from loopctl.sessions import RedisSessionStore

    CASES.append(Case(CeleryRunRegistry, _celery_registry))
    CASES.append(Case(RedisSessionStore, lambda tmp, **kw: RedisSessionStore("redis://127.0.0.1:9/0", **kw)))
except ImportError:
    pass


def kind_of(annotation: str) -> Optional[str]:
    """``"bool"``, ``"float"`` or ``"int"`` for a parameter the sweep feeds, else None."""
    if "Callable" in annotation:  # a clock returns a float: it is not one
        return None
    for kind in ("bool", "float", "int"):
        if re.search(rf"\b{kind}\b", annotation):
            return kind
    return None


def swept_fields(cls: type) -> list[tuple[str, str, bool]]:
    """(name, kind, None allowed) for each int, float or bool parameter of ``cls``."""
    # An attrs field with a converter has the converter's annotation in the signature: read the field's own.
    declared = {f.name: str(f.type) for f in attrs.fields(cls)} if attrs.has(cls) else {}
    out = []
    for p in inspect.signature(cls).parameters.values():
        annotation = declared.get(p.name, str(p.annotation))
        kind = kind_of(annotation)
        if kind is not None:
            out.append((p.name, kind, "Optional" in annotation or "None" in annotation))
    return out


#: Values no field of the kind takes, and values some fields may take.
REFUSED: dict[str, list[object]] = {
    "int": [math.nan, math.inf, -math.inf, -1, -HUGE, 1.5, "3", [1], 1j, True, False],
    "float": [math.nan, math.inf, -math.inf, -1, -0.5, -HUGE, "3", [1], 1j, True, False],
    "bool": [None, 0, 1, "yes", HUGE, math.nan],
}
MAYBE: dict[str, list[object]] = {"int": [HUGE], "float": [HUGE, 1.5], "bool": []}

SWEEP = [
    pytest.param(case, name, kind, optional, id=f"{case.cls.__name__}.{name}")
    for case in CASES
    for name, kind, optional in swept_fields(case.cls)
]


def close(obj: object) -> None:
    closer = getattr(obj, "close", None)
    if callable(closer):
        closer()


def outcome(case: Case, tmp: Path, name: str, value: object) -> Optional[str]:
    """None when accepted, the message of a ``ConfigError``; any other exception propagates."""
    try:
        close(case.make(tmp, **{name: value}))
    except ConfigError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize(("case", "name", "kind", "optional"), SWEEP)
def test_every_configured_number_and_flag_refuses_a_bad_value_naming_class_field_and_value(
    tmp_path: Path, case: Case, name: str, kind: str, optional: bool
) -> None:
    cls = case.cls.__name__
    refused = REFUSED[kind] + ([] if optional else [None])
    maybe = MAYBE[kind] + ([None] if optional else [])
    problems = []
    for value in refused + maybe:
        message = outcome(case, tmp_path, name, value)
        if message is None:
            if value not in maybe:
                problems.append(f"{shown(value)}: accepted")
        elif not (cls in message and name in message and shown(value) in message):
            problems.append(f"{shown(value)}: {message!r} does not name {cls}, {name} and the value")
    assert not problems, problems


def test_the_sweep_reaches_the_fields_it_was_written_for() -> None:
    swept = {f"{case.cls.__name__}.{name}" for case in CASES for name, _, _ in swept_fields(case.cls)}
    assert len(swept) >= 60
    expected = {
        "RunConfig.approval_timeout", "StreamHandler.first_event_timeout", "StreamHandler.jitter",
        "StreamHandler.rescue", "TimeoutMiddleware.seconds", "UnknownToolMiddleware.threshold",
        "ExponentialBackoffRecovery.factor", "RunRegistry.keep_finished_s", "SqliteMemoryStore.timeout",
        "SqliteMemoryStore.use_fts", "HeuristicTokenCounter.chars_per_token", "AnthropicClient.max_tokens",
        "FallbackManager.recovery_timeout", "SQLiteSessionStore.lease_s",
    }
    assert expected <= swept, expected - swept


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda: OpenAIClient("m", api_key="k", base_url=URL, timeout=math.nan), "OpenAIClient.timeout"),
        (lambda: OpenAIClient("m", api_key="k", base_url=URL, timeout=(5, -HUGE)), "OpenAIClient.timeout (read)"),
        (lambda: AnthropicClient("m", api_key="k", base_url=URL, timeout=(math.inf, 5)), "AnthropicClient.timeout (connect)"),
        (lambda: FallbackManager("a", 5), "FallbackManager.fallbacks"),  # type: ignore[arg-type]
        (lambda: ToolHealthRegistry(clock=5), "ToolHealthRegistry.clock"),  # type: ignore[arg-type]
        (lambda: FallbackManager(HUGE), "primary"),  # type: ignore[arg-type]
        (lambda: InMemoryStore().retrieve("x", -HUGE), "retrieve limit"),
        (lambda: SessionConfig(system_prompt=HUGE), "SessionConfig.system_prompt"),  # type: ignore[arg-type]
        (lambda: ParallelDispatch(mode=[HUGE]), "ParallelDispatch.mode"),  # type: ignore[arg-type]
        (lambda: SessionConfig.from_dict({HUGE: 1}), "SessionConfig has no field"),
    ],
)
def test_other_bad_values_are_config_errors_that_show_the_value_bounded(make: Callable[[], object], says: str) -> None:
    with pytest.raises(ConfigError) as info:
        make()
    assert says in str(info.value)


def test_shown_is_bounded_and_never_builds_a_huge_int_in_full() -> None:
    assert shown(10**5000) == "<int of 5001 digits>" and shown(-(10**5000)) == "-<int of 5001 digits>"
    assert shown(10**5000 - 1) == "<int of 5000 digits>"
    assert shown(10**77) == repr(10**77) and shown(2**300) == "<int of 91 digits>"
    assert shown([1, 10**5000]) == "[1, <int of 5001 digits>]"
    assert shown("x" * 10_000) == ("'" + "x" * 10_000)[:SHOWN_LIMIT]
    assert len(shown(list(range(10_000)))) <= SHOWN_LIMIT
    assert (shown(math.nan), shown(True), shown(None), shown("3")) == ("nan", "True", "None", "'3'")

    class Broken:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    assert "Broken" in shown(Broken())


def test_a_shown_text_is_masked_before_it_is_cut() -> None:
    from loopctl.text import register_secrets

    class Owner:
        pass

    owner = Owner()
    secret = "zqvw" * 8 + "-shown-secret"
    register_secrets(owner, [secret])
    text = shown("x" * 60 + secret)  # the cut at SHOWN_LIMIT would split the secret
    assert "zqvwzqvw" not in text

    class Holder:
        def __repr__(self) -> str:
            return f"Holder(key={secret!r}, padding={'p' * 40!r})"

    for value in (Holder(), ("x" * 60 + secret).encode(), [Holder()]):
        assert "zqvwzqvw" not in shown(value), value
