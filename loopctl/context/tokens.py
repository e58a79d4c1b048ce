"""Token counting: one pluggable counter, incremental measuring, calibration.

Rules kept here:

- The loop uses ONE counter everywhere (the driver hands its counter to the
  context manager and the meter).
- Measuring the conversation each turn costs O(new messages): the meter
  keeps a running sum per list and counts only what was appended since the
  last measure; a list replaced wholesale (a compaction, a new run's
  pending) is recounted once.
- Provider usage reports calibrate the estimate: the ratio reported /
  predicted is clamped to 0.25-4.0 and moves halfway toward each sample.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Optional, Protocol, runtime_checkable

from loopctl.checks import integer, number
from loopctl.messages import Message, TextPart, ThinkingPart, ToolCallPart, ToolResultPart


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens; the loop uses one counter everywhere."""

    def count_text(self, text: str) -> int: ...

    def count_message(self, message: Message) -> int: ...


class HeuristicTokenCounter:
    """About ``chars_per_token`` characters a token, plus a per-message overhead.

    Args:
        chars_per_token: characters per token (finite, > 0).
        per_message: tokens added for each message's framing (>= 0).

    Raises:
        ConfigError: a value is out of range (the message names it).
    """

    def __init__(self, chars_per_token: float = 4.0, per_message: int = 4) -> None:
        self.chars_per_token = number(chars_per_token, "HeuristicTokenCounter.chars_per_token", 0, above=True)
        self.per_message = integer(per_message, "HeuristicTokenCounter.per_message", 0)

    @classmethod
    def openai(cls) -> HeuristicTokenCounter:
        """Preset for OpenAI-family tokenizers."""
        return cls(4.3, 4)

    @classmethod
    def anthropic(cls) -> HeuristicTokenCounter:
        """Preset for Anthropic tokenizers."""
        return cls(3.6, 5)

    @classmethod
    def gemini(cls) -> HeuristicTokenCounter:
        """Preset for Gemini tokenizers."""
        return cls(4.05, 4)

    @classmethod
    def local_default(cls) -> HeuristicTokenCounter:
        """Preset for local open-weight models."""
        return cls(3.8, 4)

    def count_text(self, text: str) -> int:
        """Tokens in ``text`` (ceil of chars / ratio)."""
        if not text:
            return 0
        return math.ceil(len(text) / self.chars_per_token)

    def count_message(self, message: Message) -> int:
        """Tokens in one message, framing included."""
        n = 0
        for p in message.parts:
            t = type(p)
            if t is TextPart or t is ThinkingPart:
                n += len(p.text)  # type: ignore[union-attr]
            elif t is ToolResultPart:
                n += len(p.output) + len(p.tool_name)  # type: ignore[union-attr]
            elif t is ToolCallPart:
                n += len(p.name) + len(repr(p.input))  # type: ignore[union-attr]
        return self.per_message + (math.ceil(n / self.chars_per_token) if n else 0)

    def __repr__(self) -> str:
        return f"HeuristicTokenCounter(chars_per_token={self.chars_per_token:g}, per_message={self.per_message})"


def count_messages(counter: TokenCounter, messages: Iterable[Message]) -> int:
    """Tokens in every message of ``messages``."""
    return sum(counter.count_message(m) for m in messages)


def _same(a: object, b: object) -> bool:
    # Identities are list objects (compared by identity, never by content)
    # or epoch numbers (compared by value: equal ints need not be one object).
    return a is b or (type(a) is int and type(b) is int and a == b)


class _ListTally:
    __slots__ = ("ref", "count", "tokens")

    def __init__(self) -> None:
        self.ref: Optional[object] = None
        self.count = 0
        self.tokens = 0

    def measure(self, counter: TokenCounter, items: Sequence[Message], ref: object) -> int:
        n = len(items)
        count = self.count
        if n == count and ref is self.ref:  # the common case: nothing new since the last measure
            return self.tokens
        tokens = self.tokens
        if not _same(ref, self.ref) or n < count:
            count, tokens = 0, 0
        if n > count:
            cm = counter.count_message
            for i in range(count, n):  # a plain loop: usually one new message, no generator to build
                tokens += cm(items[i])
        # Kept in one step once every count is in: a counter that raises (or a
        # run abandoned inside one) leaves the tally as it was.
        self.ref, self.count, self.tokens = ref, n, tokens
        return tokens


class ConversationMeter:
    """Measures history + pending in O(new messages) per call.

    ``identity`` arguments name the underlying list objects: when one changes
    (a compaction replaced history, a new run replaced pending) that list is
    recounted once.
    """

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self._history = _ListTally()
        self._pending = _ListTally()

    def measure(
        self,
        history: Sequence[Message],
        pending: Sequence[Message],
        history_id: object = None,
        pending_id: object = None,
    ) -> int:
        """Tokens in history plus pending."""
        return self._history.measure(self.counter, history, history_id) + self._pending.measure(
            self.counter, pending, pending_id
        )

    def measure_pending(self, pending: Sequence[Message], pending_id: object = None) -> int:
        """Tokens in history, as last measured, plus ``pending``.

        For a caller that knows history has not changed since its last
        ``measure`` (the driver compares the machine's size key): history's
        view is never made or read.
        """
        return self._history.tokens + self._pending.measure(self.counter, pending, pending_id)

    def reset(self) -> None:
        """Forget the cached sums (after swapping the counter, say)."""
        self._history = _ListTally()
        self._pending = _ListTally()


class UsageCalibration:
    """Moves estimates toward what the provider reports.

    The ratio (reported / predicted) is clamped to 0.25-4.0; the first report
    sets it, later ones move it halfway toward each new sample; zero reports
    are ignored.
    """

    def __init__(self) -> None:
        self.ratio: Optional[float] = None
        self._prediction = 0

    def note_prediction(self, raw_tokens: int) -> None:
        """Remember the raw estimate of the request about to be sent."""
        self._prediction = raw_tokens

    def observe(self, reported_input_tokens: int) -> None:
        """Fold in the provider's input-token report for that request."""
        if reported_input_tokens <= 0 or self._prediction <= 0:
            return
        if reported_input_tokens >= 4 * self._prediction:  # no division: a huge int would not fit a float
            sample = 4.0
        else:
            sample = max(0.25, reported_input_tokens / self._prediction)
        self.ratio = sample if self.ratio is None else (self.ratio + sample) / 2

    def scale(self, raw_tokens: int) -> int:
        """The calibrated figure for a raw estimate."""
        return raw_tokens if self.ratio is None else int(raw_tokens * self.ratio)


__all__ = [
    "ConversationMeter",
    "HeuristicTokenCounter",
    "TokenCounter",
    "UsageCalibration",
    "count_messages",
]
