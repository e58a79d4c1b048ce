"""Approvals across processes: the pending list in Redis, answers carried to the run's worker.

The run's approval slot lives on the worker that executes it; Redis only
carries what other processes need:

- the pending list: the worker's events thread mirrors each batch's
  ``approval_requested`` / ``approval_resolved`` into the run's hash
  ``<prefix>:run:<id>:appr`` (call id -> ``PendingApproval`` JSON) just
  before the batch is appended to the event stream (so whoever read an
  approval event finds the list up to date), and drops the hash when the
  run ends; readers trust it only while the run's state is "running";
- an answer: the answering process publishes ``a<json>`` on the run's
  control channel, naming a one-off reply list, and waits (``BLPOP``,
  bounded) for the worker's verdict. The worker's bridge thread applies it
  to the run's ``RunHandle`` (the slot decides, exactly as in-process: once,
  validated, refused after the end) and pushes ``1``, ``0`` or ``E<message>``
  (an invalid edit, raised again as ``ValueError`` by the answering side).

A run that is not running (queued, ended, lost) has nothing pending, and an
answer to it returns False. When nobody listens on the channel (the worker
died and its heartbeat has not lapsed yet, or the run is ending), the
answer returns False too; a worker that dies while a call waits fails the
run like any lost run ("worker lost").
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Dict, List, Optional, Tuple

from loopctl.approvals import ApprovalDecision, PendingApproval
from loopctl.errors import LoopError
from loopctl.events import ApprovalRequested, ApprovalResolved, Event
from loopctl.text import masked_head

from .redis import RedisBackend, RegistryUnavailable, dumps

log = logging.getLogger("loopctl")

#: A backstop expiry for a pending list whose worker died mid-run (seconds).
PENDING_TTL_S = 7 * 24 * 3600
#: How long a reply list lives if its asker gave up (seconds).
REPLY_TTL_S = 60


def pending_key(backend: RedisBackend, run_id: str) -> str:
    """The run's pending-approvals hash."""
    return backend.run_key(run_id, ":appr")


# -- the worker's side -------------------------------------------------------------------


def mirror(backend: RedisBackend, run_id: str, batch: Sequence[Tuple[int, Event]]) -> None:
    """Reflect a written batch's approval events in the pending hash (the events thread)."""
    changes = [ev for _, ev in batch if type(ev) in (ApprovalRequested, ApprovalResolved)]
    if not changes:
        return
    key = pending_key(backend, run_id)
    with backend.guard("approvals"):
        pipe = backend.r.pipeline(transaction=False)
        for ev in changes:
            if isinstance(ev, ApprovalRequested):
                p = PendingApproval(
                    ev.call_id, ev.tool, dict(ev.arguments), run_id, time.time(), ev.turn, ev.timeout, ev.subagent
                )
                pipe.hset(key, ev.call_id, dumps(p.to_dict()))
            elif isinstance(ev, ApprovalResolved):
                pipe.hdel(key, ev.call_id)
        pipe.expire(key, PENDING_TTL_S)
        pipe.execute()


def drop(backend: RedisBackend, run_id: str) -> None:
    """Forget the run's pending list (the run ended on this worker)."""
    try:
        with backend.guard("approvals"):
            backend.r.delete(pending_key(backend, run_id))
    except RegistryUnavailable:
        log.warning("run %s: could not drop its pending approvals (readers ignore them)", run_id)


def answer_here(backend: RedisBackend, handle: Any, raw: str) -> None:
    """Apply an answer that arrived on the control channel; reply with the verdict (the bridge thread)."""
    try:
        req = json.loads(raw)
        reply = str(req["reply"])
    except (ValueError, KeyError, TypeError):
        log.error("run: dropped a malformed approval answer %r", masked_head(raw, 80))
        return
    try:
        by = req.get("by")
        if req.get("op") == "approve":
            where = req.get("subagent")
            ok = handle.approve(str(req["call_id"]), by=by, arguments=req.get("arguments"), subagent=where)
        else:
            ok = handle.deny(str(req["call_id"]), str(req.get("reason", "")), by=by, subagent=req.get("subagent"))
        verdict = "1" if ok else "0"
    except (ValueError, TypeError, KeyError) as exc:
        verdict = "E" + str(exc)
    try:
        with backend.guard("approval reply"):
            pipe = backend.r.pipeline(transaction=False)
            pipe.rpush(reply, verdict)
            pipe.expire(reply, REPLY_TTL_S)
            pipe.execute()
    except RegistryUnavailable as exc:
        log.warning("could not reply to an approval answer: %s", exc)


# -- the answering side -------------------------------------------------------------------


def ask_worker(backend: RedisBackend, run_id: str, request: Dict[str, Any]) -> Optional[str]:
    """Carry an answer to the run's worker and wait for its verdict.

    Returns:
        The verdict text, or None when no worker listens on the run's channel.

    Raises:
        RegistryUnavailable: Redis failed, or the worker did not reply in time
            (the answer may or may not have been taken).
    """
    reply = backend.run_key(run_id, ":reply:" + uuid.uuid4().hex)
    data = "a" + dumps({**request, "reply": reply})
    with backend.guard("approval"):
        listeners = int(backend.r.publish(backend.channel(run_id), data))
    if listeners == 0:
        return None
    wait = backend.socket_timeout
    with backend.guard("approval reply"):
        got = backend.rb.blpop([reply], timeout=wait)
    if got is None:
        raise RegistryUnavailable(
            f"the worker of run {run_id} did not confirm the answer within {wait}s; it may or may not have been taken"
        )
    return str(got[1])


