"""The one error tree: types, structured fields, messages naming values, pickling."""

from __future__ import annotations

import copy
import pickle
import sys
from typing import Any

import pytest

import loopctl.errors as errors_module
from loopctl.errors import (
    Cancelled,
    ConfigError,
    ContextExceeded,
    ContextOverflow,
    FallbackExhausted,
    LoopBusy,
    LoopDetected,
    LoopError,
    MaxTurnsExceeded,
    ModelError,
    OutputValidationError,
    RateLimited,
    RateLimitEscalation,
    SessionBusy,
    SessionCorrupt,
    ToolRecoveryExhausted,
    UserInputRequired,
    scrub_error,
)
from loopctl.records import Run

# (error, its structured fields, substrings its message must contain)
CASES: list[tuple[LoopError, dict[str, Any], tuple[str, ...]]] = [
    (LoopError("generic trouble"), {}, ("generic trouble",)),
    (Cancelled(), {"reason": None}, ("cancelled",)),
    (Cancelled("user hit ctrl-c"), {"reason": "user hit ctrl-c"}, ("cancelled", "user hit ctrl-c")),
    (MaxTurnsExceeded(17), {"max_turns": 17}, ("17",)),
    (FallbackExhausted(("gpt-big", "gpt-small")), {"models": ("gpt-big", "gpt-small")}, ("gpt-big", "gpt-small")),
    (FallbackExhausted(), {"models": ()}, ("fallback",)),
    (ContextExceeded(used=190_123, limit=180_000), {"used": 190_123, "limit": 180_000}, ("190123", "180000")),
    (LoopDetected("read_file x10"), {"detail": "read_file x10"}, ("read_file x10",)),
    (UserInputRequired("which branch?"), {"detail": "which branch?"}, ("which branch?",)),
    (ToolRecoveryExhausted("deploy", 6), {"tool": "deploy", "attempts": 6}, ("'deploy'", "6")),
    (
        ModelError("HTTP 503 from server", status=503, retryable=True),
        {"status": 503, "retryable": True},
        ("HTTP 503 from server",),
    ),
    (ModelError("bad request"), {"status": None, "retryable": False}, ("bad request",)),
    (RateLimitEscalation(5, 12.5), {"attempts": 5, "retry_after": 12.5}, ("5", "12.5")),
    (RateLimitEscalation(3), {"attempts": 3, "retry_after": None}, ("3",)),
    (
        ContextOverflow("prompt is too long: 210000 tokens > 200000", status=400),
        {"status": 400, "retryable": False},
        ("210000",),
    ),
    (
        RateLimited("rate limited (429): server asked to wait 3600s, max_retry_wait is 60s", 3600.0, 60.0),
        {"retry_after": 3600.0, "max_retry_wait": 60.0, "status": 429, "retryable": False},
        ("3600", "60"),
    ),
    (
        OutputValidationError("{\"a\": 1", ["$.b: required field missing"]),
        {"raw_text": "{\"a\": 1", "errors": ("$.b: required field missing",)},
        ("$.b",),
    ),
    (ConfigError("SessionConfig.compact_threshold must be between 0 and 100, got 150"), {}, ("150",)),
    (LoopBusy(), {}, ("in flight",)),
    (LoopBusy("registry full: max_active=64"), {}, ("64",)),
    (SessionBusy("ada/chat"), {"session_id": "ada/chat"}, ("'ada/chat'", "busy")),
    (
        SessionCorrupt("ada/chat", 3, "not a message"),
        {"session_id": "ada/chat", "position": 3},
        ("'ada/chat'", "message 3"),
    ),
    (SessionCorrupt("x" * 2000, None, "bad"), {"position": None}, ("corrupt", "...")),
]
IDS = [f"{type(e).__name__}-{i}" for i, (e, _, _) in enumerate(CASES)]


def test_every_error_class_of_the_module_is_covered() -> None:
    classes = {
        obj
        for obj in vars(errors_module).values()
        if isinstance(obj, type) and issubclass(obj, LoopError)
    }
    assert classes == {type(e) for e, _, _ in CASES}


