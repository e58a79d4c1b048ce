"""The one error tree: every failure a caller sees is a ``LoopError``.

Each error carries structured fields and a message that names the bad
value. Foreign exceptions (``requests``, ``json``, user code) are translated
at a boundary and chained with ``raise ... from exc``. The driver attaches
the finished ``Run`` record to ``.run`` before a run's error reaches the
caller.

Messages never contain credentials and never quote much: every message is
masked (``loopctl.text.redact``) and bounded (``MESSAGE_LIMIT``) when the
error is made, and ``scrub_error`` masks an error's whole cause chain where
it leaves a run or a client (a foreign cause keeps its text, masked, and
loses the objects it holds: a request, a response, a document).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any, Optional

from loopctl.text import EXCERPT_LIMIT, quote, redact

#: The longest message an error carries: room for its own words and a quoted excerpt or two.
MESSAGE_LIMIT = 2 * EXCERPT_LIMIT


class LoopError(Exception):
    """Base of every loopctl error.

    Attributes:
        run: the finished ``Run`` record when the error ended a run, else None.
    """

    run: object = None

    def __init__(self, message: str = "") -> None:
        message = quote(str(message), MESSAGE_LIMIT)
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> Any:
        # Keep pickling (Celery, multiprocessing) working for subclasses
        # whose constructors take structured fields.
        return (_rebuild_error, (type(self), self.__dict__.copy()))


def _rebuild_error(cls: type[LoopError], state: dict[str, Any]) -> LoopError:
    err = cls.__new__(cls)
    Exception.__init__(err, state.get("message", ""))
    err.__dict__.update(state)
    return err


class Cancelled(LoopError):
    """The run was cancelled through its ``CancelSignal``."""

    def __init__(self, reason: Optional[str] = None) -> None:
        self.reason = reason
        super().__init__("run cancelled" + (f": {reason}" if reason else ""))


class MaxTurnsExceeded(LoopError):
    """The run reached ``RunConfig.max_turns`` without a final answer."""

    def __init__(self, max_turns: int) -> None:
        self.max_turns = max_turns
        super().__init__(f"max turns exceeded: the run used all {max_turns} turns")


class FallbackExhausted(LoopError):
    """Every model of the fallback chain is unavailable."""

    def __init__(self, models: tuple[str, ...] = ()) -> None:
        self.models = tuple(models)
        names = ", ".join(self.models) if self.models else "no fallback models"
        super().__init__(f"fallback exhausted: every model is down ({names})")


class ContextExceeded(LoopError):
    """The conversation does not fit the context window."""

    def __init__(self, used: int, limit: int) -> None:
        self.used = used
        self.limit = limit
        super().__init__(f"context exceeded: {used} tokens used, limit {limit}")


class LoopDetected(LoopError):
    """A repeating tool pattern or converging answers stopped the run."""

    def __init__(self, message: str) -> None:
        super().__init__(f"loop detected: {message}")
        self.detail = quote(message)


class UserInputRequired(LoopError):
    """The run needs a person's input before it can go on."""

    def __init__(self, message: str) -> None:
        super().__init__(f"user input required: {message}")
        self.detail = quote(message)


class ToolRecoveryExhausted(LoopError):
    """A tool kept failing after the maximum number of recovery retries."""

    def __init__(self, tool: str, attempts: int) -> None:
        self.tool = tool
        self.attempts = attempts
        super().__init__(f"tool {tool!r} failed after {attempts} attempts")


class ModelError(LoopError):
    """The model call failed.

    Attributes:
        status: the HTTP status when the provider answered with one.
        retryable: whether a retry of the same request may succeed.
    """

    def __init__(
        self, message: str, status: Optional[int] = None, retryable: bool = False
    ) -> None:
        self.status = status
        self.retryable = retryable
        super().__init__(message)


class ContextOverflow(ModelError):
    """The provider rejected the request as too long for the model's context window.

    Classified once, at the provider boundary, from the provider's error
    status and body; the driver reports it to the machine, which decides
    whether to compact and retry.
    """

    def __init__(self, message: str, status: Optional[int] = None) -> None:
        super().__init__(message, status=status, retryable=False)


