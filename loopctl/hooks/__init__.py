"""Hooks, at the import path the docs teach.

A stable alias of ``loopctl.events.hooks`` (hooks live beside the events):
both paths name the same classes.
"""

from __future__ import annotations

from loopctl.events.hooks import (
    BlocklistHook,
    CompactHookContext,
    ConfirmationHook,
    Hook,
    HookDecision,
    HookExecutor,
    PreCompactDecision,
    RunHookContext,
    ToolHookContext,
)

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
