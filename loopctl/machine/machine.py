"""LoopMachine: the sans-IO brain of a run.

Rules it keeps:
1. No threads, clock, IO or logging. Token figures arrive as arguments.
2. ``next_step`` only reports: it changes nothing, so asked twice with no
   feed between, it answers the same. Every other public method that is not
   a property mutates; the driver reports what it measured or met
   (``prepare_turn``: the request's measured size; ``context_overflow``: the
   provider refused the request as too long; ``conclude``: it acts on a
   ``Done``) and the machine decides.
3. Terminal is forever: feeds after it are no-ops, except ``accept_input``
   and ``resume`` (the next run), ``commit_pending`` and ``discard_pending``
   (finalize).
4. History (the committed notebook) changes only through ``commit_pending``
   and ``compaction_result``; a run's messages live in pending until then.
5. A tool result never precedes its call: steering injected while tools
   are awaited is held back until their results arrive.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Optional

from loopctl.errors import ContextExceeded, LoopError, ModelError
from loopctl.machine.answer_feed import AnswerFeed
from loopctl.machine.compaction_feeds import CompactionFeeds
from loopctl.machine.steps import (
    AnswerCheck,
    AnswerVerdict,
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
from loopctl.machine.views import ConversationSnapshot, MessagesView
from loopctl.messages import Message, ModelResponse, StopReason, ToolResultPart


class LoopMachine(CompactionFeeds):
    """The run's state machine: history, pending, turns, limits, termination."""

    @classmethod
    def from_history(cls, history: Iterable[Message]) -> LoopMachine:
        """A fresh machine whose committed history is ``history``."""
        return cls(history)

    # -- the decision ----------------------------------------------------------

    def next_step(self, policy: MachinePolicy) -> Step:
        """Report what the driver does next; changes nothing.

        Order: terminal; cancel flag; awaiting tools; awaiting compaction;
        then for a model turn: max turns, emergency line (>= 95%, inclusive),
        threshold line (strict), else call the model.
        """
        state = self._state
        if state is MachineState.TERMINAL:
            assert self._outcome is not None
            return Done(self._outcome)
        if self._cancelled:
            return _CANCELLED_DONE  # pragma: no cover - cancel() terminates at once
        if state is MachineState.AWAITING_TOOLS:
            return CallTools(self._tool_turn, self._pending_tools)
        if state is MachineState.AWAITING_COMPACTION:
            assert self._compact_reason is not None
            return Compact(self._compact_reason)
        # START or AWAITING_MODEL: evaluate the limits against the estimate.
        return self._model_turn(policy)

    def _model_turn(self, policy: MachinePolicy) -> Step:
        """The model-turn decision from the turn count and the estimate (pure)."""
        if self._turns_taken >= policy.max_turns:
            return _MAX_TURNS_DONE
        window = policy.context_window
        if window > 0:
            tokens = self._context_tokens
            if tokens >= window * 95 // 100:
                return _EMERGENCY
            threshold = policy.compact_threshold
            if policy.auto_compact and threshold > 0 and tokens > window * threshold // 100:
                return _THRESHOLD
        return CallLLM(self._turns_taken)

    # -- feeds -----------------------------------------------------------------

    def prepare_turn(self, request_tokens: int, policy: MachinePolicy) -> Step:
        """The driver measured the request it is about to send: call the model, or compact first?

        ``request_tokens`` is the request's calibrated size with this turn's
        transient extras (contributors, memory) counted. It becomes the
        estimate; the answer is ``CallLLM`` (the model call is awaited) or
        ``Compact`` (the turn defers; the compaction is awaited), and
        ``next_step`` reports the same until the next feed. Terminal: the
        same ``Done``; awaiting tools or a compaction: what is awaited.
        """
        state = self._state
        if state is MachineState.TERMINAL or state is MachineState.AWAITING_TOOLS:
            return self.next_step(policy)
        if state is MachineState.AWAITING_COMPACTION:
            return self.next_step(policy)
        self._context_tokens = request_tokens
        step = self._model_turn(policy)
        if type(step) is CallLLM:
            self._state = MachineState.AWAITING_MODEL
        elif type(step) is Compact:
            self._await_compaction(step.reason)
        return step

    def context_overflow(self, error: ModelError, request_tokens: int, policy: MachinePolicy) -> Step:
        """The provider refused the request as too long for its window (mutates).

        The first refusal of a turn awaits an emergency compaction, after
        which the same turn is asked again; a second refusal of that turn
        ends the run with ``ContextExceeded`` naming the window. Without a
        window (0) there is nothing to compact: the run fails with ``error``.

        Returns:
            What ``next_step`` now reports: ``Compact`` or ``Done``.
        """
        if self._state is MachineState.TERMINAL:
            return self.next_step(policy)
        self._check_not_awaiting_tools("context_overflow")
        window = policy.context_window
        if window <= 0:
            self._terminate(Failed(error))
        elif self._overflow_turn == self._turns_taken:
            self._terminate(Failed(ContextExceeded(used=max(request_tokens, window + 1), limit=window)))
        else:
            self._overflow_turn = self._turns_taken
            self._context_tokens = request_tokens
            self._await_compaction("emergency")
        return self.next_step(policy)

    def conclude(self, policy: MachinePolicy) -> Outcome:
        """The driver acts on the ``Done`` that ``next_step(policy)`` reports: it becomes terminal.

        Returns:
            The run's outcome (the same one for every later call).

        Raises:
            RuntimeError: ``next_step(policy)`` does not report ``Done``.
        """
        step = self.next_step(policy)
        if type(step) is not Done:
            raise RuntimeError(f"conclude() while the machine reports {step!r}")
        if self._state is not MachineState.TERMINAL:
            self._terminate(step.outcome)
        assert self._outcome is not None
        return self._outcome

    def accept_input(self, text: str, answer_check: Optional[AnswerCheck] = None) -> None:
        """Start a run: pending := [user(text)]; turns, estimate and cancel reset.

        History is untouched, so the model sees every earlier run. With
        ``answer_check`` the run wants a typed answer: a final reply that does
        not fit is answered with the problems and the model asked again, up
        to ``answer_check.retries`` times (each a turn), then the run fails
        with ``OutputValidationError``.
        """
        self._answer = AnswerFeed(answer_check)
        self._pending = [Message.user(text)]
        self._pending_epoch += 1
        self._held = ()
        self._state = MachineState.START
        self._outcome = None
        self._turns_taken = 0
        self._context_tokens = 0
        self._cancelled = False
        self._pending_tools = ()
        self._compact_reason = None
        self._overflow_turn = None

    def resume(
        self,
        pending: Iterable[Message],
        turns_taken: int,
        answered: Mapping[str, ToolResultPart],
        answer_check: Optional[AnswerCheck] = None,
    ) -> None:
        """Continue a run from a checkpoint (mutates): pending and the turn count restored.

        ``pending`` is the run's messages so far. When it ends with the
        model's tool calls the machine awaits their results; a call with an
        entry in ``answered`` is pre-answered with it, never dispatched.
        History is untouched; estimate and cancel reset as ``accept_input``
        (and ``answer_check`` is as there).

        Raises:
            ValueError: a negative ``turns_taken``, or an answer for a call
                the last message did not make.
        """
        msgs = list(pending)
        calls = msgs[-1].tool_calls if msgs and msgs[-1].role == "assistant" else []
        stray = sorted(set(answered) - {c.id for c in calls})
        if turns_taken < 0 or stray:
            raise ValueError(f"resume: turns_taken {turns_taken}, answers for calls not made: {stray!r}")
        self.accept_input("", answer_check)
        self._pending = msgs
        self._turns_taken = turns_taken
        if calls:
            self._pending_tools = tuple(PendingToolCall(c, answered.get(c.id)) for c in calls)
            self._tool_turn = max(0, turns_taken - 1)
            self._state = MachineState.AWAITING_TOOLS

    def reads_answer(self, message: Message) -> bool:
        """Whether ``model_response`` reads ``message`` as the run's typed answer (reports only)."""
        check = self._answer.check
        if check is None:
            return False
        calls = message.tool_calls
        final = check.final_tool
        return not calls or (final is not None and any(c.name == final for c in calls))

    def model_response(
        self,
        response: ModelResponse,
        context_tokens: int,
        available_tools: Iterable[str],
        verdict: Optional[AnswerVerdict] = None,
    ) -> None:
        """Record a model reply (mutates).

        A reply without tool calls completes the run. Otherwise each call to a
        tool not in ``available_tools``, and each call marked ``invalid``,
        gets a soft pre-answer in its slot. ``verdict``: the run's answer
        check's reading of a reply ``reads_answer`` picks, when the caller
        made it (the answer type's validators are user code); None: read here.

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
        self._answer.rejected = None
        calls = message.tool_calls
        if self.reads_answer(message):
            self._read_answer(message, response.stop_reason, turn, verdict)
            return
        if not calls:
            self._terminate(Completed(message.text))
            return
        known = available_tools if isinstance(available_tools, (set, frozenset, dict)) else set(
            available_tools
        )
        self._pending_tools = tuple(
            PendingToolCall(c, ToolResultPart(c.id, c.name, c.invalid, True))
            if c.invalid is not None  # a malformed call: the model's to fix
            else PendingToolCall(c)
            if c.name in known
            else PendingToolCall(
                c, ToolResultPart(c.id, c.name, f"tool '{c.name}' is not available", True)
            )
            for c in calls
        )
        self._tool_turn = turn
        self._state = MachineState.AWAITING_TOOLS

    def _read_answer(
        self, message: Message, stop_reason: StopReason, turn: int, verdict: Optional[AnswerVerdict]
    ) -> None:
        got = self._answer.read(message, stop_reason, turn, verdict)
        if got.reply is not None:
            self._pending[-1] = got.reply
        if got.outcome is not None:
            self._terminate(got.outcome)
            return
        assert got.feedback is not None
        self._pending.append(got.feedback)
        if self._held:
            self._pending.extend(self._held)
            self._held = ()
        self._state = MachineState.START  # ready for the next model turn

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
            self._held = ()
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
            self._held = (*self._held, message)
        else:
            self._pending.append(message)

    def set_context_tokens(self, tokens: int) -> None:
        """Replace the context estimate; no-op when terminal."""
        if self._state is not MachineState.TERMINAL:
            self._context_tokens = tokens

    def cancel(self) -> None:
        """Set the cancel flag: the run ends as cancelled at once (mutates).

        A no-op when terminal: a finished run keeps its outcome.
        """
        if self._state is not MachineState.TERMINAL:
            self._cancelled = True
            self._terminate(_CANCELLED)

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
        self._held = ()

    def discard_pending(self) -> None:
        """Drop pending (failure): history stays as it was."""
        self._pending = []
        self._pending_epoch += 1
        self._held = ()

    def load_history(self, messages: Iterable[Message]) -> None:
        """Replace the committed history between runs (mutates; bumps the history epoch).

        For a conversation read again from a store that another process wrote.

        Raises:
            RuntimeError: a run is in flight (pending is not empty, or the
                machine awaits tool results).
        """
        if self._pending or self._state is MachineState.AWAITING_TOOLS:
            raise RuntimeError("load_history fed while a run is in flight")
        self._history = list(messages)
        self._history_epoch += 1

    def snapshot(self) -> dict[str, Any]:
        """A JSON-safe picture of the committed history (for checkpoints)."""
        return {"history": [m.to_dict() for m in self._history]}


_CANCELLED = CancelledOutcome()
_CANCELLED_DONE = Done(_CANCELLED)
_MAX_TURNS_DONE = Done(MaxTurnsReached())
_EMERGENCY = Compact("emergency")
_THRESHOLD = Compact("threshold")

__all__ = ["ConversationSnapshot", "LoopMachine", "MessagesView"]
