"""The Celery signals a worker process's registries listen to.

Connected once per process (``connect_signals``), strongly (Celery holds
weak references by default), and each handler only looks registries up by
prefix or app, so a process without a registry ignores them:

- ``task_received`` (a task message reached this process, before any pool
  thread runs it): note the reservation, so the sweepers send the run again
  at once if this process dies before claiming it;
- ``worker_ready``: start the sweepers of this app's registries;
- ``worker_shutting_down`` (inside a signal handler: it only sets flags):
  on a warm shutdown, drain (durable runs are handed back at a boundary);
- ``worker_shutdown``: stop the sweepers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import MutableMapping
from typing import Any, List

from loopctl.errors import LoopError

log = logging.getLogger("loopctl")

_CONNECTED: List[bool] = []
_LOCK = threading.Lock()


def connect_signals(registries: MutableMapping[str, Any], task_name: str) -> None:
    """Connect the handlers (idempotent); ``registries`` maps prefix -> registry."""
    with _LOCK:
        if _CONNECTED:
            return
        from celery import signals

        def on_task_received(sender: object = None, request: object = None, **_: object) -> None:
            if request is None or getattr(request, "name", None) != task_name:
                return
            kwargs = getattr(request, "kwargs", None) or {}
            reg = registries.get(str(kwargs.get("prefix", "")))
            if reg is not None and kwargs.get("run_id"):
                try:
                    reg.reserved(str(kwargs["run_id"]))
                except LoopError as exc:  # the lease resends it if this worker dies
                    log.warning("could not note the reservation of run %s: %s", kwargs["run_id"], exc)

        def on_worker_ready(sender: object = None, **_: object) -> None:
            app = getattr(sender, "app", None)
            for reg in list(registries.values()):
                if reg.app is app:
                    reg.start_sweeper()

        def on_worker_shutting_down(how: object = None, **_: object) -> None:
            if how == "Warm":
                for reg in list(registries.values()):
                    reg.drain()

        def on_worker_shutdown(**_: object) -> None:
            for reg in list(registries.values()):
                reg.stop_sweeper()

        signals.task_received.connect(on_task_received, weak=False)
        signals.worker_ready.connect(on_worker_ready, weak=False)
        signals.worker_shutting_down.connect(on_worker_shutting_down, weak=False)
        signals.worker_shutdown.connect(on_worker_shutdown, weak=False)
        _CONNECTED.append(True)


__all__ = ["connect_signals"]
