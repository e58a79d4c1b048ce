"""The read side of ``CeleryRunRegistry``: what any process sees of a run in Redis.

Plain functions over a ``RedisBackend`` that the registry's ``status``,
``result``, ``leftovers``, ``list``, ``history`` and ``events`` call: a
run's fields (``KeyError`` for an unknown id, and for another owner's run:
the same answer, so ids cannot be probed), its status with approvals,
waiting for its end without polling, its undelivered guidance, and following
its event stream (``after=`` resume, ``gap`` events, reaping a lost run in a
quiet read slice).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any, Dict, List, Optional, Tuple

import attrs

from loopctl.checks import shown
from loopctl.errors import ConfigError
from loopctl.hosting.registry import RunStatus
from loopctl.hosting.serialization import history_from_dict
from loopctl.messages import Message
from loopctl.records import Run

from .approvals import decisions_of, read_pending
from .fields import run_from_fields, status_from_fields
from .redis import TERMINAL, RedisBackend
from .steers import steer_from_json


def check_owner(owner: object) -> Optional[str]:
    """``owner`` as stored with a run: a non-empty str, or None for no owner."""
    if owner is None or (isinstance(owner, str) and owner):
        return owner
    raise ConfigError(f"owner must be a non-empty str or None, got {type(owner).__name__} {shown(owner)}")


def is_run_id(value: object) -> bool:
    """Whether ``value`` can name a run: a non-empty str without ``:``.

    A run's keys are its id plus ``:``-suffixes (``<id>:ev``, ``<id>:done``):
    an id holding ``:`` could name another run's keys.
    """
    return isinstance(value, str) and bool(value) and ":" not in value


def fields_of(backend: RedisBackend, run_id: str, owner: Optional[str] = None) -> Dict[str, str]:
    """The run's stored fields (every by-id call's first read).

    Raises:
        KeyError: an unknown (or expired) run id, one no run can have, or a
            run started with another ``owner`` (the same message: ids cannot
            be probed).
    """
    if not is_run_id(run_id):
        raise KeyError(f"unknown run id {run_id!r:.100}")
    fields = backend.status(run_id)
    if not fields or fields.get("owner") != check_owner(owner):
        raise KeyError(f"unknown run id {run_id!r}")
    return fields


def status_of(backend: RedisBackend, run_id: str, owner: Optional[str] = None) -> RunStatus:
    """The run's snapshot: pending approvals while running, decisions once ended."""
    fields = fields_of(backend, run_id, owner)
    status = status_from_fields(run_id, fields)
    if status.state == "running":
        return attrs.evolve(status, pending_approvals=tuple(read_pending(backend, run_id)))
    return attrs.evolve(status, approvals=decisions_of(fields))


def wait_result(
    backend: RedisBackend, run_id: str, timeout: Optional[float], read_slice: float, owner: Optional[str] = None
) -> Run:
    """The finished ``Run`` (or its error raised), waiting in slices of ``read_slice``."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        fields = fields_of(backend, run_id, owner)
        if fields.get("state") in TERMINAL:
            return run_from_fields(run_id, fields)
        wait = read_slice
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise TimeoutError(f"run {run_id} not finished after {timeout}s")
        backend.wait_done(run_id, wait)


def leftovers_of(backend: RedisBackend, run_id: str, owner: Optional[str] = None) -> List[Message]:
    """The run's accepted, undelivered guidance (``KeyError`` for an unknown run)."""
    fields_of(backend, run_id, owner)
    return [steer_from_json(s)[0] for s in backend.leftovers(run_id)]


def list_statuses(backend: RedisBackend, owner: Optional[str] = None, all_owners: bool = False) -> List[RunStatus]:
    """Status of ``owner``'s known runs (every owner's with ``all_owners``), oldest first.

    ``owner=None`` lists only runs started without an owner. Expired ids are
    forgotten.
    """
    owner = check_owner(owner)
    if not isinstance(all_owners, bool):
        raise TypeError(f"all_owners must be a bool, got {type(all_owners).__name__}")
    ids = backend.run_ids()
    out: List[RunStatus] = []
    gone: List[str] = []
    for rid, fields in zip(ids, backend.statuses(ids)):
        if not fields:
            gone.append(rid)
        elif all_owners or fields.get("owner") == owner:
            out.append(status_from_fields(rid, fields))
    backend.forget(gone)
    return out


def history_of(backend: RedisBackend, conversation: str) -> List[Message]:
    """The conversation's committed history (empty for a new conversation)."""
    raw = backend.history(conversation)
    return history_from_dict(json.loads(raw)) if raw else []


def follow_events(
    backend: RedisBackend,
    run_id: str,
    after: int,
    timeout: Optional[float],
    fields: Dict[str, str],
    read_slice: float,
) -> Iterator[Tuple[int, Dict[str, Any]]]:
    """Yield the run's ``(seq, event)`` after ``after`` until ``run_end`` (or ``timeout``)."""
    pos = after
    if fields.get("state") in TERMINAL and int(fields.get("seq") or 0) <= pos:
        return  # ended, and the caller has everything
    while True:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = read_slice
            if deadline is not None:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    return
            batch = backend.read_events(run_id, pos, wait)
            if batch:
                break
            # A quiet slice: reap a lost run (adds its run_end), or stop if all was read.
            fields = backend.status(run_id)
            if not fields:
                return
            if fields.get("state") in TERMINAL and int(fields.get("seq") or 0) <= pos:
                return
        for seq, data in batch:
            if seq > pos + 1:
                sid = backend.status(run_id).get("session_id", "")
                yield seq - 1, {
                    "type": "gap",
                    "session_id": sid,
                    "run_id": run_id,
                    "dropped": seq - 1 - pos,
                }
            event = json.loads(data)
            yield seq, event
            pos = seq
            if event.get("type") == "run_end" and not event.get("subagent"):
                return
