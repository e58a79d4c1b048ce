"""Configuration: defaults, validation that names field and value, round trips.

Nothing is clamped (SPEC §13): every out-of-range value raises ``ConfigError``,
which is also a ``ValueError``.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from support import via_json

from loopctl.config import ParallelDispatch, RunConfig, SessionConfig
from loopctl.errors import ConfigError, LoopError


def test_session_config_defaults() -> None:
    c = SessionConfig()
    assert (c.system_prompt, c.context_window, c.compact_threshold, c.auto_compact) == (
        None,
        200_000,
        80,
        True,
    )


def test_run_config_defaults() -> None:
    c = RunConfig()
    assert c.max_turns == 200
    assert c.parallel == ParallelDispatch("parallel", 8)
    assert c.memory_top_k == 3
    assert c.reset_managers is False


def test_parallel_dispatch_defaults() -> None:
    assert ParallelDispatch() == ParallelDispatch(mode="parallel", max_concurrency=8)


@pytest.mark.parametrize(
    ("make", "field", "value"),
    [
        (lambda: SessionConfig(compact_threshold=150), "compact_threshold", "150"),
        (lambda: SessionConfig(compact_threshold=101), "compact_threshold", "101"),
        (lambda: SessionConfig(compact_threshold=-1), "compact_threshold", "-1"),
        (lambda: SessionConfig(compact_threshold=80.0), "compact_threshold", "80.0"),
        (lambda: SessionConfig(compact_threshold="80"), "compact_threshold", "'80'"),
        (lambda: SessionConfig(context_window=-5), "context_window", "-5"),
        (lambda: SessionConfig(context_window=None), "context_window", "None"),
        (lambda: SessionConfig(context_window=True), "context_window", "True"),
        (lambda: SessionConfig(auto_compact=1), "auto_compact", "1"),
        (lambda: SessionConfig(auto_compact="yes"), "auto_compact", "'yes'"),
        (lambda: SessionConfig(auto_compact=None), "auto_compact", "None"),
        (lambda: SessionConfig(system_prompt=5), "system_prompt", "5"),
        (lambda: RunConfig(max_turns=-1), "max_turns", "-1"),
        (lambda: RunConfig(max_turns=2.5), "max_turns", "2.5"),
        (lambda: RunConfig(memory_top_k=-3), "memory_top_k", "-3"),
        (lambda: RunConfig(reset_managers="no"), "reset_managers", "'no'"),
        (lambda: RunConfig(parallel=5), "parallel", "5"),
        (lambda: ParallelDispatch(mode="x"), "mode", "'x'"),
        (lambda: ParallelDispatch(mode="Parallel"), "mode", "'Parallel'"),
        (lambda: ParallelDispatch(max_concurrency=0), "max_concurrency", "0"),
        (lambda: ParallelDispatch(max_concurrency=-2), "max_concurrency", "-2"),
        (lambda: RunConfig(parallel="x"), "mode", "'x'"),
        (lambda: RunConfig(parallel={"mode": "sequential", "max_concurrency": 0}), "max_concurrency", "0"),
    ],
)
def test_out_of_range_values_raise_config_error_naming_field_and_value(
    make: Any, field: str, value: str
) -> None:
    with pytest.raises(ConfigError) as info:
        make()
    message = str(info.value)
    assert field in message
    assert value in message


def test_config_error_is_a_value_error_and_a_loop_error() -> None:
    with pytest.raises(ValueError):
        SessionConfig(compact_threshold=150)
    with pytest.raises(LoopError):
        RunConfig(max_turns=-1)


@pytest.mark.parametrize(
    "make",
    [
        lambda: SessionConfig(compact_threshold=0),
        lambda: SessionConfig(compact_threshold=100),
        lambda: SessionConfig(context_window=0),
        lambda: SessionConfig(auto_compact=False, system_prompt="be brief"),
        lambda: RunConfig(max_turns=0),
        lambda: RunConfig(memory_top_k=0, reset_managers=True),
        lambda: ParallelDispatch(mode="sequential", max_concurrency=1),
    ],
)
def test_boundary_values_are_accepted(make: Any) -> None:
    make()


def test_validation_also_runs_on_evolve() -> None:
    with pytest.raises(ConfigError, match="150"):
        attrs.evolve(SessionConfig(), compact_threshold=150)
    with pytest.raises(ConfigError, match="-1"):
        attrs.evolve(RunConfig(), max_turns=-1)


def test_configs_are_frozen() -> None:
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        SessionConfig().compact_threshold = 10  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        RunConfig().max_turns = 1  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        ParallelDispatch().mode = "sequential"  # type: ignore[misc]


def test_run_config_parallel_accepts_a_mode_name_or_a_dict() -> None:
    assert RunConfig(parallel="sequential").parallel == ParallelDispatch("sequential")
    assert RunConfig(parallel={"mode": "sequential", "max_concurrency": 2}).parallel == (
        ParallelDispatch("sequential", 2)
    )


# -- round trips -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        SessionConfig(),
        SessionConfig(system_prompt="You are terse.", context_window=0, compact_threshold=0),
        SessionConfig(context_window=8192, compact_threshold=100, auto_compact=False),
    ],
)
def test_session_config_round_trips_through_json(config: SessionConfig) -> None:
    data = config.to_dict()
    assert SessionConfig.from_dict(via_json(data)) == config
    assert set(data) == {"system_prompt", "context_window", "compact_threshold", "auto_compact"}


@pytest.mark.parametrize(
    "config",
    [
        RunConfig(),
        RunConfig(max_turns=0, parallel=ParallelDispatch("sequential", 1), memory_top_k=0),
        RunConfig(max_turns=7, parallel=ParallelDispatch("parallel", 32), reset_managers=True),
    ],
)
def test_run_config_round_trips_through_json(config: RunConfig) -> None:
    data = config.to_dict()
    back = RunConfig.from_dict(via_json(data))
    assert back == config
    assert isinstance(back.parallel, ParallelDispatch)


@pytest.mark.parametrize("dispatch", [ParallelDispatch(), ParallelDispatch("sequential", 3)])
def test_parallel_dispatch_round_trips_through_json(dispatch: ParallelDispatch) -> None:
    assert ParallelDispatch.from_dict(via_json(dispatch.to_dict())) == dispatch


def test_from_dict_ignores_a_version_key() -> None:
    data = {**SessionConfig(compact_threshold=50).to_dict(), "version": 1}
    assert SessionConfig.from_dict(data) == SessionConfig(compact_threshold=50)
    assert RunConfig.from_dict({"version": 1, "max_turns": 3}) == RunConfig(max_turns=3)


def test_from_dict_validates_values() -> None:
    with pytest.raises(ConfigError, match="compact_threshold.*150"):
        SessionConfig.from_dict({"compact_threshold": 150})
    with pytest.raises(ConfigError, match="max_concurrency.*0"):
        RunConfig.from_dict({"parallel": {"mode": "parallel", "max_concurrency": 0}})


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda: SessionConfig.from_dict({"context_windw": 10}), "'context_windw'"),
        (lambda: RunConfig.from_dict({"max_turn": 3}), "'max_turn'"),
        (lambda: ParallelDispatch.from_dict({"workers": 3}), "'workers'"),
        (lambda: RunConfig(parallel={"mode": "parallel", "threads": 2}), "'threads'"),
    ],
)
def test_unknown_keys_raise_config_error_naming_them(make: Any, name: str) -> None:
    with pytest.raises(ConfigError) as info:
        make()
    assert name in str(info.value)