@pytest.mark.parametrize(("error", "fields", "words"), CASES, ids=IDS)
def test_every_error_is_a_loop_error_with_fields_and_a_message_naming_values(
    error: LoopError, fields: dict[str, Any], words: tuple[str, ...]
) -> None:
    assert isinstance(error, LoopError)
    assert isinstance(error, Exception)
    assert error.run is None
    for name, value in fields.items():
        assert getattr(error, name) == value
    text = str(error)
    for word in words:
        assert word in text
    assert error.message == text


@pytest.mark.parametrize(("error", "fields", "words"), CASES, ids=IDS)
def test_errors_pickle_round_trip_keeping_type_fields_and_message(
    error: LoopError, fields: dict[str, Any], words: tuple[str, ...]
) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error)
    assert str(back) == str(error)
    assert back.args == error.args
    for name, value in fields.items():
        assert getattr(back, name) == value
    assert back.run is None


@pytest.mark.parametrize(("error", "fields", "words"), CASES, ids=IDS)
def test_errors_copy_and_deepcopy(
    error: LoopError, fields: dict[str, Any], words: tuple[str, ...]
) -> None:
    for clone in (copy.copy(error), copy.deepcopy(error)):
        assert type(clone) is type(error)
        assert str(clone) == str(error)
        for name, value in fields.items():
            assert getattr(clone, name) == value


def test_pickle_keeps_the_attached_run_record_even_though_it_points_back() -> None:
    error = ContextExceeded(used=10, limit=5)
    run = Run(id="r1", input="hi", start=1.0, end=2.0)
    run.stop_reason = error
    error.run = run
    back = pickle.loads(pickle.dumps(error))
    assert back.run is not None
    assert back.run.id == "r1"
    assert back.run.stop_reason is back  # the cycle is rebuilt, not duplicated
    assert (back.used, back.limit) == (10, 5)


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)
    with pytest.raises(ValueError):
        raise ConfigError("bad")


def test_loop_busy_is_a_runtime_error() -> None:
    assert issubclass(LoopBusy, RuntimeError)
    with pytest.raises(RuntimeError):
        raise LoopBusy()


def test_errors_chain_the_original_with_raise_from() -> None:
    try:
        try:
            raise OSError("connection reset")
        except OSError as exc:
            raise ModelError("transport failed", retryable=True) from exc
    except ModelError as err:
        assert isinstance(err.__cause__, OSError)
        assert err.retryable


@pytest.mark.skipif(sys.version_info < (3, 11), reason="ExceptionGroup and add_note are Python 3.11+")
def test_scrub_error_strips_foreign_causes_inside_a_group_and_keeps_loopctls_own_fields() -> None:
    class Refused(Exception):
        pass

    inner = Refused("refused sk-live-0123456789abcdef")
    inner.request = {"Authorization": "Bearer sk-live-0123456789abcdef"}  # type: ignore[attr-defined]
    inner.attempts = 3  # type: ignore[attr-defined]
    inner.add_note("while sending sk-live-0123456789abcdef")
    group = ExceptionGroup("the task group failed", [inner])  # noqa: F821 - a builtin since 3.11
    err = ModelError("model call failed", status=502, retryable=True)
    err.__cause__ = group
    assert scrub_error(err) is err
    assert group.exceptions == (inner,)
    assert inner.request is None and inner.attempts == 3  # type: ignore[attr-defined]
    assert "sk-live" not in str(inner) and inner.__notes__ == ["while sending <redacted>"]
    assert (err.status, err.retryable) == (502, True)


def test_scrub_error_drops_an_object_a_foreign_exception_holds_in_its_args() -> None:
    class Headers:
        def __init__(self) -> None:
            self.headers = {"Authorization": "Bearer sk-live-0123456789abcdef"}

        def __str__(self) -> str:
            return "<request>"

    inner = RuntimeError(Headers(), 3)  # its text shows no secret, its args hold one
    err = ModelError("model call failed")
    err.__cause__ = inner
    scrub_error(err)
    assert all(isinstance(a, (str, int, float, bool, type(None))) for a in inner.args)
    assert not any(isinstance(a, Headers) for a in inner.args) and "Headers object" in str(inner)
    plain = ValueError("bad value", 7)
    err2 = ModelError("x")
    err2.__cause__ = plain
    scrub_error(err2)
    assert plain.args == ("bad value", 7)  # plain data stays as it was
