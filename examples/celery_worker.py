"""A complete worker module for ``CeleryRunRegistry``: runs on Celery workers, any process steers.

The web processes and the workers both import this one module. It makes
the Celery app, the registry (at module level: a worker finds it by its
prefix in a per-process table) and the loop factory. The model is the
embedded offline demo model, so it runs without a key; put your own client
and tools in ``make_loop``. Needs ``pip install -e '.[celery]'`` and a Redis
server. From the repository root:

    redis-server &                                                   # or your Redis
    celery -A examples.celery_worker worker --pool threads -c 4 -Q agents
    python -m examples.celery_worker "What is (2 + 3) * 4?"          # another shell

The last command starts a run from this process (it could be any other),
steers it, follows its events as the worker streams them, and prints the
answer. ``LOOPCTL_REDIS_URL`` overrides the Redis URL. Each worker prints
one line per run it executes (id, outcome, duration).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from celery import Celery
from celery.signals import worker_init

from loopctl import BareLoop, Message, SessionConfig
from loopctl.contrib.celery import CeleryRunRegistry
from loopctl.demo.model import OfflineModel
from loopctl.demo.tools import demo_tools

REDIS_URL = os.environ.get("LOOPCTL_REDIS_URL", "redis://127.0.0.1:6379/0")
QUEUE = "agents"  # start workers with -Q agents

# One Redis is both the Celery broker and the registry's store.
app = Celery("agents", broker=REDIS_URL)
app.conf.update(
    worker_prefetch_multiplier=1,  # a dying worker holds no extra runs
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)

@worker_init.connect
def show_run_lines(**_: Any) -> None:
    """In the worker process only: print the registry's line per run (INFO on ``loopctl.celery``)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
    logger = logging.getLogger("loopctl.celery")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


# Module level, on purpose: constructing the registry connects nothing, and
# registers it in this process's table under its prefix ("loopctl"), which
# is where the worker's task looks it up. The table holds it weakly, so it
# must stay referenced here; a second registry with the same prefix in this
# process replaces this one for the worker.
registry = CeleryRunRegistry(
    app,
    REDIS_URL,
    loop_factory="examples.celery_worker:make_loop",
    queue=QUEUE,
    heartbeat_interval=1.0,
    heartbeat_ttl=5.0,  # a dead worker's run is "worker lost" within 5 s of its last beat
)


def make_loop(conversation: str, history: list[Message]) -> BareLoop:
    """The loop factory: called on a worker for every run of ``conversation``.

    It must start from the committed ``history`` (``BareLoop.from_history``),
    or the worker refuses the loop and the run fails.
    """
    return BareLoop.from_history(OfflineModel(), demo_tools(delay=0.2), SessionConfig(), history)


def main(argv: list[str]) -> int:
    """Start one run on a worker, steer it, print its events and its answer."""
    question = argv[0] if argv else "What is (2 + 3) * 4?"
    run_id = registry.start("example-conversation", question)
    print(f"run {run_id} queued on {QUEUE!r}")
    steered = False
    for _seq, event in registry.events(run_id, after=0, timeout=60):
        kind = event["type"]
        if kind == "tool_call_received":
            args = ", ".join(f"{k}={v!r}" for k, v in event["input"].items())
            print(f"  > {event['tool']}({args})")
            if not steered:  # any process could do this, by run id
                steered = registry.steer(run_id, "show each step")
        elif kind == "steering":
            print(f"  [guidance delivered: {event['messages'][0]['parts'][0]['text']}]")
        elif kind == "run_end":
            break
    run: Any = registry.result(run_id, timeout=60)
    print(run.output)
    registry.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
