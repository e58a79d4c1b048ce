"""The two records of a run that cross Redis: the run as queued, and the run as claimed.

``QueuedRun`` is what the registry writes when it queues a run (under the
conversation's lock); ``Claim`` is what a worker reads back when it takes
the run, with what a resumed run continues from (its checkpoint, the
events and steering so far). Both are plain values: the Lua scripts in
``scripts`` define the layout, ``redis.RedisBackend`` moves them.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import attrs


@attrs.frozen
class QueuedRun:
    """A run as the registry records it before it is sent: who asked, for what, on what terms.

    ``config`` is the run's ``RunConfig`` as JSON ("" for none), ``factory``
    the loop factory's import path, ``queue_ms`` how long it may wait for a
    worker, ``resume``/``max_resumes`` its recovery terms, ``owner`` who
    may address it ("" for nobody in particular).
    """

    run_id: str
    conversation: str
    input: str
    config: str
    factory: str
    queue_ms: int
    resume: str = ""
    max_resumes: int = 0
    queue: str = ""
    owner: str = ""


class Claim:
    """What a worker gets when it claims a queued run."""

    __slots__ = (
        "conversation",
        "input",
        "config",
        "factory",
        "cancel",
        "reason",
        "history",
        "event_buffer",
        "checkpoint",
        "resumes",
        "cause",
        "seq",
        "resume",
        "started_at",
        "steers",
    )

    def __init__(self, raw: Sequence[str]) -> None:
        self.conversation = raw[1]
        self.input = raw[2]
        self.config = raw[3]
        self.factory = raw[4]
        self.cancel = raw[5] == "1"
        self.reason: Optional[str] = raw[6] if self.cancel and raw[6] else None
        self.history = raw[7]
        self.event_buffer = int(raw[8])
        self.checkpoint = raw[9]  # JSON of the last committed checkpoint, or ''
        self.resumes = int(raw[10] or 0)  # > 0: this claim continues the run
        self.cause = raw[11]
        self.seq = int(raw[12] or 0)  # the last event seq in the stream
        self.resume = raw[13]  # '' or 'on_worker_loss'
        self.started_at = float(raw[14])
        self.steers: List[str] = list(raw[15:])


__all__ = ["Claim", "QueuedRun"]
