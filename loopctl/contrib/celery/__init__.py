"""Runs on Celery workers, their state in Redis (extra ``[celery]``).

``CeleryRunRegistry`` is the ``RunRegistry`` API for runs that execute on
Celery workers; cancel, steering, approvals, events and history travel
through Redis. The modules are named by their job: ``registry`` (the web
side), ``task`` and ``worker`` (the worker side), ``redis`` and ``scripts``
(every state change as one Lua script), ``durable`` (heartbeats and
resumes), ``approvals``, ``events``, ``reads``, ``bridge``, ``options``,
``fields``, ``signals`` and ``sweeper``.

A web process calls ``start(conversation, input)``; the run is queued as a
Celery task and executed by whichever worker picks it up; any process
(another web worker, another machine) can then ``steer``, ``cancel``,
follow ``events``, read ``status``/``result`` and ``leftovers`` by run id.
The guarantees are the in-process registry's:

- One run per conversation across all processes: ``start`` takes the
  conversation's Redis lock (the run id, with an expiry) in the same atomic
  step that records the run; a second ``start`` raises ``LoopBusy``. The
  worker loads the conversation's history from Redis, builds the loop with
  the factory (``BareLoop.from_history(client, tools, config, history)``)
  and commits the history back only if the run succeeds.
- One cancel = one cancelled run. A cancel before a worker picked the run
  up is stored and applied at start (the run ends ``Cancelled`` without a
  model call); later ones reach the worker's bridge thread.
- Every accepted steer is delivered once or returned once by
  ``leftovers(run_id)``: accepted before pickup -> delivered at the first
  boundary; refused by the ending run, sealed undelivered, or never read by
  the worker -> a leftover, in push order. A steer for a sub-agent
  (``to=``) goes to that sub-agent's run in flight on the worker; with none
  in flight when the worker reads it, it is a leftover, never the parent's.
- Events: a per-run Redis stream bounded by ``event_buffer`` with the same
  ``(seq, dict)`` contract, ``after=`` resume and ``gap`` events.
- At-most-once: the worker claims a queued run atomically, so a redelivered
  task message is skipped. Runs have tools with side effects: a run whose
  worker dies (``kill -9``, a lost machine) is NOT re-executed; its
  heartbeat lapses, and within ``heartbeat_ttl`` (plus one read slice) any
  registry call on it shows ``failed`` with "worker lost", the
  conversation's history unchanged, its lock released and every steer it
  accepted returned as a leftover. Keep Celery's defaults
  ``task_acks_late=False`` (the task option is forced here) and use
  ``worker_prefetch_multiplier=1`` so a dying worker holds no extra tasks.
- Approvals: ``pending_approvals``, ``approve`` and ``deny`` by run id from
  any process; the answer travels to the run's worker, whose slot decides
  (see ``approvals``).
- Durable runs (``resume="on_worker_loss"``, per registry or per run):
  checkpointed at each turn boundary with their events; a lost worker's run
  goes back on the queue and another worker continues it from the last
  checkpoint (``run_resumed`` event, ``RunStatus.resumes``), up to
  ``max_resumes`` losses; a warm shutdown hands runs back at a boundary.
  Tool calls in flight at a crash run again only for ``idempotent`` tools
  (see ``durable``). Every worker process
  runs a sweeper (``sweeper``) that reaps lapsed runs and sends again
  task messages a dead worker held.
- Redis unreachable: every call raises ``RegistryUnavailable`` (a
  ``LoopError``) within ``socket_timeout``, never hangs.
- Owners: a run started with ``owner=`` (a str, stored with the run in the
  step that records it) is found by every by-id method only when given the
  same owner; to anyone else it is an unknown id. ``list`` shows only the
  given owner's runs (``owner=None``: only runs started without one), every
  owner's only with ``all_owners=True``.

Workers must import a module that constructs the registry (same ``prefix``
and Redis) so the task finds it; run them with ``--pool threads`` (or
prefork; every run uses a few threads of its own). The factory path travels
with each run and is imported by the worker. Redis Cluster is not supported
(the Lua steps touch keys of one run and its conversation). Conversation
histories never expire; runs expire ``keep_finished_s`` after they end.

Example (``agents.py``, imported by the web processes and by
``celery -A agents worker --pool threads``)::

    app = Celery("agents", broker=REDIS_URL)
    app.conf.worker_prefetch_multiplier = 1
    registry = CeleryRunRegistry(app, REDIS_URL, loop_factory="agents:make_loop")

    def make_loop(conversation, history):
        client = OpenAIClient("gpt-4o-mini")
        return BareLoop.from_history(client, [search], SessionConfig(), history)

    # in a view: run_id = registry.start(user_conversation_key, text)
    # elsewhere: registry.steer(run_id, "shorter"), registry.cancel(run_id),
    #            for seq, event in registry.events(run_id, after=last_seen): ...
"""

from __future__ import annotations

from .registry import TASK_NAME, CeleryRunRegistry, RegistryUnavailable, WorkerLost

__all__ = [
    "TASK_NAME",
    "CeleryRunRegistry",
    "RegistryUnavailable",
    "WorkerLost",
]
