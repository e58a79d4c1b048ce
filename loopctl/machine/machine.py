"""LoopMachine: the sans-IO brain of a run.

Rules it keeps:
1. No threads, clock, IO or logging. Token figures arrive as arguments.
2. ``next_step`` only reports; asked twice with no feed between, it answers
   the same. Every other public method that is not a property mutates.
3. Terminal is forever: feeds after it are no-ops, except ``accept_input``
   and ``resume`` (the next run), ``commit_pending`` and ``discard_pending``
   (finalize).
4. History (the committed notebook) changes only through ``commit_pending``
   and ``compaction_result``; a run's messages live in pending until then.
5. A tool result never precedes its call: steering injected while tools
   are awaited is held back until their results arrive.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Optional, Union, overload

from loopctl.errors import ContextExceeded, LoopError
from loopctl.machine.steps import (
    CallLLM,
    CallTools,
    CancelledOutcome,
    Compact,
    Completed,
    Done,
    Failed,
    MachinePolicy,
    MachineState,
    MaxTurnsReached,
    Outcome,
    PendingToolCall,
    Step,
)
from loopctl.messages import Message, ModelResponse, ToolResultPart


class MessagesView(Sequence[Message]):
    """A live, read-only view of one of the machine's message lists (no copy)."""

    __slots__ = ("_items",)

    def __init__(self, items: list[Message]) -> None:
        self._items = items

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> list[Message]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[Message, list[Message]]:
        return self._items[index]

    def __iter__(self) -> Iterator[Message]:
        return iter(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MessagesView):
            return self._items == other._items
        if isinstance(other, (list, tuple)):
            return self._items == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"MessagesView({self._items!r})"


class ConversationSnapshot(Sequence[Message]):
    """A stable, read-only snapshot of ``prefix + history + pending``, made in O(1).

    It stays valid because the machine only ever appends to its lists or
    replaces them wholesale; the snapshot keeps each list and its length.
    """

    __slots__ = ("_segments", "_len")

    def __init__(self, segments: Sequence[tuple[Sequence[Message], int]]) -> None:
        self._segments = tuple(segments)
        self._len = sum(n for _, n in self._segments)

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> list[Message]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[Message, list[Message]]:
        if isinstance(index, slice):
            return list(self)[index]
        i = index + self._len if index < 0 else index
        if not 0 <= i < self._len:
            raise IndexError("conversation index out of range")
        for items, n in self._segments:
            if i < n:
                return items[i]
            i -= n
        raise IndexError("conversation index out of range")  # pragma: no cover

    def __iter__(self) -> Iterator[Message]:
        for items, n in self._segments:
            if n == len(items):
                yield from items
            else:
                for k in range(n):
                    yield items[k]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple, ConversationSnapshot)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ConversationSnapshot({list(self)!r})"


