"""The approval gate: which calls of a batch wait for a person, and dispatch around them.

This is the driver's glue around ``loopctl.approvals``: it reads the
driver's admitted calls (``admission.Admitted``), which the approvals
package may not import; the policy question, the parked batch and the
answers' reporting live in ``loopctl.approvals.gate``.

Before a batch runs, ``park_batch`` asks of each admitted call (see
``admission``: its id is unique in the turn, its arguments frozen and
validated): does its tool say ``requires_approval``, or does the loop's
policy (``with_approval``) say so for these arguments? Only calls whose
arguments pass the tool's schema are asked about (an invalid call never
runs, so nobody need approve it); a policy that raises counts as "needs
approval" (fail closed). Every call that needs one is parked in the run's
``ApprovalSlot`` at once, in request order, each announced by
``on_approval_requested``, so a person sees the whole batch. One parked
call, one answer: ids are unique, so an answer never covers another call.
The policy, the person, the event and the record all read the one frozen
value the gate admitted; an edit is validated and frozen again by the slot.

``dispatch_parked`` then walks the batch's waves in order: a wave's free
calls run first (they never wait for a person), then the gate waits for
the wave's parked calls (unfenced: a cancel takes the run over at once;
``on_approval_resolved`` fires as each answer arrives, for any call of the
batch), and the approved ones run, with edited arguments when the approver
gave them. A denied call never runs: its result is the soft error "the
user denied this call: <reason>", with no ``on_tool_pre``. Results stay in
request order. An approval covers the call's recovery retries as approved;
a retry whose correction changes the call and needs approval is not run
(``needs_approval`` says so for the dispatcher). So is a call a pipeline
layer rewrote (``pipeline_gate``: the core of the loop's pipeline runs a
call only as admitted, or its rewrite admitted again).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Optional, Tuple, Union

import attrs

from loopctl.approvals import ApprovalContext, denial_text
from loopctl.approvals.gate import ApprovalPolicy, EventSink, ParkedBatch, Unfence, ask_policy
from loopctl.approvals.slot import ApprovalSlot
from loopctl.driver.admission import Admitted, admit, same_call
from loopctl.events import ApprovalRequested
from loopctl.frozen import thaw
from loopctl.messages import ToolCallPart, ToolResultPart
from loopctl.tools.base import Tool
from loopctl.tools.pipeline import DispatchContext, Gate, not_found_text
from loopctl.tools.registry import ToolRegistry


def needs_approval(
    admitted: Admitted, policy: Optional[ApprovalPolicy], ctx: ApprovalContext, unfenced: Unfence
) -> bool:
    """Whether an admitted call waits for a person (its tool says so, or the policy does)."""
    tool = admitted.tool
    if tool is None or admitted.problem is not None or admitted.call.invalid is not None:
        return False  # it never runs: nothing to approve
    if getattr(tool, "requires_approval", False):
        return True
    return policy is not None and ask_policy(policy, ctx, unfenced)


def pipeline_gate(
    call: ToolCallPart, tool: Optional[Tool], tools: ToolRegistry, policy: Optional[ApprovalPolicy]
) -> Gate:
    """What the loop's pipeline core asks before it runs an attempt of ``call`` (admitted for ``tool``).

    A layer may rewrite ``ctx.tool_name`` / ``ctx.input``. The call as it
    passed the gate (and was approved) runs with a fresh copy of those
    arguments; a changed call passes the gate again: a name the registry
    lacks, arguments that fail the tool's schema, or a call that now needs a
    person's approval (its tool says so, or the policy does for the new
    arguments) is a soft error, never run, as a recovery correction is.
    """

    def gate(ctx: DispatchContext) -> Union[Tuple[Tool, Mapping[str, Any]], str]:
        name, args = ctx.tool_name, ctx.input
        if same_call(call, name, args):
            return not_found_text(name, tools) if tool is None else (tool, thaw(call.input))
        if not isinstance(name, str) or not isinstance(args, Mapping):
            return f"Tool '{call.name}': a middleware layer rewrote the call into something that is not a tool call"
        again = admit([ToolCallPart(call.id, name, args)], tools, contextlib.nullcontext)[0]  # already unfenced here
        if again.tool is None:
            return not_found_text(name, tools)
        problem = again.call.invalid or again.problem
        if problem is not None:
            return f"Tool '{name}': the call as a middleware layer rewrote it is not valid: {problem}"
        tc = ctx.tool_context
        asked = ApprovalContext(
            name, again.call.input, call.id, tc.run_id if tc else "", tc.session_id if tc else "", ctx.turn
        )
        if needs_approval(again, policy, asked, contextlib.nullcontext):  # already unfenced here
            return (
                f"Tool '{name}': not run: a middleware layer changed the call after it was admitted, "
                "and the changed call needs a person's approval"
            )
        return again.tool, again.arguments()

    return gate


def park_batch(
    slot: ApprovalSlot,
    policy: Optional[ApprovalPolicy],
    calls: Sequence[Admitted],
    *,
    events: EventSink,
    session_id: str,
    turn: int,
    default_timeout: Optional[float],
    unfenced: Unfence,
    before_asking: Callable[[], None] = lambda: None,
) -> Optional[ParkedBatch]:
    """Park the calls that need approval; None when none does (the fast path).

    ``before_asking()`` runs once, before the first call is parked: it may
    end the run (a stop the loop detector armed) before a person is asked.

    Raises:
        Cancelled: the run was cancelled (the slot is closed).
    """
    ids: dict[int, str] = {}
    for i, admitted in enumerate(calls):
        call, tool = admitted.call, admitted.tool
        # The frozen admitted arguments: a policy cannot change what runs.
        ctx = ApprovalContext(call.name, call.input, call.id, slot.run_id, session_id, turn)
        if not needs_approval(admitted, policy, ctx, unfenced):
            continue
        if not ids:
            before_asking()
        if call.id in ids.values():  # the gate makes ids unique: a repeat here is a bug, never a bypass
            raise RuntimeError(f"call id {call.id!r} parked twice in one batch")
        timeout = getattr(tool, "approval_timeout", None)
        if timeout is None:
            timeout = default_timeout
        pending = slot.request(call.id, call.name, call.input, turn=turn, timeout=timeout, validate=tool.validate)
        ids[i] = call.id
        if events.wants(ApprovalRequested):
            events.emit(
                ApprovalRequested(session_id, slot.run_id, turn, call.id, call.name, pending.arguments, timeout)
            )
    return ParkedBatch(slot, events, session_id, ids) if ids else None


def dispatch_parked(
    batch: ParkedBatch,
    calls: Sequence[Admitted],
    waves: Sequence[Sequence[int]],
    run_group: Callable[[Sequence[Admitted]], list[ToolResultPart]],
    check_cancel: Callable[[], None],
    unfenced: Unfence,
    denied: Callable[[ToolCallPart, str], ToolResultPart],
) -> list[ToolResultPart]:
    """Run ``calls`` wave by wave around their approvals; results in request order.

    ``run_group(calls)`` runs calls that may overlap (one call alone, or a
    parallel wave) and returns their results in order; ``denied(call,
    text)`` answers a call that was not approved (the dispatcher counts the
    answer for the loop detector, like any result).
    """
    results: list[Optional[ToolResultPart]] = [None] * len(calls)

    def run(indices: list[int], group: list[Admitted]) -> None:
        if indices:
            for i, r in zip(indices, run_group(group)):
                results[i] = r

    for wave in waves:
        check_cancel()
        free = [i for i in wave if not batch.is_parked(i)]
        run(free, [calls[i] for i in free])
        parked = [i for i in wave if batch.is_parked(i)]
        if not parked:
            continue
        batch.wait_for(parked, unfenced)
        check_cancel()
        go: list[int] = []
        group: list[Admitted] = []
        for i in parked:
            d = batch.decision(i)
            admitted = calls[i]
            call = admitted.call
            if d.approved:
                go.append(i)
                # An edit was validated and frozen by the slot: it runs as recorded.
                group.append(attrs.evolve(admitted, call=attrs.evolve(call, input=d.arguments)) if d.edited else admitted)
            else:
                results[i] = denied(call, denial_text(d.reason))
        run(go, group)
    return results  # type: ignore[return-value]


__all__ = ["dispatch_parked", "needs_approval", "park_batch", "pipeline_gate"]
