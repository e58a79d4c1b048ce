"""The shipped pipeline layers: timeout, permission, output limit, unknown tool.

Each is a ``ToolMiddleware``; every refusal is a *soft* error (the model
reads it and the run continues). Exact texts:

- timeout: ``Tool 'x' timed out after 2s``
- permission: ``Tool 'x' blocked by policy: <reason>``
- output limit: the head of the text, then ``\\n[truncated]``, within the budget
- unknown tool: ``Tool not found: x. Did you mean 'y'?``
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Callable, Optional

import attrs

from loopctl.checks import integer, number
from loopctl.text import whole_cut
from loopctl.timeouts import required_seconds
from loopctl.tools.base import ToolOutput
from loopctl.tools.pipeline import DispatchContext, Next, ToolMiddleware
from loopctl.tools.timeout import call_with_timeout

log = logging.getLogger("loopctl")


class TimeoutMiddleware(ToolMiddleware):
    """Give up on a call after ``seconds``: soft ``Tool 'x' timed out after Ns``.

    The call runs on its own daemon thread (``loopctl-tool-timeout-...``);
    on timeout that thread is abandoned and its ``ToolContext.cancel`` is
    fired (the run's own signal is not), so a cooperative tool stops and
    the run goes on. A tool with its own ``timeout`` is left to the core,
    which enforces that one instead.

    Args:
        seconds: the deadline (> 0).
    """

    def __init__(self, seconds: float = 120.0) -> None:
        self.seconds = required_seconds(seconds, "TimeoutMiddleware.seconds")

    def dispatch(self, ctx: DispatchContext, next: Next) -> ToolOutput:
        """Run ``next(ctx)`` on a timed thread."""
        tool = ctx.lookup()
        if tool is not None and tool.timeout is not None:
            return next(ctx)  # the core enforces the tool's own deadline

        resolved: list[str] = []

        def run(tc: Any) -> ToolOutput:
            inner = attrs.evolve(ctx, tool_context=tc)
            out = next(inner)
            resolved.append(inner.tool_name)
            return out

        out = call_with_timeout(ctx.tool_name, self.seconds, ctx.tool_context, run)
        if resolved:  # keep the resolved name visible to outer layers and the dispatcher
            ctx.tool_name = resolved[0]
        return out


@attrs.frozen
class PermissionCheck:
    """A permission verdict: ``allow``, ``deny`` (reason), ``ask`` (prompt) or ``modify`` (input)."""

    action: str
    reason: str = ""
    input: Optional[Mapping[str, Any]] = None

    @classmethod
    def allow(cls) -> PermissionCheck:
        """Let the call run."""
        return cls("allow")

    @classmethod
    def deny(cls, reason: str = "denied") -> PermissionCheck:
        """Refuse with a soft ``blocked by policy`` error."""
        return cls("deny", reason)

    @classmethod
    def ask(cls, prompt: str) -> PermissionCheck:
        """Ask the resolver; without one this is a deny."""
        return cls("ask", prompt)

    @classmethod
    def modify(cls, input: Mapping[str, Any]) -> PermissionCheck:
        """Run the call with ``input`` instead (the tool still validates it)."""
        return cls("modify", "", dict(input))


Check = Callable[[DispatchContext], Optional[PermissionCheck]]
AskResolver = Callable[[DispatchContext, str], bool]


class PermissionMiddleware(ToolMiddleware):
    """Allow, deny, ask or modify each call by policy.

    Args:
        check: ``check(ctx) -> PermissionCheck | None`` (None allows).
        ask_resolver: ``resolver(ctx, prompt) -> bool`` answers ``ask``
            verdicts (it may block waiting for a person; it runs off the
            run's fence, so cancel still works). Without one, ``ask`` denies.
    """

    def __init__(self, check: Optional[Check] = None, ask_resolver: Optional[AskResolver] = None) -> None:
        self._check = check
        self._resolver = ask_resolver

    @classmethod
    def allow_all(cls) -> PermissionMiddleware:
        """Every call runs."""
        return cls(lambda ctx: PermissionCheck.allow())

    @classmethod
    def deny_all(cls, reason: str = "all tools are disabled") -> PermissionMiddleware:
        """No call runs."""
        return cls(lambda ctx: PermissionCheck.deny(reason))

    @classmethod
    def for_tools(
        cls,
        allow: Optional[Iterable[str]] = None,
        deny: Iterable[str] = (),
        ask: Iterable[str] = (),
        ask_resolver: Optional[AskResolver] = None,
    ) -> PermissionMiddleware:
        """Rules by tool name: ``deny`` wins, then ``ask``, then ``allow``.

        ``allow=None`` allows every name not denied or asked; a list allows
        only those names.
        """
        allowed = None if allow is None else frozenset(allow)
        denied, asked = frozenset(deny), frozenset(ask)

        def check(ctx: DispatchContext) -> PermissionCheck:
            name = ctx.tool_name
            if name in denied:
                return PermissionCheck.deny(f"tool '{name}' is denied")
            if name in asked:
                return PermissionCheck.ask(f"allow tool '{name}'?")
            if allowed is not None and name not in allowed:
                return PermissionCheck.deny(f"tool '{name}' is not in the allow list")
            return PermissionCheck.allow()

        return cls(check, ask_resolver)

    @classmethod
    def read_only(cls) -> PermissionMiddleware:
        """Only tools marked ``read_only`` run."""

        def check(ctx: DispatchContext) -> PermissionCheck:
            tool = ctx.lookup()
            if tool is not None and not tool.read_only:
                return PermissionCheck.deny(f"tool '{ctx.tool_name}' is not read-only")
            return PermissionCheck.allow()

        return cls(check)

    def with_check(self, check: Check) -> PermissionMiddleware:
        """Replace the policy; returns self."""
        self._check = check
        return self

    def with_ask_resolver(self, resolver: AskResolver) -> PermissionMiddleware:
        """Set who answers ``ask`` verdicts; returns self."""
        self._resolver = resolver
        return self

    def _blocked(self, ctx: DispatchContext, reason: str) -> ToolOutput:
        return ToolOutput.error(f"Tool '{ctx.tool_name}' blocked by policy: {reason}")

    def dispatch(self, ctx: DispatchContext, next: Next) -> ToolOutput:
        """Apply the verdict, then run or refuse."""
        verdict = self._check(ctx) if self._check is not None else None
        if verdict is None or verdict.action == "allow":
            return next(ctx)
        if verdict.action == "deny":
            return self._blocked(ctx, verdict.reason or "denied")
        if verdict.action == "modify":
            if verdict.input is not None:
                ctx.input = verdict.input
            return next(ctx)
        if verdict.action == "ask":
            prompt = verdict.reason or f"allow tool '{ctx.tool_name}'?"
            if self._resolver is None:
                return self._blocked(ctx, f"approval needed and no one to ask ({prompt})")
            try:
                ok = bool(self._resolver(ctx, prompt))
            except Exception as exc:
                log.exception("permission ask resolver raised for tool %r", ctx.tool_name)
                return self._blocked(ctx, f"approval failed: {type(exc).__name__}: {exc}")
            return next(ctx) if ok else self._blocked(ctx, "denied by user")
        return self._blocked(ctx, f"unknown permission action {verdict.action!r}")


TRUNCATED = "\n[truncated]"


def truncate(text: str, max_chars: int) -> str:
    """Keep the head of ``text`` so that it plus ``\\n[truncated]`` fits ``max_chars``.

    The cut never splits a key (``whole_cut``): the head would keep part
    of it, which no outlet's mask could recognise.
    """
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    if max_chars < len(TRUNCATED):  # no room for the marker: the head alone
        return text[: whole_cut(text, max_chars)]
    return text[: whole_cut(text, max_chars - len(TRUNCATED))] + TRUNCATED


class OutputLimitMiddleware(ToolMiddleware):
    """Cap every result at ``max_chars`` characters (0 turns the limit off).

    The head is kept and ``\\n[truncated]`` appended within the budget; the
    error flag is kept.
    """

    def __init__(self, max_chars: int) -> None:
        self.max_chars = integer(max_chars, "OutputLimitMiddleware.max_chars", 0)

    def dispatch(self, ctx: DispatchContext, next: Next) -> ToolOutput:
        """Run the call, then cut its text."""
        out = next(ctx)
        if self.max_chars == 0 or len(out.text) <= self.max_chars:
            return out
        return ToolOutput(truncate(out.text, self.max_chars), out.is_error)


def lcs_similarity(a: str, b: str) -> float:
    """Longest common subsequence length over the longer length (0..1), case-insensitive."""
    a, b = a.lower(), b.lower()
    if not a or not b:
        return 0.0
    prev = [0] * (len(b) + 1)
    for ca in a:
        cur = [0]
        for j, cb in enumerate(b):
            cur.append(prev[j] + 1 if ca == cb else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1] / max(len(a), len(b))


class UnknownToolMiddleware(ToolMiddleware):
    """For a name the registry lacks, suggest the closest: ``Did you mean 'y'?``.

    Args:
        threshold: the least LCS similarity (0..1) for a suggestion; with no
            name close enough, the call falls through to the core's
            ``Tool not found: x. Available: ...``.
    """

    def __init__(self, threshold: float = 0.4) -> None:
        self.threshold = number(threshold, "UnknownToolMiddleware.threshold", 0, 1)

    def suggest(self, name: str, names: Iterable[str]) -> Optional[str]:
        """The most similar name at or above the threshold (ties: alphabetical)."""
        best: Optional[str] = None
        best_score = self.threshold
        for candidate in sorted(names):
            score = lcs_similarity(name, candidate)
            if score > best_score or (best is None and score >= best_score):
                best, best_score = candidate, score
        return best

    def dispatch(self, ctx: DispatchContext, next: Next) -> ToolOutput:
        """Answer an unknown name with a suggestion, else pass through."""
        registry = ctx.registry
        if registry is None or ctx.tool_name in registry:
            return next(ctx)
        guess = self.suggest(ctx.tool_name, registry.names())
        if guess is None:
            return next(ctx)
        return ToolOutput.error(f"Tool not found: {ctx.tool_name}. Did you mean '{guess}'?")


__all__ = [
    "OutputLimitMiddleware",
    "PermissionCheck",
    "PermissionMiddleware",
    "TRUNCATED",
    "TimeoutMiddleware",
    "UnknownToolMiddleware",
    "lcs_similarity",
    "truncate",
]
