"""``CeleryRunRegistry(session_store=RedisSessionStore(url))`` with real redis and workers (point 5).

The conversation is a session of the Redis store: a worker loads it and its
loop writes each completed run to it, so any worker continues any
conversation, a local ``BareLoop`` on the same store continues it too, and
a run on a session held elsewhere fails ``SessionBusy``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any, List

import pytest
from celery_support import CeleryWorker, RedisServer, missing_requirements, stop_all

REASON = missing_requirements()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

if REASON is None:
    from loopctl import BareLoop, LoopError, Message, SessionBusy
    from loopctl.sessions import RedisSessionStore
    from loopctl.testing import ScriptedClient, reply
    from tests import celery_app
    from tests.celery_app import plan_text

WAIT = 30.0


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    s = RedisServer()
    try:
        yield s
    finally:
        s.stop()


def texts(messages: List[Message]) -> List[str]:
    return [f"{m.role.value}:{m.text}" for m in messages]


def test_5_any_worker_continues_a_stored_conversation_and_so_does_a_local_loop(server: Any) -> None:
    url = server.url()
    app = celery_app.make_app(url)
    reg = celery_app.make_session_registry(app, url)
    store = RedisSessionStore(url)
    conv = f"chat/{uuid.uuid4().hex[:8]} ✓"
    started: List[Any] = []
    try:
        w1 = CeleryWorker(url, "s1", concurrency=2)
        started.append(w1)
        rid = reg.start(conv, plan_text("a", turns=2))
        first = reg.result(rid, WAIT)
        assert first.output.startswith("done a")
        stored = store.session(conv).messages()
        assert len(stored) == 4 and stored[0].text.startswith("PLAN ")  # input, call, result, answer
        pid1 = stored[2].tool_results[0].output
        w1.stop()  # the first worker goes away; another continues the conversation
        started.remove(w1)
        w2 = CeleryWorker(url, "s2", concurrency=2)
        started.append(w2)
        rid = reg.start(conv, plan_text("b", turns=2))
        assert reg.result(rid, WAIT).output.startswith("done b")
        stored = store.session(conv).messages()
        assert len(stored) == 8 and stored[:4] == reg.history(conv)[:4]
        assert stored[6].tool_results[0].output != pid1  # ran on the other worker
        # A local loop on the same store continues it, and the next worker run sees that.
        local = BareLoop(ScriptedClient([reply("local answer")])).with_session(store.session(conv))
        local.run("from a local loop")
        rid = reg.start(conv, plan_text("c", turns=1))
        assert reg.result(rid, WAIT).output.startswith("done c")
        assert texts(reg.history(conv))[8:] == [
            "user:from a local loop", "assistant:local answer", f"user:{plan_text('c', turns=1)}",
            texts(reg.history(conv))[-1],
        ]
        assert conv in [i.id for i in store.list()]

        # A session held elsewhere: the worker's run fails SessionBusy and writes nothing.
        lease = store.session(conv).acquire()
        before = store.session(conv).load()
        rid = reg.start(conv, plan_text("d", turns=1))
        with pytest.raises(LoopError) as info:
            reg.result(rid, WAIT)
        assert isinstance(info.value, SessionBusy) or "is busy" in str(info.value)
        assert reg.status(rid).state == "failed"
        lease.release()
        assert store.session(conv).load() == before
    finally:
        stop_all(started)
        reg.close()
        store.close()


def test_5_a_durable_run_resumed_after_a_kill9_takes_its_session_lease_back(server: Any) -> None:
    import json
    import threading
    import time

    import redis

    url = server.url(1)
    app = celery_app.make_app(url)
    reg = celery_app.make_session_registry(app, url)
    store = RedisSessionStore(url)
    sig = redis.Redis.from_url(url, decode_responses=True, socket_timeout=30)
    workers = [CeleryWorker(url, f"d{i}", concurrency=2) for i in range(2)]
    started: List[Any] = list(workers)
    conv, tag = f"durable {uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:8]
    try:
        rid = reg.start(conv, plan_text(tag, turns=3, gate=[1]), resume="on_worker_loss")
        got = sig.blpop([f"t:{tag}:entered"], timeout=WAIT)
        assert got is not None and got[1] == "1"
        deadline, pause = time.monotonic() + WAIT, threading.Event()
        while json.loads(sig.hget(f"{celery_app.SESSION_PREFIX}:run:{rid}", "ckpt") or "{}").get("after") != "tools":
            assert time.monotonic() < deadline, "no checkpoint after the first tool phase"
            pause.wait(0.01)
        victim = next(w for w in workers if w.pid == int(sig.get(f"t:{tag}:pid") or 0))
        victim.kill9()  # its session lease (60 s) is still live in Redis
        sig.rpush(f"t:{tag}:release:1", "go")
        run = reg.result(rid, WAIT)  # resumed on the other worker, well within the 60 s
        assert run.output == f"done {tag} turn=2 steers=0"
        assert reg.status(rid).resumes == 1
        stored = store.session(conv).messages()
        assert [m.role.value for m in stored] == ["user", "assistant", "user", "assistant", "user", "assistant"]
        assert not any(p.is_error for m in stored for p in m.tool_results)
        store.session(conv).acquire().release()  # the resumed run gave the lease back
    finally:
        stop_all(started)
        sig.close()
        reg.close()
        store.close()


def test_5_an_owned_conversation_is_continued_only_by_its_owner(server: Any) -> None:
    url = server.url()
    app = celery_app.make_app(url)
    reg = celery_app.make_session_registry(app, url)
    store = RedisSessionStore(url)
    conv = f"chat/{uuid.uuid4().hex[:8]}"
    started: List[Any] = []
    try:
        w = CeleryWorker(url, "o1", concurrency=2)
        started.append(w)
        rid = reg.start(conv, plan_text("a", turns=1), owner="alice")
        assert reg.result(rid, WAIT, owner="alice").output.startswith("done a")
        assert len(store.session(conv, owner="alice").messages()) == 2  # the input and the answer
        assert len(reg.history(conv, owner="alice")) == 2
        with pytest.raises(KeyError):
            reg.history(conv, owner="bob")
        with pytest.raises(KeyError):
            reg.history(conv)
        # Bob naming Alice's conversation never sees or extends it.
        rid = reg.start(conv, plan_text("b", turns=1), owner="bob")
        with pytest.raises((KeyError, LoopError)):
            reg.result(rid, WAIT, owner="bob")
        assert reg.status(rid, owner="bob").state == "failed"
        assert len(store.session(conv, owner="alice").messages()) == 2
    finally:
        stop_all(started)
        reg.close()
        store.close()