class LoopMachine:
    """The run's state machine: history, pending, turns, limits, termination."""

    def __init__(self, history: Iterable[Message] = ()) -> None:
        self._history: list[Message] = list(history)
        self._pending: list[Message] = []
        self._held: list[Message] = []
        self._state = MachineState.START
        self._outcome: Optional[Outcome] = None
        self._turns_taken = 0
        self._context_tokens = 0
        self._cancelled = False
        self._tool_turn = 0
        self._pending_tools: tuple[PendingToolCall, ...] = ()
        self._compact_reason: Optional[str] = None
        self._history_epoch = 0
        self._pending_epoch = 0

    @classmethod
    def from_history(cls, history: Iterable[Message]) -> LoopMachine:
        """A fresh machine whose committed history is ``history``."""
        return cls(history)

    # -- reads ---------------------------------------------------------------

    @property
    def history(self) -> MessagesView:
        """Committed messages from earlier runs (and compactions); live view."""
        return MessagesView(self._history)

    @property
    def pending(self) -> MessagesView:
        """This run's messages, not yet committed; live view."""
        return MessagesView(self._pending)

    @property
    def history_epoch(self) -> int:
        """Bumped whenever history is replaced wholesale (not when it grows)."""
        return self._history_epoch

    @property
    def pending_epoch(self) -> int:
        """Bumped whenever pending is replaced or cleared (not when it grows)."""
        return self._pending_epoch

    @property
    def state(self) -> MachineState:
        """The current state."""
        return self._state

    @property
    def outcome(self) -> Optional[Outcome]:
        """The terminal outcome, or None while the run is live."""
        return self._outcome

    @property
    def turns_taken(self) -> int:
        """Model replies accepted in this run."""
        return self._turns_taken

    @property
    def context_tokens(self) -> int:
        """The current context-size estimate (fed by the driver)."""
        return self._context_tokens

    @property
    def is_terminal(self) -> bool:
        """True once the run has an outcome."""
        return self._state is MachineState.TERMINAL

    @property
    def is_cancelled(self) -> bool:
        """True when the cancel flag is set for this run."""
        return self._cancelled

    def full_history(self) -> list[Message]:
        """History then pending: what the next request sends (a new list)."""
        return self._history + self._pending

    def snapshot_conversation(self, prefix: Sequence[Message] = ()) -> ConversationSnapshot:
        """``prefix + history + pending`` as an O(1) snapshot (no copy of the lists)."""
        segs: list[tuple[Sequence[Message], int]] = []
        if prefix:
            segs.append((tuple(prefix), len(prefix)))
        segs.append((self._history, len(self._history)))
        segs.append((self._pending, len(self._pending)))
        return ConversationSnapshot(segs)

    # -- the decision ----------------------------------------------------------

    def next_step(self, policy: MachinePolicy) -> Step:
        """Decide what the driver does next; records the transition it reports.

        Order: terminal; cancel flag; awaiting tools; awaiting compaction;
        then for a model turn: max turns, emergency line (>= 95%, inclusive),
        threshold line (strict), else call the model.
        """
        state = self._state
        if state is MachineState.TERMINAL:
            assert self._outcome is not None
            return Done(self._outcome)
        if self._cancelled:
            return Done(self._terminate(CancelledOutcome()))
        if state is MachineState.AWAITING_TOOLS:
            return CallTools(self._tool_turn, self._pending_tools)
        if state is MachineState.AWAITING_COMPACTION:
            assert self._compact_reason is not None
            return Compact(self._compact_reason)
        # START or AWAITING_MODEL: (re)evaluate the limits against the estimate.
        if self._turns_taken >= policy.max_turns:
            return Done(self._terminate(MaxTurnsReached()))
        window = policy.context_window
        if window > 0:
            tokens = self._context_tokens
            if tokens >= window * 95 // 100:
                return self._compact("emergency")
            threshold = policy.compact_threshold
            if policy.auto_compact and threshold > 0 and tokens > window * threshold // 100:
                return self._compact("threshold")
        self._state = MachineState.AWAITING_MODEL
        return CallLLM(self._turns_taken)

    def _compact(self, reason: str) -> Compact:
        self._state = MachineState.AWAITING_COMPACTION
        self._compact_reason = reason
        return Compact(reason)

    def _terminate(self, outcome: Outcome) -> Outcome:
        self._state = MachineState.TERMINAL
        self._outcome = outcome
        self._pending_tools = ()
        self._compact_reason = None
        return outcome

    # -- feeds -----------------------------------------------------------------

    def accept_input(self, text: str) -> None:
        """Start a run: pending := [user(text)]; turns, estimate and cancel reset.

        History is untouched, so the model sees every earlier run.
        """
        self._pending = [Message.user(text)]
        self._pending_epoch += 1
        self._held = []
        self._state = MachineState.START
        self._outcome = None
        self._turns_taken = 0
        self._context_tokens = 0
        self._cancelled = False
        self._pending_tools = ()
        self._compact_reason = None

    def resume(
        self, pending: Iterable[Message], turns_taken: int, answered: Mapping[str, ToolResultPart]
    ) -> None:
        """Continue a run from a checkpoint (mutates): pending and the turn count restored.

        ``pending`` is the run's messages so far (its input first). When it
        ends with the model's tool calls, the machine awaits their results;
        a call with an entry in ``answered`` is pre-answered with it and
        never dispatched. History is untouched; estimate and cancel reset.

        Raises:
            ValueError: an empty ``pending``, a negative ``turns_taken``, or
                an answer for a call the last message did not make.
        """
        msgs = list(pending)
        if not msgs or turns_taken < 0:
            raise ValueError(f"resume needs pending messages and turns >= 0, got {len(msgs)}, {turns_taken}")
        self.accept_input("")
        self._pending = msgs
        self._turns_taken = turns_taken
        last = msgs[-1]
        calls = last.tool_calls if last.role == "assistant" else []
        ids = {c.id for c in calls}
        stray = [k for k in answered if k not in ids]
        if stray:
            raise ValueError(f"resume: answers for call ids the last message did not make: {stray!r}")
        if calls:
            self._pending_tools = tuple(PendingToolCall(c, answered.get(c.id)) for c in calls)
            self._tool_turn = max(0, turns_taken - 1)
            self._state = MachineState.AWAITING_TOOLS

    def model_response(
        self, response: ModelResponse, context_tokens: int, available_tools: Iterable[str]
    ) -> None:
        """Record a model reply (mutates).

        A reply without tool calls completes the run. Otherwise each call to a
        tool not in ``available_tools`` gets a soft pre-answer in its slot.

        Raises:
            RuntimeError: when tool results or a compaction are still awaited.
        """
        if self._state is MachineState.TERMINAL:
            return
        if self._state is MachineState.AWAITING_TOOLS:
            raise RuntimeError("model_response fed while tool results are awaited")
        if self._state is MachineState.AWAITING_COMPACTION:
            raise RuntimeError("model_response fed while a compaction is awaited")
        message = response.message
        self._pending.append(message)
        self._context_tokens = context_tokens
        turn = self._turns_taken
        self._turns_taken = turn + 1
        calls = message.tool_calls
        if not calls:
            self._terminate(Completed(message.text))
            return
        known = available_tools if isinstance(available_tools, (set, frozenset, dict)) else set(
            available_tools
        )
        self._pending_tools = tuple(
            PendingToolCall(c)
            if c.name in known
            else PendingToolCall(
                c, ToolResultPart(c.id, c.name, f"tool '{c.name}' is not available", True)
            )
            for c in calls
        )
        self._tool_turn = turn
        self._state = MachineState.AWAITING_TOOLS

    def tool_results(self, messages: Iterable[Message]) -> None:
        """Record the turn's tool results (mutates); held steering follows them.

        Raises:
            RuntimeError: when no tool calls are awaited.
            ValueError: when a result answers no awaited call (it would
                precede, or lack, its call in the conversation).
        """
        if self._state is MachineState.TERMINAL:
            return
        if self._state is not MachineState.AWAITING_TOOLS:
            raise RuntimeError("tool_results fed while no tool calls are awaited")
        fed = list(messages)
        awaited = {p.call.id for p in self._pending_tools}
        for message in fed:
            for result in message.tool_results:
                if result.tool_call_id not in awaited:
                    raise ValueError(
                        f"tool result for call id {result.tool_call_id!r} "
                        f"(tool {result.tool_name!r}) answers no awaited call"
                    )
        self._pending.extend(fed)
        if self._held:
            self._pending.extend(self._held)
            self._held = []
        self._pending_tools = ()
        self._state = MachineState.START

    def inject(self, message: Message) -> None:
        """Append ``message`` to pending (steering); no-op when terminal.

        The estimate is not refreshed: pair with ``set_context_tokens``. While
        tool results are awaited the message is held and lands right after
        them, so a call and its result are never split.
        """
        if self._state is MachineState.TERMINAL:
            return
        if self._state is MachineState.AWAITING_TOOLS:
            self._held.append(message)
        else:
            self._pending.append(message)

    def set_context_tokens(self, tokens: int) -> None:
        """Replace the context estimate; no-op when terminal."""
        if self._state is not MachineState.TERMINAL:
            self._context_tokens = tokens

    def compaction_result(
        self, messages: Iterable[Message], tokens_before: int, tokens_after: int
    ) -> None:
        """Adopt a compacted conversation as history; clears pending (a commit point).

        ``tokens_after >= tokens_before`` fails the run with ``ContextExceeded``.

        Raises:
            RuntimeError: when tool results are awaited (clearing pending
                would orphan the awaited calls).
        """
        if self._state is MachineState.TERMINAL:
            return
        self._check_not_awaiting_tools("compaction_result")
        if self._no_progress(tokens_before, tokens_after):
            return
        self._history = list(messages)
        self._pending = []
        self._history_epoch += 1
        self._pending_epoch += 1
        self._context_tokens = tokens_after
        self._compact_reason = None
        self._state = MachineState.START

    def compaction_noop(self, tokens_before: int, tokens_after: int) -> None:
        """A pass that changed nothing; history and pending stay as they are.

        ``tokens_after >= tokens_before`` fails the run with ``ContextExceeded``.

        Raises:
            RuntimeError: when tool results are awaited.
        """
        if self._state is MachineState.TERMINAL:
            return
        self._check_not_awaiting_tools("compaction_noop")
        if self._no_progress(tokens_before, tokens_after):
            return
        self._context_tokens = tokens_after
        self._compact_reason = None
        self._state = MachineState.START

    def _check_not_awaiting_tools(self, feed: str) -> None:
        if self._state is MachineState.AWAITING_TOOLS:
            raise RuntimeError(f"{feed} fed while tool results are awaited")

    def _no_progress(self, before: int, after: int) -> bool:
        if after >= before:
            self._terminate(Failed(ContextExceeded(used=after, limit=before)))
            return True
        return False

    def cancel(self) -> None:
        """Set the cancel flag; the next decision ends the run as cancelled.

        A no-op when terminal: a finished run keeps its outcome.
        """
        if self._state is not MachineState.TERMINAL:
            self._cancelled = True

    def fail(self, error: LoopError) -> None:
        """End the run as ``Failed(error)`` at once; no-op when already terminal."""
        if self._state is not MachineState.TERMINAL:
            self._terminate(Failed(error))

    def commit_pending(self) -> None:
        """Append pending to history and clear it (success).

        Steering still held for unanswered tool calls is dropped with them:
        it was never part of the conversation (``full_history``).
        """
        self._history.extend(self._pending)
        self._pending = []
        self._pending_epoch += 1
        self._held = []

    def discard_pending(self) -> None:
        """Drop pending (failure): history stays as it was."""
        self._pending = []
        self._pending_epoch += 1
        self._held = []

    def snapshot(self) -> dict[str, Any]:
        """A JSON-safe picture of the committed history (for checkpoints)."""
        return {"history": [m.to_dict() for m in self._history]}


__all__ = ["ConversationSnapshot", "LoopMachine", "MessagesView"]
