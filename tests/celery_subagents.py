"""A loop factory for the distributed sub-agent tests: a parent that delegates its PLAN.

The parent's model is a pure function of the request (like ``celery_app``'s):
its first reply hands the run's input, unchanged, to the ``research``
sub-agent (again, up to the plan's ``delegations``, default 1) (a ``celery_app.make_loop`` loop, so the plan's gates, tools and
approvals apply inside the sub-agent); once the tool result is in, it
answers ``delegated: <result>``. ``make_delegating_timed_loop`` also
signals, on Redis, each guidance its parent's or its sub-agent's steering
slot accepts (the steer tests' "delivered on the worker").
"""

from __future__ import annotations

import json
from typing import List, Union

from loopctl import BareLoop, Message, ModelRequest, ModelResponse, SessionConfig
from loopctl.testing import ScriptedClient, call, reply
from tests.celery_app import _plan_in, make_loop, make_timed_loop, signals


def _delegate(request: ModelRequest) -> ModelResponse:
    messages = list(request.messages)
    results = [p for m in messages for p in m.tool_results]
    task = next(m.text for m in messages if m.role == "user")
    if len(results) >= _plan_in(task).get("delegations", 1):
        return reply(f"delegated: {results[-1].output}")
    return call("research", task=task)


def make_delegating_loop(conversation: str, history: List[Message]) -> BareLoop:
    """A parent loop with one sub-agent, ``research`` (a fresh ``make_loop`` loop)."""
    child = make_loop(conversation + "-research", [])
    client = ScriptedClient([_delegate] * 100_000, chunk=32)
    return BareLoop.from_history(client, [child.as_tool("research", "Does the planned work.")], SessionConfig(), history)


def make_delegating_timed_loop(conversation: str, history: List[Message]) -> BareLoop:
    """``make_delegating_loop`` whose slots push each accepted text on Redis.

    The parent's on ``t:<conversation>:accepted``, the ``research``
    sub-agent's on ``t:<conversation>-research:accepted``.
    """
    child = make_timed_loop(conversation + "-research", [])
    client = ScriptedClient([_delegate] * 100_000, chunk=32)
    loop = BareLoop.from_history(
        client, [child.as_tool("research", "Does the planned work.")], SessionConfig(), history
    )
    steering = loop.steering()
    push = steering.push
    key = f"t:{conversation}:accepted"

    def signalled_push(message: Union[Message, str]) -> bool:
        ok = push(message)
        if ok:
            text = message.text if isinstance(message, Message) else message
            signals().rpush(key, json.dumps({"text": text}))
        return ok

    steering.push = signalled_push  # type: ignore[method-assign]
    return loop
