"""The Celery task that executes runs, and what routes it to a registry.

Owns the task name, the process-wide map from key prefix to registry (a
worker's task finds "its" registry there), the per-app task object
(``task_for``, at-most-once options forced), the task body
(``execute_task``) and the optional OpenTelemetry propagation the task and
``start`` use to carry the starter's trace context to the worker. Each task
logs one INFO line on the ``loopctl.celery`` logger when it ends: the run
id, how it ended and how long the task took; never the run's input, its
guidance or an error's text (which could name a URL with its password),
only the error's type.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any, Dict, List, Optional, Protocol

from loopctl.errors import LoopError

from .signals import connect_signals

TASK_NAME = "loopctl.contrib.celery.execute_run"

log = logging.getLogger("loopctl.celery")


class Executor(Protocol):
    """What the task needs of a registry: claim and execute a queued run."""

    def execute(self, run_id: str, conversation: str) -> str: ...


#: prefix -> this process's registry with that prefix (weakly held).
REGISTRIES: weakref.WeakValueDictionary[str, Executor] = weakref.WeakValueDictionary()
_TASKS: weakref.WeakKeyDictionary[object, object] = weakref.WeakKeyDictionary()
_TASKS_LOCK = threading.Lock()


def execute_task(
    run_id: str, prefix: str, conversation: str, trace: Optional[Dict[str, str]] = None
) -> str:
    """The Celery task body: find this process's registry for ``prefix`` and run.

    ``trace`` is the starter's W3C trace context: current around the run, so
    the run's spans join the starter's trace.
    """
    t0 = time.monotonic()
    outcome = "error"
    try:
        outcome = _execute(run_id, prefix, conversation, trace)
        return outcome
    except BaseException as exc:
        outcome = f"error ({type(exc).__name__})"
        raise
    finally:
        log.info("run %s %s in %.2f s", run_id, outcome, time.monotonic() - t0)


def _execute(run_id: str, prefix: str, conversation: str, trace: Optional[Dict[str, str]]) -> str:
    reg = REGISTRIES.get(prefix)
    if reg is None:
        raise LoopError(
            f"no CeleryRunRegistry with prefix {prefix!r} in this worker: construct it in a "
            "module the worker imports (the app module); run "
            f"{run_id} stays queued"
        )
    carrier = propagation() if trace else None
    if carrier is None:
        return reg.execute(run_id, conversation)
    with carrier.attached(trace):
        return reg.execute(run_id, conversation)


_PROPAGATION: List[Any] = []  # [module or None] once looked up


def propagation() -> Any:
    """``loopctl.contrib.otel.propagation`` if OpenTelemetry is importable, else None."""
    if not _PROPAGATION:
        try:
            from loopctl.contrib.otel import propagation as module
        except ImportError:  # no [otel] extra: runs carry no trace context
            _PROPAGATION.append(None)
        else:
            _PROPAGATION.append(module)
    return _PROPAGATION[0]


def task_for(app: Any) -> Any:
    """The app's task object for ``TASK_NAME`` (made once per app; signals connected)."""
    with _TASKS_LOCK:
        connect_signals(REGISTRIES, TASK_NAME)
        task = _TASKS.get(app)
        if task is None:
            task = app.task(
                name=TASK_NAME,
                shared=False,
                acks_late=False,  # at-most-once: a run is never re-executed
                reject_on_worker_lost=False,
                ignore_result=True,
                max_retries=0,
            )(execute_task)
            _TASKS[app] = task
        return task
