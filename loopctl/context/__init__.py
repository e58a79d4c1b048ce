"""Context management: token counting, compaction, contributors, memory.

Everything a user needs to keep a long run inside its context window and to
give it memory. The driver uses one token counter everywhere (the manager's
``counter`` is the loop's); contributors and memory only ever add transient
messages to a request, never to the conversation.
"""

from __future__ import annotations

from loopctl.context.compactors import (
    CompactionRequest,
    Compactor,
    SummarizingCompactor,
    TruncatingCompactor,
    safe_split,
)
from loopctl.context.contributors import (
    ContextContributor,
    ContributorContext,
    FunctionContributor,
    GoalReminder,
)
from loopctl.context.manager import ContextManager
from loopctl.context.memory import InMemoryStore, Memory, MemoryEntry, trajectory_entry
from loopctl.context.sqlite_store import SqliteMemoryStore
from loopctl.context.tokens import (
    ConversationMeter,
    HeuristicTokenCounter,
    TokenCounter,
    UsageCalibration,
    count_messages,
)

__all__ = [
    "CompactionRequest",
    "Compactor",
    "ContextContributor",
    "ContextManager",
    "ContributorContext",
    "ConversationMeter",
    "FunctionContributor",
    "GoalReminder",
    "HeuristicTokenCounter",
    "InMemoryStore",
    "Memory",
    "MemoryEntry",
    "SqliteMemoryStore",
    "SummarizingCompactor",
    "TokenCounter",
    "TruncatingCompactor",
    "UsageCalibration",
    "count_messages",
    "safe_split",
    "trajectory_entry",
]