class ApprovalsMixin:
    """``pending_approvals`` / ``approve`` / ``deny`` by run id for ``CeleryRunRegistry``."""

    _backend: RedisBackend

    def _fields(self, run_id: str, owner: Optional[str] = None) -> Dict[str, str]:
        raise NotImplementedError

    def pending_approvals(self, run_id: str, *, owner: Optional[str] = None) -> List[PendingApproval]:
        """The run's tool calls waiting for a person's answer, in request order.

        Raises:
            KeyError: unknown ``run_id``, or another ``owner``'s run.
            RegistryUnavailable: Redis could not be reached.
        """
        if self._fields(run_id, owner).get("state") != "running":
            return []
        return read_pending(self._backend, run_id)

    def approve(
        self,
        run_id: str,
        call_id: str,
        *,
        by: Optional[str] = None,
        arguments: Optional[Mapping[str, Any]] = None,
        owner: Optional[str] = None,
        subagent: Optional[str] = None,
    ) -> bool:
        """Let the run's waiting call run (on whichever worker holds it), optionally with edited ``arguments``.

        ``subagent`` says which run of the tree the call waits in (``""`` the
        run itself, a sub-agent's path); None: wherever it waits, if that is
        one place only (else ``ValueError``).

        Returns:
            True when this answer was taken; False when the call is not
            waiting (unknown id, answered already, the run is not running).

        Raises:
            KeyError: unknown ``run_id``, or another ``owner``'s run.
            ValueError: ``arguments`` do not fit the tool's schema (the
                message names the field); the call stays pending.
            RegistryUnavailable: Redis failed, or the worker did not confirm in time.
        """
        if arguments is not None and not isinstance(arguments, Mapping):
            raise ValueError(f"arguments must be a mapping of field to value, got {type(arguments).__name__}")
        request = {
            "op": "approve", "call_id": call_id, "by": by, "subagent": subagent,
            "arguments": None if arguments is None else dict(arguments),
        }
        return self._answer(run_id, request, owner)

    def deny(
        self,
        run_id: str,
        call_id: str,
        reason: str,
        *,
        by: Optional[str] = None,
        owner: Optional[str] = None,
        subagent: Optional[str] = None,
    ) -> bool:
        """Refuse the run's waiting call; the model reads "the user denied this call: <reason>".

        Returns:
            True when this answer was taken; False when the call is not waiting.

        Raises:
            KeyError: unknown ``run_id``, or another ``owner``'s run.
            RegistryUnavailable: Redis failed, or the worker did not confirm in time.
        """
        if not isinstance(reason, str):
            raise TypeError(f"deny reason must be a str, got {type(reason).__name__}")
        request = {"op": "deny", "call_id": call_id, "by": by, "reason": reason, "subagent": subagent}
        return self._answer(run_id, request, owner)

    def _answer(self, run_id: str, request: Dict[str, Any], owner: Optional[str] = None) -> bool:
        if request.get("by") is not None and not isinstance(request["by"], str):
            raise TypeError(f"by must be a str or None, got {type(request['by']).__name__}")
        if request.get("subagent") is not None and not isinstance(request["subagent"], str):
            raise TypeError(f"subagent must be a str or None, got {type(request['subagent']).__name__}")
        if self._fields(run_id, owner).get("state") != "running":
            return False
        verdict = ask_worker(self._backend, run_id, request)
        if verdict is None:
            return False
        if verdict.startswith("E"):
            raise ValueError(verdict[1:])
        return verdict == "1"


def read_pending(backend: RedisBackend, run_id: str) -> List[PendingApproval]:
    """The mirrored pending list, in the order the calls were parked."""
    with backend.guard("approvals"):
        raw: List[str] = backend.r.hvals(pending_key(backend, run_id))
    out = []
    for text in raw:
        try:
            out.append(PendingApproval.from_dict(json.loads(text)))
        except (ValueError, KeyError, TypeError, LoopError):
            log.error("run %s: skipped a malformed pending approval %r", run_id, masked_head(text, 80))
    out.sort(key=lambda p: p.requested_at)
    return out


def decisions_of(fields: Mapping[str, str]) -> Tuple[ApprovalDecision, ...]:
    """The approval decisions in a finished run's stored record (empty when absent)."""
    raw = fields.get("run")
    if not raw:
        return ()
    try:
        return tuple(ApprovalDecision.from_dict(d) for d in json.loads(raw).get("approvals") or ())
    except (ValueError, KeyError, TypeError, AttributeError):
        return ()


__all__ = [
    "ApprovalsMixin",
    "answer_here",
    "ask_worker",
    "decisions_of",
    "drop",
    "mirror",
    "pending_key",
    "read_pending",
]
