"""Hooks: the typed channel that may veto (observers only watch).

A ``Hook`` overrides the methods it needs; ``HookExecutor`` runs them in
registration order. For a pre-tool decision the first block wins (an
explicit allow does not stop later hooks); ``ask`` counts as a block when
the executor is headless. A hook that raises is logged and treated as
allowing, so a broken hook cannot kill a run. Tool hooks run on the run's
thread, once per attempt of a call; a blocked call is a soft error with
the reason (``Tool 'x' blocked: <reason>``), is never run, and gets no
``on_tool_post``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Callable, Optional

import attrs

from loopctl.messages import Message

log = logging.getLogger("loopctl")


@attrs.frozen
class HookDecision:
    """A pre-tool verdict: ``action`` is "allow", "block" or "ask"."""

    action: str = "allow"
    reason: str = ""

    @classmethod
    def allow(cls) -> HookDecision:
        """Let the call run."""
        return cls("allow")

    @classmethod
    def block(cls, reason: str) -> HookDecision:
        """Refuse the call; the model gets ``reason`` as a soft error."""
        return cls("block", reason)

    @classmethod
    def ask(cls, prompt: str) -> HookDecision:
        """Ask a person (a block when headless)."""
        return cls("ask", prompt)

    @property
    def blocks(self) -> bool:
        """True unless the verdict is allow."""
        return self.action != "allow"


@attrs.frozen
class PreCompactDecision:
    """A pre-compact verdict: veto, instructions for the compactor, extra context."""

    abort: bool = False
    instructions: Optional[str] = None
    extra_context: Optional[str] = None


@attrs.frozen
class ToolHookContext:
    """What a tool hook sees about one attempt of a call (``attempt`` 0 first)."""

    session_id: str
    run_id: str
    turn: int
    call_id: str
    tool: str
    input: Mapping[str, Any]
    attempt: int = 0


@attrs.frozen
class CompactHookContext:
    """What a compaction hook sees."""

    session_id: str
    run_id: str
    reason: str
    messages: Sequence[Message]
    tokens: int


@attrs.frozen
class RunHookContext:
    """What a run hook sees."""

    session_id: str
    run_id: str
    input: str


class Hook:
    """Base class: every method allows / does nothing. Override what you need."""

    def on_pre_tool_use(self, ctx: ToolHookContext) -> Optional[HookDecision]:
        """Decide whether a call may run (None or allow lets it run)."""
        return None

    def on_post_tool_use(self, ctx: ToolHookContext, output: str, is_error: bool) -> None:
        """A call finished."""

    def on_pre_compact(self, ctx: CompactHookContext) -> Optional[PreCompactDecision]:
        """Veto a compaction, or pass instructions to the compactor."""
        return None

    def on_post_compact(self, ctx: CompactHookContext, tokens_after: int) -> None:
        """A compaction happened."""

    def on_run_start(self, ctx: RunHookContext) -> None:
        """A run began."""

    def on_run_end(self, ctx: RunHookContext, success: bool, error: Optional[str]) -> None:
        """A run ended."""


class BlocklistHook(Hook):
    """Block tools by exact name: ``deny(names)`` or ``allow_only(names)``.

    A denied name always blocks; with an allow list, names outside it block;
    an empty allow list allows everything.
    """

    def __init__(self, deny: Iterable[str] = (), allow: Iterable[str] = ()) -> None:
        self.denied = frozenset(deny)
        self.allowed = frozenset(allow)

    @classmethod
    def deny(cls, names: Iterable[str]) -> BlocklistHook:
        """Block these names."""
        return cls(deny=names)

    @classmethod
    def allow_only(cls, names: Iterable[str]) -> BlocklistHook:
        """Block every name not listed (an empty list allows everything)."""
        return cls(allow=names)

    def on_pre_tool_use(self, ctx: ToolHookContext) -> Optional[HookDecision]:
        """Block denied names, and names outside a non-empty allow list."""
        if ctx.tool in self.denied:
            return HookDecision.block(f"tool '{ctx.tool}' is on the blocklist")
        if self.allowed and ctx.tool not in self.allowed:
            return HookDecision.block(f"tool '{ctx.tool}' is not on the allow list")
        return None


class ConfirmationHook(Hook):
    """Ask ``confirm(ctx) -> bool`` before the listed tools run (all when empty).

    The same-thread variant of approvals: ``confirm`` runs on the run's
    thread and may block (the driver calls pre-tool hooks outside the run's
    fence, so a cancel still ends the run at once); a False answer (or an
    exception) blocks with ``User denied permission``. Nothing outside the
    run sees what it waits for. To let another thread, request or process
    answer, use ``@tool(requires_approval=True)`` or ``loop.with_approval``
    with ``handle.approve`` / ``handle.deny`` (docs/approvals.md).
    """

    def __init__(self, confirm: Callable[[ToolHookContext], bool], tools: Iterable[str] = ()) -> None:
        self.confirm = confirm
        self.tools = frozenset(tools)

    def on_pre_tool_use(self, ctx: ToolHookContext) -> Optional[HookDecision]:
        """Ask; block unless the answer is yes."""
        if self.tools and ctx.tool not in self.tools:
            return None
        try:
            ok = bool(self.confirm(ctx))
        except Exception:
            log.exception("confirmation for tool %r raised; treated as denied", ctx.tool)
            ok = False
        return None if ok else HookDecision.block("User denied permission")


class HookExecutor:
    """Runs hooks in order.

    Args:
        hooks: the hooks, first registered runs first.
        interactive: when False (headless), ``ask`` verdicts block.
    """

    def __init__(self, hooks: Iterable[Hook] = (), interactive: bool = False) -> None:
        self.hooks: list[Hook] = list(hooks)
        self.interactive = interactive

    def add(self, hook: Hook) -> HookExecutor:
        """Append a hook; returns self for chaining."""
        self.hooks.append(hook)
        return self

    def _safe(self, hook: Hook, name: str, *args: object) -> Any:
        try:
            return getattr(hook, name)(*args)
        except Exception:
            log.exception("hook %s.%s raised; ignored", type(hook).__name__, name)
            return None

    def pre_tool_use(self, ctx: ToolHookContext) -> HookDecision:
        """The combined verdict: the first block (or headless ask) wins."""
        for hook in self.hooks:
            d = self._safe(hook, "on_pre_tool_use", ctx)
            if d is None or d.action == "allow":
                continue
            if d.action == "ask" and self.interactive:
                continue
            return d if d.action == "block" else HookDecision.block(d.reason or "needs approval")
        return HookDecision.allow()

    def post_tool_use(self, ctx: ToolHookContext, output: str, is_error: bool) -> None:
        """Tell every hook a call finished."""
        for hook in self.hooks:
            self._safe(hook, "on_post_tool_use", ctx, output, is_error)

    def pre_compact(self, ctx: CompactHookContext) -> PreCompactDecision:
        """Any veto aborts; instructions and extra context are joined in order."""
        abort = False
        instructions: list[str] = []
        extra: list[str] = []
        for hook in self.hooks:
            d = self._safe(hook, "on_pre_compact", ctx)
            if d is None:
                continue
            abort = abort or d.abort
            if d.instructions:
                instructions.append(d.instructions)
            if d.extra_context:
                extra.append(d.extra_context)
        return PreCompactDecision(
            abort, "\n".join(instructions) or None, "\n".join(extra) or None
        )

    def post_compact(self, ctx: CompactHookContext, tokens_after: int) -> None:
        """Tell every hook a compaction happened."""
        for hook in self.hooks:
            self._safe(hook, "on_post_compact", ctx, tokens_after)

    def run_start(self, ctx: RunHookContext) -> None:
        """Tell every hook a run began."""
        for hook in self.hooks:
            self._safe(hook, "on_run_start", ctx)

    def run_end(self, ctx: RunHookContext, success: bool, error: Optional[str]) -> None:
        """Tell every hook a run ended."""
        for hook in self.hooks:
            self._safe(hook, "on_run_end", ctx, success, error)


__all__ = [
    "BlocklistHook",
    "CompactHookContext",
    "ConfirmationHook",
    "Hook",
    "HookDecision",
    "HookExecutor",
    "PreCompactDecision",
    "RunHookContext",
    "ToolHookContext",
]
