"""The one admission gate for tool calls: ``admit`` runs before anything can run a call.

Every call from every source passes ``admit``: the model's reply (before
it enters the conversation and the run's record), a resumed run's awaited
calls, a recovery retry's corrected call, and the dispatcher's own entry,
so no path reaches a tool, an approval or a policy without it. ``admit``
is deterministic and idempotent (an admitted batch admits to itself).
Rules it keeps:

- ids are unique within a turn: a repeated id is renamed ``<id>-2``,
  ``<id>-3`` ... (the first keeps its id; a name already taken is skipped;
  ``-`` because every provider's id alphabet has it, Anthropic's
  ``[A-Za-z0-9_-]`` included).
  The renamed calls are what the conversation, the record, the approvals,
  the events and the results carry, so the model, the audit trail and a
  person answering agree on which call is which, and one answer can only
  ever answer one call.
- the name is resolved once against the loop's ``ToolRegistry``, which
  refuses silent replacement (a local tool is never swapped for another
  source's tool behind the user's back, an approval-gated one never).
- the arguments are deep-copied into an immutable form
  (``loopctl.frozen``) and that one value is validated against the tool's
  schema: the policy's ``ctx.arguments``, the person's
  ``pending.arguments``, the ``approval_requested`` event, ``Run.approvals``
  and the tool all read this value, and none can change it for another.
  A tool receives a fresh plain copy (``Admitted.arguments()``). An
  approver's edit is validated and frozen again by the approval slot.
- arguments larger than ``MAX_ARGUMENT_CHARS`` (measured as JSON text)
  never reach a tool: the call becomes an invalid call (empty arguments and
  a short reason the model can act on), answered with a soft error.
- a tool's ``validate`` is user code that may block: the gate takes the
  caller's ``unfenced`` and checks the batch inside it (on the run's thread,
  the run's ``rc.unfenced``, so a cancel takes the run over meanwhile).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

import attrs

from loopctl.approvals.gate import Unfence
from loopctl.frozen import FrozenDict, freeze_arguments, thaw
from loopctl.messages import Message, ToolCallPart
from loopctl.tools.registry import ToolRegistry

#: The largest arguments (characters of JSON) a call may carry to a tool.
MAX_ARGUMENT_CHARS = 1_000_000


@attrs.frozen
class Admitted:
    """One call past the gate.

    Attributes:
        call: the call as everyone sees it: its id unique in its turn, its
            ``input`` a ``FrozenDict``.
        tool: the tool its name resolved to (None: no such tool).
        problem: why its arguments fail the tool's schema (None: valid, or
            no tool to check against).
    """

    call: ToolCallPart
    tool: Any
    problem: Optional[str]

    def arguments(self) -> dict[str, Any]:
        """A fresh, plain, mutable copy of the admitted arguments (what a tool receives)."""
        return thaw(self.call.input)  # type: ignore[no-any-return]


def unique_ids(calls: Sequence[ToolCallPart], used: Optional[set[str]] = None) -> list[ToolCallPart]:
    """``calls`` with every id used before renamed ``<id>-N`` (deterministic; a first use keeps its id).

    Used before: earlier in ``calls``, or in ``used`` (the ids of the run's
    earlier calls), which grows by the ids given out. One id names one call
    in a run, so an answer meant for a call (an approval) can never reach
    another that happened to reuse its id, in the same turn or a later one.
    """
    if used is None:
        used = set()
    ids = {c.id for c in calls}
    if len(ids) == len(calls) and ids.isdisjoint(used):
        used |= ids
        return list(calls)
    avoid = ids | used  # a new name is none of these
    out: list[ToolCallPart] = []
    for c in calls:
        cid = c.id
        if cid in used:
            n = 2
            while f"{c.id}-{n}" in avoid:
                n += 1
            cid = f"{c.id}-{n}"
            avoid.add(cid)
            c = attrs.evolve(c, id=cid)
        used.add(cid)
        out.append(c)
    return out


def admit(
    calls: Sequence[ToolCallPart], tools: ToolRegistry, unfenced: Unfence, used: Optional[set[str]] = None
) -> list[Admitted]:
    """The gate: unique ids, resolved names, frozen and validated arguments, in request order.

    Args:
        calls: one turn's calls (or one call of it, for a retry).
        tools: the loop's ``ToolRegistry`` (anything with ``get(name)``).
        unfenced: releases the run's fence while the tools' ``validate``
            runs (``contextlib.nullcontext`` where it is released already).
        used: the ids of the run's earlier calls, for a fresh reply's calls
            (see ``unique_ids``); None for calls admitted again.
    """
    named = unique_ids(calls, used)  # the run's own id set: mutated with the fence held
    with unfenced():
        return [_admit_one(c, tools) for c in named]


def _admit_one(call: ToolCallPart, tools: ToolRegistry) -> Admitted:
    if type(call.input) is FrozenDict:  # admitted before: the same value, checked again below
        frozen: FrozenDict = call.input
    else:
        why = None
        if call.invalid is None and json_size(call.input, MAX_ARGUMENT_CHARS) > MAX_ARGUMENT_CHARS:
            why = (
                f"the arguments of '{call.name[:80]}' are too large (more than {MAX_ARGUMENT_CHARS:,} "
                "characters of JSON); send a smaller call (a path or a reference instead of the content)"
            )
        else:
            try:
                frozen = freeze_arguments(call.input)
            except RecursionError:
                why = f"the arguments of '{call.name[:80]}' are nested too deeply; send a flatter call"
        if why is not None:  # the call cannot run: the model gets the reason as a soft error
            return Admitted(ToolCallPart(call.id, call.name, FrozenDict(), why), None, why)
        call = ToolCallPart(call.id, call.name, frozen, call.invalid)  # not attrs.evolve: the hot path
    tool = tools.get(call.name) if call.name else None
    problem: Optional[str] = None
    if tool is not None and call.invalid is None:
        try:
            problem = tool.validate(frozen)
        except Exception as exc:  # a custom validate() that raises: the call is not valid
            problem = f"validation raised {type(exc).__name__}"
    return Admitted(call, tool, problem)


def same_call(call: ToolCallPart, name: object, args: object) -> bool:
    """Whether ``name``/``args`` are the admitted ``call`` unchanged (by value).

    Equal by value (``1 == True`` included): whoever asks then runs the
    admitted value itself, so what runs is exactly what passed the gate.
    """
    try:
        return name == call.name and args == call.input
    except RecursionError:  # nested deeper than anything admitted: not the call
        return False


def admit_message(
    message: Message, tools: ToolRegistry, unfenced: Unfence, used: Optional[set[str]] = None
) -> tuple[Message, list[Admitted]]:
    """A reply (or resumed message) with its calls admitted in place, and the admitted calls.

    ``unfenced`` and ``used`` as for ``admit``.
    """
    calls = message.tool_calls
    if not calls:
        return message, []
    admitted = admit(calls, tools, unfenced, used)
    if all(a.call is c for a, c in zip(admitted, calls)):
        return message, admitted
    it = iter(a.call for a in admitted)
    parts = tuple(next(it) if type(p) is ToolCallPart else p for p in message.parts)
    return Message(message.role, parts), admitted


def taken(
    admitted: Optional[Sequence[Admitted]], calls: Sequence[ToolCallPart], tools: ToolRegistry
) -> Optional[list[Admitted]]:
    """The gate's verdicts on ``calls`` when these very objects passed it with the reply, else None.

    The reply's calls are admitted as it arrives (record_reply); the ones
    dispatched are those objects, in order (some may have been answered
    already). A call that is not one of them, or whose name the registry no
    longer maps to the tool it was admitted for, goes through the gate again
    (a call the gate refused is answered before dispatch, never passed here).
    ``admitted`` keeps its calls alive, so an id found in it is that very call.
    """
    if not admitted:
        return None
    by_call = {id(a.call): a for a in admitted}
    out = []
    for c in calls:
        a = by_call.get(id(c))
        if a is None or (tools.get(c.name) if c.name else None) is not a.tool:
            return None
        out.append(a)
    return out


def json_size(value: object, limit: int) -> int:
    """The approximate length of ``value`` as JSON text; stops counting past ``limit``."""
    total = 0
    stack = [value]
    while stack:
        v = stack.pop()
        t = type(v)
        if t is int or t is float or t is bool or v is None:  # before the Mapping ABC check, which is slow
            total += 8
        elif isinstance(v, str):
            total += len(v) + 2
        elif isinstance(v, Mapping):
            total += 2
            for k, item in v.items():
                total += len(str(k)) + 4
                stack.append(item)
        elif isinstance(v, (list, tuple)):
            total += 2 + len(v)
            stack.extend(v)
        else:
            total += 8
        if total > limit:
            return total
    return total


__all__ = [
    "MAX_ARGUMENT_CHARS", "Admitted", "admit", "admit_message", "json_size", "same_call", "taken", "unique_ids",
]
