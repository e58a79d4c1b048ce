"""Compactors: how a conversation is made smaller.

A compactor turns a message list into a shorter one; the ``ContextManager``
decides when and checks the result fits. Rules every shipped compactor keeps:

- the first message is kept (it usually states the goal);
- a tool call is never separated from its result (pairs are matched per
  occurrence of a call id, first call to first result); a result whose call
  is gone is dropped, never sent alone;
- the result is never empty, and a conversation of ``min_messages`` or fewer
  is returned unchanged (the same list object: "nothing to do").

``safe_split`` exposes the pair-safe old/recent split for custom compactors.
"""

from __future__ import annotations

import logging
from collections import defaultdict, deque
from collections.abc import Sequence
from typing import Any, Callable, Optional, Protocol, runtime_checkable

import attrs

from loopctl.checks import integer, shown
from loopctl.context.tokens import HeuristicTokenCounter, TokenCounter, count_messages
from loopctl.errors import ConfigError
from loopctl.messages import (
    Message,
    ModelRequest,
    ModelResponse,
    RequestOptions,
    Role,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolResultPart,
)

log = logging.getLogger("loopctl")

SUMMARY_PREFIX = "Summary of the earlier conversation (written by the assistant; reference only):"
EXTRA_CONTEXT_PREFIX = "Context kept across compaction:"


@attrs.frozen
class CompactionRequest:
    """What a compactor is asked to do.

    Attributes:
        target: tokens the compacted messages should fit in (a hint; None = none).
        counter: the loop's one token counter.
        reason: ``"threshold"``, ``"emergency"`` or a caller's reason.
        instructions: guidance from a pre-compact hook (summaries follow it).
        extra_context: text from a pre-compact hook to keep in the result.
        summarize: makes one model call (``ModelRequest -> ModelResponse``), or None.
    """

    target: Optional[int] = None
    counter: TokenCounter = attrs.field(factory=HeuristicTokenCounter)
    reason: str = "threshold"
    instructions: Optional[str] = None
    extra_context: Optional[str] = None
    summarize: Optional[Callable[[ModelRequest], ModelResponse]] = None


@runtime_checkable
class Compactor(Protocol):
    """Makes a conversation smaller; returns ``messages`` itself when it cannot."""

    def compact(self, messages: Sequence[Message], request: CompactionRequest) -> Sequence[Message]: ...


# -- pairing ---------------------------------------------------------------------


def tool_pairs(messages: Sequence[Message]) -> tuple[list[tuple[int, int]], set[tuple[int, int]]]:
    """Match tool calls to results by message index.

    Returns:
        ``(pairs, orphans)``: ``pairs`` holds ``(call_index, result_index)`` for
        each matched call; ``orphans`` holds ``(message_index, part_index)`` of
        results with no earlier unmatched call of that id.
    """
    open_calls: dict[str, deque[int]] = defaultdict(deque)
    pairs: list[tuple[int, int]] = []
    orphans: set[tuple[int, int]] = set()
    for i, m in enumerate(messages):
        for j, p in enumerate(m.parts):
            t = type(p)
            if t is ToolCallPart:
                open_calls[p.id].append(i)  # type: ignore[union-attr]
            elif t is ToolResultPart:
                q = open_calls.get(p.tool_call_id)  # type: ignore[union-attr]
                if q:
                    pairs.append((q.popleft(), i))
                else:
                    orphans.add((i, j))
    return pairs, orphans


def safe_split(messages: Sequence[Message], preserve_recent: int) -> int:
    """The index where the recent tail starts, moved earlier so no pair straddles it.

    Calls in the first message do not hold the split back (the first message
    is always kept; its results are reattached). Returns a value ``<= 1`` when
    there is nothing older than the tail to drop.
    """
    split = len(messages) - preserve_recent
    if split <= 1:
        return split
    pairs, _ = tool_pairs(messages)
    pairs = [pr for pr in pairs if pr[0] >= 1 and pr[0] != pr[1]]
    while split > 1:
        straddling = [c for c, r in pairs if c < split <= r]
        if not straddling:
            break
        split = min(straddling)
    return split