class RateLimited(ModelError):
    """The provider asked for a wait longer than the client allows.

    Attributes:
        retry_after: the wait the server asked for, in seconds.
        max_retry_wait: the longest wait the client accepts, in seconds.
    """

    def __init__(
        self,
        message: str,
        retry_after: Optional[float] = None,
        max_retry_wait: Optional[float] = None,
        status: Optional[int] = 429,
    ) -> None:
        self.retry_after = retry_after
        self.max_retry_wait = max_retry_wait
        super().__init__(message, status=status, retryable=False)


class OutputValidationError(LoopError):
    """The model's final answer did not fit the requested ``output_type``.

    Attributes:
        raw_text: the last reply's text, as the model sent it (whole, but
            with credentials and key-shaped text masked).
        errors: the validation errors, each ``"path: message"``, each a
            masked excerpt of at most ``EXCERPT_LIMIT`` characters.
    """

    def __init__(self, raw_text: str, errors: tuple[str, ...] | list[str] = ()) -> None:
        self.raw_text = redact(raw_text)
        self.errors = tuple(quote(str(e)) for e in errors)
        shown = "; ".join(self.errors[:5]) or "no details"
        super().__init__(f"output validation failed: {shown}")


class RateLimitEscalation(LoopError):
    """The provider kept rate-limiting after every allowed retry."""

    def __init__(self, attempts: int, retry_after: Optional[float] = None) -> None:
        self.attempts = attempts
        self.retry_after = retry_after
        after = f"; last Retry-After {retry_after:g}s" if retry_after is not None else ""
        super().__init__(f"rate limited after {attempts} attempts{after}")


class ConfigError(LoopError, ValueError):
    """A configuration value is invalid, or a setter was called too late."""


class LoopBusy(LoopError, RuntimeError):
    """A run is already in flight (or a concurrency limit was reached)."""

    def __init__(self, message: str = "a run is already in flight on this loop") -> None:
        super().__init__(message)


def scrub_error(
    err: BaseException, mask: Callable[[str], str] = redact, *, strip_foreign: bool = False
) -> BaseException:
    """Mask ``err`` and its whole cause/context chain in place; returns ``err``.

    A ``LoopError``'s message, args and text fields (``errors``, ``detail``,
    ``raw_text``, ...) go through ``mask`` and its message is bounded again;
    its other fields (``run``, ``status``, ``kind``, ...) are kept, and its
    traceback keeps frames (file, line, function) but not their locals.
    A foreign exception (any other: a ``requests`` error a custom client let
    out, a tool's) keeps its type and masked text, and loses every attribute
    that is not plain data (a ``requests`` error's request and response,
    whose headers hold the key); with ``strip_foreign`` (the wire, whose
    foreign frames hold request headers) its args become that text alone
    and its traceback is dropped, else only its frames' locals are. The
    members of an exception group are scrubbed with it.

    Args:
        mask: the masking of one text (a client adds its own credentials).
        strip_foreign: drop foreign exceptions' args and tracebacks.
    """
    seen: set[int] = set()
    todo: list[Optional[BaseException]] = [err]
    while todo:
        exc = todo.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        if isinstance(exc, LoopError):
            _scrub_fields(exc, mask)
            if exc.__traceback__ is not None:
                traceback.clear_frames(exc.__traceback__)  # frames still running are kept
        else:
            _scrub_foreign(exc, mask, strip_foreign)
        todo += (exc.__cause__, exc.__context__, *_members(exc))
    return err


def _members(exc: BaseException) -> tuple[BaseException, ...]:
    """The exceptions an exception group holds (none for any other exception)."""
    members = getattr(exc, "exceptions", None)
    if isinstance(members, tuple) and all(isinstance(m, BaseException) for m in members):
        return members
    return ()


def _scrub_fields(exc: LoopError, mask: Callable[[str], str]) -> None:
    exc.message = quote(mask(exc.message), MESSAGE_LIMIT)
    exc.args = (exc.message,)
    for key, value in list(vars(exc).items()):
        if key in ("run", "message") or key.startswith("_"):
            continue
        if isinstance(value, str):
            setattr(exc, key, mask(value))
        elif isinstance(value, tuple) and value and all(isinstance(v, str) for v in value):
            setattr(exc, key, tuple(mask(v) for v in value))


_PLAIN_ARGS = (str, int, float, bool, type(None))


