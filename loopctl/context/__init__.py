"""Context management: token counting, compaction, contributors, memory."""

from __future__ import annotations

from loopctl.context.tokens import HeuristicTokenCounter, TokenCounter

__all__ = ["HeuristicTokenCounter", "TokenCounter"]