def _assemble(
    messages: Sequence[Message], split: int, inserted: Sequence[Message]
) -> list[Message]:
    """First message, its reattached results, ``inserted``, then ``messages[split:]``.

    Results whose call is not kept are dropped; messages left empty go.
    """
    first = messages[0]
    # FIFO pairing: the first results of an id answer the first message's calls.
    owed: dict[str, int] = {}
    for p in first.parts:
        if type(p) is ToolCallPart:
            owed[p.id] = owed.get(p.id, 0) + 1
    reattached: list[Any] = []
    if owed:
        for m in messages[1:split]:
            for p in m.parts:
                if type(p) is ToolResultPart and owed.get(p.tool_call_id, 0) > 0:
                    owed[p.tool_call_id] -= 1
                    reattached.append(p)
    out = [first]
    if reattached:
        out.append(Message(Role.USER, tuple(reattached)))
    out.extend(inserted)
    out.extend(messages[split:])
    return _drop_orphans(out)


def _drop_orphans(messages: list[Message]) -> list[Message]:
    _, orphans = tool_pairs(messages)
    if not orphans:
        return messages
    out: list[Message] = []
    for i, m in enumerate(messages):
        if i == 0:  # the first message is kept as it is
            out.append(m)
            continue
        parts = tuple(p for j, p in enumerate(m.parts) if (i, j) not in orphans)
        if len(parts) == len(m.parts):
            out.append(m)
        elif parts:
            out.append(Message(m.role, parts))
    return out


# -- truncation ------------------------------------------------------------------


class TruncatingCompactor:
    """Keeps the first message and the most recent ones (the default).

    Positional: it keeps ``preserve_recent`` messages (moved earlier to keep
    pairs whole). Only when a target is given and the result is still above
    it does the tail shrink, one message at a time down to one.

    Args:
        preserve_recent: recent messages kept (>= 1).
        min_messages: conversations this short are left alone (>= 2).
    """

    def __init__(self, preserve_recent: int = 4, min_messages: int = 6) -> None:
        self.preserve_recent = integer(preserve_recent, "TruncatingCompactor.preserve_recent", 1)
        self.min_messages = integer(min_messages, "TruncatingCompactor.min_messages", 2)

    def truncate(self, messages: Sequence[Message], preserve_recent: int, inserted: Sequence[Message] = ()) -> Sequence[Message]:
        """One positional pass; returns ``messages`` itself when nothing can go."""
        if len(messages) <= self.min_messages:
            return messages
        split = safe_split(messages, preserve_recent)
        if split <= 1:
            return messages
        return _assemble(messages, split, inserted)

    def compact(self, messages: Sequence[Message], request: Optional[CompactionRequest] = None) -> Sequence[Message]:
        """The truncated conversation, or ``messages`` itself when it is short."""
        request = request or CompactionRequest()
        inserted = _extra(request.extra_context)
        result = self.truncate(messages, self.preserve_recent, inserted)
        if result is messages or request.target is None:
            return result
        counter = request.counter
        keep = self.preserve_recent
        while keep > 1 and count_messages(counter, result) > request.target:
            keep -= 1
            smaller = self.truncate(messages, keep, inserted)
            if smaller is not messages:
                result = smaller
        return result

    def __repr__(self) -> str:
        return f"TruncatingCompactor(preserve_recent={self.preserve_recent}, min_messages={self.min_messages})"


def _extra(text: Optional[str]) -> list[Message]:
    return [Message.user(f"{EXTRA_CONTEXT_PREFIX}\n{text}")] if text else []


# -- summarizing -----------------------------------------------------------------

DEFAULT_SUMMARY_PROMPT = (
    "Summarize the conversation below so the work can continue without it. Keep the goal, "
    "decisions made, facts learned (file names, values, results of tool calls), what was "
    "tried and failed, and what remains to do. Be concise and factual; do not invent."
)


