"""Tools: declarations, validation, the registry, the pipeline, recovery, health.

``@tool`` (``decorator.py``) builds a ``Tool`` from a typed, documented
function; ``Tool`` (``base.py``) is the class-based protocol for tools with
state. ``ToolRegistry`` holds them by name. ``ToolPipeline`` wraps the
registry in middleware (``middleware.py`` ships timeout, permission,
output-limit and unknown-tool layers). ``recovery.py`` holds the reflector
and strategy protocols; ``health.py`` the per-tool breakers. Nothing here
imports the driver: the driver's dispatcher ties these together.
"""

from __future__ import annotations

from loopctl.messages import ToolSchema
from loopctl.tools.base import Tool, ToolContext, ToolError, ToolOutput, to_output
from loopctl.tools.decorator import FunctionTool, tool
from loopctl.tools.health import ToolHealth, ToolHealthRegistry
from loopctl.tools.middleware import (
    OutputLimitMiddleware,
    PermissionCheck,
    PermissionMiddleware,
    TimeoutMiddleware,
    UnknownToolMiddleware,
)
from loopctl.tools.pipeline import (
    DispatchContext,
    ToolMiddleware,
    ToolPipeline,
    ToolPipelineBuilder,
)
from loopctl.tools.recovery import (
    MAX_RETRIES,
    AskUser,
    Correction,
    CorrectionKind,
    ExponentialBackoffRecovery,
    Fail,
    FailureAnalysis,
    NoopReflector,
    NoRetryRecovery,
    RecoveryAction,
    RecoveryStrategy,
    ReflectionContext,
    Reflector,
    Retry,
    Severity,
    Skip,
)
from loopctl.tools.registry import ToolConflict, ToolRegistry

__all__ = [
    "MAX_RETRIES",
    "AskUser",
    "Correction",
    "CorrectionKind",
    "DispatchContext",
    "ExponentialBackoffRecovery",
    "Fail",
    "FailureAnalysis",
    "FunctionTool",
    "NoRetryRecovery",
    "NoopReflector",
    "OutputLimitMiddleware",
    "PermissionCheck",
    "PermissionMiddleware",
    "RecoveryAction",
    "RecoveryStrategy",
    "ReflectionContext",
    "Reflector",
    "Retry",
    "Severity",
    "Skip",
    "TimeoutMiddleware",
    "Tool",
    "ToolConflict",
    "ToolContext",
    "ToolError",
    "ToolHealth",
    "ToolHealthRegistry",
    "ToolMiddleware",
    "ToolOutput",
    "ToolPipeline",
    "ToolPipelineBuilder",
    "ToolRegistry",
    "ToolSchema",
    "UnknownToolMiddleware",
    "tool",
    "to_output",
]
