"""Token measuring for the driver: the conversation, the request overhead, calibration.

The machine never counts: the driver measures and reports figures to it.
A figure is the raw count (cached per conversation epoch by
``ConversationMeter``) plus the request overhead (system prompt and tool
schemas, fixed per run), scaled by what the provider's usage reports taught
the calibration.

The meter measures on a run's body thread, with the run's fence held. A
counter other than the built-in heuristic is user code that may block (a
tokenizer service, say): it is called outside the fence (``UnfencedCounter``),
so a cancel takes the run over meanwhile, and the meter keeps a figure
only once the counting is done, so a run abandoned inside it keeps nothing.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Optional

from loopctl.context.tokens import (
    ConversationMeter,
    HeuristicTokenCounter,
    TokenCounter,
    UsageCalibration,
    count_messages,
)
from loopctl.driver.handle import current_run
from loopctl.machine import LoopMachine
from loopctl.messages import Message, ToolSchema

#: Each tool schema's JSON text, by the schema's identity: a ``@tool``
#: function hands every loop the same schema object, so a fresh loop's first
#: run counts it without encoding it again (a tool that makes a new schema
#: per registry is encoded per loop, as without the cache). Bounded. An
#: entry holds its schema, so the schema's id is not reused while the entry
#: lives: a hit is always that schema's text.
_SCHEMA_JSON: dict[int, tuple[ToolSchema, str]] = {}
_SCHEMA_JSON_MAX = 512


def _schema_json(schema: ToolSchema) -> str:
    """``schema`` as the request sends it (JSON, never ``repr``)."""
    hit = _SCHEMA_JSON.get(id(schema))
    if hit is not None:
        return hit[1]
    # JSON, as the request sends it; and not repr(): a container's repr
    # leaves a recursion-guard dict on the run's thread for its lifetime.
    text = json.dumps(schema.to_dict(), default=str)
    if len(_SCHEMA_JSON) >= _SCHEMA_JSON_MAX:
        _SCHEMA_JSON.clear()
    _SCHEMA_JSON[id(schema)] = (schema, text)
    return text


class UnfencedCounter:
    """A user's token counter as the meter calls it: outside the fence of the run this thread works for.

    Only the meter calls it, on a run's body thread with the fence held (or
    outside any run, where there is no fence); a run taken over meanwhile
    raises ``Abandoned`` as the count returns.
    """

    __slots__ = ("counter",)

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter

    def count_text(self, text: str) -> int:
        with _outside_fence():
            return self.counter.count_text(text)

    def count_message(self, message: Message) -> int:
        with _outside_fence():
            return self.counter.count_message(message)


def _outside_fence() -> AbstractContextManager[None]:
    """The fence of the run this thread works for, released meanwhile (nothing to release outside a run)."""
    rc = current_run()
    return contextlib.nullcontext() if rc is None else rc.unfenced()


def _measuring(counter: TokenCounter) -> TokenCounter:
    """``counter`` as the meter calls it: the built-in heuristic as is, any other unfenced."""
    return counter if type(counter) is HeuristicTokenCounter else UnfencedCounter(counter)


class TokenMeter:
    """Measures what a request costs, in calibrated tokens (one per loop)."""

    __slots__ = ("counter", "_conversation", "calibration", "overhead", "_key", "_raw", "_overhead_prompt", "_overhead_schemas")

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = _measuring(counter)
        self._conversation = ConversationMeter(self.counter)
        self.calibration = UsageCalibration()
        self.overhead = 0
        self._key: Optional[tuple[int, int, int, int]] = None  # the machine's size key at the last measure
        self._raw = 0
        # The system prompt and schemas tuple the overhead was counted for
        # (two slots, not a tuple: one object fewer for the collector to walk).
        self._overhead_prompt: Optional[str] = None
        self._overhead_schemas: Optional[Iterable[ToolSchema]] = None

    def set_counter(self, counter: TokenCounter) -> None:
        """Use ``counter`` from now on (before the first run)."""
        self.counter = _measuring(counter)
        self._conversation = ConversationMeter(self.counter)
        self._key = None
        self._overhead_schemas = None

    def begin_run(self, system_prompt: Optional[str], schemas: Iterable[ToolSchema]) -> None:
        """Fix the request overhead for the run: system prompt plus tool schemas.

        A loop's registry hands out the same schemas tuple until its tools
        change, so a run with the same prompt and tuple reuses the count.
        """
        self._key = None
        if self._overhead_schemas is schemas and self._overhead_prompt == system_prompt:
            return
        counter = self.counter
        head = counter.count_message(Message.system(system_prompt)) if system_prompt else 0
        self.overhead = head + sum(counter.count_text(_schema_json(s)) for s in schemas)
        self._overhead_prompt = system_prompt
        self._overhead_schemas = schemas

    def raw(self, machine: LoopMachine) -> int:
        """Uncalibrated tokens of history + pending + overhead."""
        m = machine
        key = m.size_key
        last = self._key
        if key != last:  # the machine only appends or replaces: same key, same lists
            if last is not None and key[0] == last[0] and key[1] == last[1]:  # only pending moved
                self._raw = self._conversation.measure_pending(m.pending, key[2])
            else:
                self._raw = self._conversation.measure(m.history, m.pending, key[0], key[2])
            self._key = key
        return self._raw + self.overhead

    def figure(self, machine: LoopMachine) -> int:
        """The calibrated size of the conversation as the next request would send it."""
        return self.calibration.scale(self.raw(machine))

    def count(self, messages: Sequence[Message]) -> int:
        """Uncalibrated tokens of ``messages`` (transient extras)."""
        return count_messages(self.counter, messages) if messages else 0

    def figure_for(self, messages: Iterable[Message]) -> int:
        """The calibrated size of a request carrying ``messages``."""
        return self.calibration.scale(count_messages(self.counter, messages) + self.overhead)


__all__ = ["TokenMeter", "UnfencedCounter"]