class SummarizingCompactor:
    """Asks the model to summarize the older part; keeps the recent tail verbatim.

    The older messages (after the first) are rendered as a plain transcript
    and sent in one request through the loop's client. When that call fails,
    returns nothing or is not available, it falls back to truncation.

    Args:
        preserve_recent: recent messages kept verbatim (>= 1).
        min_messages: conversations this short are left alone (>= 2).
        max_summary_tokens: ``max_tokens`` asked of the summary call (>= 16).
        max_transcript_chars: the transcript sent is cut (oldest part first)
            to this many characters (>= 1000).
        prompt: the summarizing instruction.
    """

    def __init__(
        self,
        preserve_recent: int = 6,
        min_messages: int = 8,
        max_summary_tokens: int = 1024,
        max_transcript_chars: int = 200_000,
        prompt: str = DEFAULT_SUMMARY_PROMPT,
    ) -> None:
        self.preserve_recent = integer(preserve_recent, "SummarizingCompactor.preserve_recent", 1)
        self.min_messages = integer(min_messages, "SummarizingCompactor.min_messages", 2)
        self.max_summary_tokens = integer(max_summary_tokens, "SummarizingCompactor.max_summary_tokens", 16)
        self.max_transcript_chars = integer(max_transcript_chars, "SummarizingCompactor.max_transcript_chars", 1000)
        if not isinstance(prompt, str) or not prompt.strip():
            raise ConfigError(f"SummarizingCompactor prompt must be a non-empty str, got {shown(prompt)}")
        self.prompt = prompt
        self._fallback = TruncatingCompactor(preserve_recent, min_messages)

    def summary_request(self, older: Sequence[Message], instructions: Optional[str]) -> ModelRequest:
        """The request sent to the model for ``older``."""
        text = render_transcript(older, self.max_transcript_chars)
        ask = self.prompt
        if instructions:
            ask += f"\n\nAdditional instructions:\n{instructions}"
        user = f"{ask}\n\n<conversation>\n{text}\n</conversation>"
        return ModelRequest(
            (Message.user(user),),
            "You write faithful, compact summaries of agent conversations.",
            (),
            RequestOptions(max_tokens=self.max_summary_tokens),
        )

    def compact(self, messages: Sequence[Message], request: Optional[CompactionRequest] = None) -> Sequence[Message]:
        """The first message, a summary message, then the recent tail."""
        request = request or CompactionRequest()
        if len(messages) <= self.min_messages:
            return messages
        split = safe_split(messages, self.preserve_recent)
        if split <= 2:  # fewer than two older messages: a summary would not shrink anything
            return messages
        summary = self._ask(messages[1:split], request)
        if summary is None:
            return self._fallback.compact(messages, request)
        body = f"{SUMMARY_PREFIX}\n{summary}"
        if request.extra_context:
            body += f"\n\n{EXTRA_CONTEXT_PREFIX}\n{request.extra_context}"
        return _assemble(messages, split, [Message.user(body)])

    def _ask(self, older: Sequence[Message], request: CompactionRequest) -> Optional[str]:
        if request.summarize is None:
            log.warning("summarizing compactor has no model to ask; truncating instead")
            return None
        try:
            response = request.summarize(self.summary_request(older, request.instructions))
            text = response.message.text.strip()
        except Exception as exc:  # any failure of the call: fall back, never fail the pass
            log.warning("summary call failed (%s: %s); truncating instead", type(exc).__name__, exc)
            return None
        if not text:
            log.warning("summary call returned no text; truncating instead")
            return None
        return text

    def __repr__(self) -> str:
        return f"SummarizingCompactor(preserve_recent={self.preserve_recent}, min_messages={self.min_messages})"


def render_transcript(messages: Sequence[Message], max_chars: int) -> str:
    """Messages as ``role: text`` lines (tool calls and results included), newest kept."""
    lines: list[str] = []
    for m in messages:
        for p in m.parts:
            t = type(p)
            if t is TextPart:
                lines.append(f"{m.role.value}: {p.text}")  # type: ignore[union-attr]
            elif t is ToolCallPart:
                lines.append(f"{m.role.value} called {p.name} with {dict(p.input)!r}")  # type: ignore[union-attr]
            elif t is ToolResultPart:
                tag = "error" if p.is_error else "result"  # type: ignore[union-attr]
                lines.append(f"tool {p.tool_name} {tag}: {_clip(p.output, 2000)}")  # type: ignore[union-attr]
            elif t is ThinkingPart:
                continue
    text = "\n".join(lines)
    if len(text) > max_chars:
        text = "[...earlier part cut...]\n" + text[-max_chars:]
    return text


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 20] + f"...[{len(text) - n + 20} chars cut]"


__all__ = [
    "CompactionRequest",
    "Compactor",
    "EXTRA_CONTEXT_PREFIX",
    "SUMMARY_PREFIX",
    "SummarizingCompactor",
    "TruncatingCompactor",
    "render_transcript",
    "safe_split",
    "tool_pairs",
]