def _scrub_foreign(exc: BaseException, mask: Callable[[str], str], strip: bool) -> None:
    try:
        shown = str(exc)
        text = mask(shown)
    except Exception:
        shown, text = "", type(exc).__name__
    plain = all(isinstance(a, _PLAIN_ARGS) for a in exc.args)  # an object in args may hold headers
    if strip or text != shown or not plain:
        try:
            exc.args = (text,)
        except Exception:
            pass
    if strip:
        exc.__traceback__ = None
    elif exc.__traceback__ is not None:
        traceback.clear_frames(exc.__traceback__)
    _scrub_attributes(exc, mask)


def _scrub_attributes(exc: BaseException, mask: Callable[[str], str]) -> None:
    """A foreign exception's raw data beside its message: texts masked, objects dropped.

    A ``UnicodeError`` keeps the whole text it failed on (a header's value,
    say), a ``JSONDecodeError`` the document, and a ``requests`` error its
    request, whose headers carry the credentials, and its response. Only
    texts (masked), lists of texts (notes) and plain numbers stay; a group's
    members stay too (they are scrubbed as part of the chain).
    """
    if isinstance(exc, UnicodeError):
        obj = getattr(exc, "object", None)
        try:
            if isinstance(obj, str):
                exc.object = mask(obj)  # type: ignore[attr-defined]
            elif isinstance(obj, (bytes, bytearray)):
                exc.object = b""  # type: ignore[attr-defined]
        except Exception:
            pass
    try:
        fields = list(vars(exc).items())
    except TypeError:  # no __dict__
        return
    members = _members(exc)
    for key, value in fields:
        try:
            if isinstance(value, str):
                setattr(exc, key, mask(value))
            elif isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
                setattr(exc, key, [mask(v) for v in value] if isinstance(value, list) else tuple(map(mask, value)))
            elif isinstance(value, (list, tuple)) and members and all(v in members for v in value):
                continue  # a group's own members (a backport keeps them in a field)
            elif not isinstance(value, (bool, int, float, type(None))):
                setattr(exc, key, None)
        except Exception:  # a read-only attribute: the message above is what it shows
            pass


def _shown_id(session_id: str) -> str:
    """A session id for a message: its repr, cut short (ids may be 1 KB)."""
    text = repr(session_id)
    return text if len(text) <= 120 else text[:117] + "..."


class SessionBusy(LoopBusy):
    """Another run (in this process or another) holds the session's lease.

    Attributes:
        session_id: the session that is busy.
    """

    def __init__(self, session_id: str, detail: str = "another run holds it") -> None:
        self.session_id = session_id
        super().__init__(f"session {_shown_id(session_id)} is busy: {detail}")


class SessionCorrupt(LoopError):
    """A stored message of the session cannot be read.

    Attributes:
        session_id: the session whose data is bad.
        position: the index of the unreadable message (None when unknown).
    """

    def __init__(self, session_id: str, position: Optional[int], detail: str) -> None:
        self.session_id = session_id
        self.position = position
        at = f" at message {position}" if position is not None else ""
        super().__init__(f"session {_shown_id(session_id)} is corrupt{at}: {detail}")


def release_frames(error: Optional[BaseException]) -> None:
    """Clear the locals of the finished frames in ``error``'s tracebacks (and its chain).

    A run's error is kept for ``result()``; its traceback's frames would
    otherwise hold the run's driver, loop, machine and client in a cycle
    only the cyclic GC can free. File, line and function names stay for
    display; a frame still executing (another thread's) is left alone.
    """
    seen = 0
    while error is not None and seen < 16:
        tb = error.__traceback__
        if tb is not None:
            traceback.clear_frames(tb)
            # A finished frame keeps its caller (f_back) alive, and the run
            # thread's outer frames hold the loop: clear them too. One still
            # executing (another thread's) refuses, and its callers are live.
            caller = tb.tb_frame.f_back
            while caller is not None:
                try:
                    caller.clear()
                except RuntimeError:
                    break
                caller = caller.f_back
        error = error.__cause__ or error.__context__
        seen += 1


__all__ = [
    "Cancelled",
    "ConfigError",
    "ContextExceeded",
    "ContextOverflow",
    "FallbackExhausted",
    "LoopBusy",
    "LoopDetected",
    "LoopError",
    "MaxTurnsExceeded",
    "ModelError",
    "OutputValidationError",
    "RateLimitEscalation",
    "RateLimited",
    "SessionBusy",
    "SessionCorrupt",
    "ToolRecoveryExhausted",
    "UserInputRequired",
    "release_frames",
    "scrub_error",
]
