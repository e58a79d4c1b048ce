"""A run's Redis hash read back as the registry's answers: ``RunStatus`` and the ``Run``."""

from __future__ import annotations

import json
import time
from typing import Dict

from loopctl.config import RunConfig
from loopctl.errors import Cancelled, LoopError
from loopctl.hosting.registry import RunStatus
from loopctl.output import rebuild_value
from loopctl.records import Run

from .redis import TERMINAL, WorkerLost


def _int(fields: Dict[str, str], name: str) -> int:
    try:
        return int(fields.get(name) or 0)
    except ValueError:
        return 0


def status_from_fields(run_id: str, fields: Dict[str, str]) -> RunStatus:
    """A ``RunStatus`` from the run hash (a queued run is ``"running"``)."""
    state = fields.get("state", "queued")
    terminal = state in TERMINAL
    started = fields.get("started_at") or fields.get("created_at") or "0"
    return RunStatus(
        run_id=run_id,
        state=state if terminal else "running",
        output=fields.get("output", "") if state == "completed" else None,
        error=(fields.get("error") or None) if state in ("cancelled", "failed") else None,
        turns=_int(fields, "turns"),
        tool_calls=_int(fields, "tool_calls"),
        input_tokens=_int(fields, "input_tokens"),
        output_tokens=_int(fields, "output_tokens"),
        started_at=float(started),
        ended_at=float(fields["ended_at"]) if terminal and fields.get("ended_at") else None,
        resumes=_int(fields, "resumes"),
        resume_cause=fields.get("resume_cause") or None,
        output_value=_output_value(fields) if state == "completed" else None,
    )


def _output_value(fields: Dict[str, str]) -> object:
    # A typed run's answer, in its JSON form, from the stored final Run.
    raw = fields.get("run")
    if not raw:
        return None
    try:
        return json.loads(raw).get("output_value")
    except (ValueError, AttributeError):
        return None


def run_from_fields(run_id: str, fields: Dict[str, str]) -> Run:
    """The finished ``Run`` from the run hash; its error is raised with ``.run`` set."""
    raw = fields.get("run")
    if raw:
        run = Run.from_dict(json.loads(raw))
        run.output_value = rebuild_value(run.config.output_type, run.output_value)
    else:  # ended off the worker: lost, expired in the queue, not enqueued
        config = RunConfig.from_dict(json.loads(fields["config"])) if fields.get("config") else RunConfig()
        run = Run(id=run_id, input=fields.get("input", ""), config=config)
        run.start = float(fields.get("started_at") or fields.get("created_at") or run.start)
        run.end = float(fields.get("ended_at") or time.time())
        message = fields.get("error") or "run failed"
        kind = fields.get("error_type")
        if kind == "Cancelled":  # cancelled while it waited to resume
            run.stop_reason = Cancelled(fields.get("cancel_reason") or None)
        else:
            run.stop_reason = WorkerLost(message) if kind == "WorkerLost" else LoopError(message)
    err = run.stop_reason
    if err is None:
        return run
    err.run = run
    raise err


__all__ = ["run_from_fields", "status_from_fields"]
