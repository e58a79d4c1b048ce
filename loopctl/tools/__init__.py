"""Tools: declarations, validation, the registry, and the per-call context."""

from __future__ import annotations

from loopctl.messages import ToolSchema
from loopctl.tools.base import Tool, ToolContext, ToolError, ToolOutput
from loopctl.tools.registry import ToolRegistry

__all__ = ["Tool", "ToolContext", "ToolError", "ToolOutput", "ToolRegistry", "ToolSchema"]
