"""Runs on Celery workers, their state in Redis (extra ``[celery]``).

``CeleryRunRegistry`` is the ``RunRegistry`` API for runs that execute on
Celery workers; cancel, steering, approvals, events and history travel
through Redis. The modules are named by their job: ``registry`` (the web
side), ``task`` and ``worker`` (the worker side), ``redis`` and ``scripts``
(every state change as one Lua script), ``durable`` (heartbeats and
resumes), ``approvals``, ``events``, ``reads``, ``bridge``, ``options``,
``fields``, ``signals`` and ``sweeper``.
"""

from __future__ import annotations

from .registry import TASK_NAME, CeleryRunRegistry, RegistryUnavailable, WorkerLost

__all__ = [
    "TASK_NAME",
    "CeleryRunRegistry",
    "RegistryUnavailable",
    "WorkerLost",
]
