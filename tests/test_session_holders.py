"""Lease tokens that name their holder process, judged against real processes.

A token is stale only when it names a process of this host's pid space that
is gone: exited and reaped, a zombie, or a pid now used by a process that
started at another time. A live process, another host, or a token in
another form (a durable run's id) is never stale.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from loopctl.sessions.holders import holder_is_gone, host_id, new_token, process_start

needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="process start times come from /proc")


def token_of(pid: int, start: str, host: str = "") -> str:
    return "|".join([uuid.uuid4().hex, str(pid), start, host or host_id()])


@pytest.fixture
def child() -> Iterator[subprocess.Popen[str]]:
    """A live process that waits for a line on stdin."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.readline()"], stdin=subprocess.PIPE, text=True
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        assert proc.stdin is not None
        proc.stdin.close()


def started(pid: int) -> str:
    got = process_start(pid)
    return got[1] if got is not None else ""


def test_a_token_of_this_live_process_is_not_stale() -> None:
    assert not holder_is_gone(new_token())
    assert new_token() != new_token()


def test_a_token_of_a_live_child_is_not_stale_and_of_the_reaped_child_is(child: subprocess.Popen[str]) -> None:
    token = token_of(child.pid, started(child.pid))
    assert not holder_is_gone(token)
    child.kill()
    child.wait(30)
    assert holder_is_gone(token)


@needs_proc
def test_a_killed_child_not_yet_reaped_is_stale(child: subprocess.Popen[str]) -> None:
    token = token_of(child.pid, started(child.pid))
    child.kill()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, left a zombie: not reaped
    assert process_start(child.pid) is not None and process_start(child.pid)[0] == "Z"  # type: ignore[index]
    assert holder_is_gone(token)


@needs_proc
def test_a_pid_now_used_by_a_process_that_started_at_another_time_is_stale() -> None:
    mine = started(os.getpid())
    assert mine
    assert not holder_is_gone(token_of(os.getpid(), mine))
    assert holder_is_gone(token_of(os.getpid(), str(int(mine) + 1)))  # the pid was the holder's, once


def test_tokens_of_another_host_or_in_another_form_are_never_stale(child: subprocess.Popen[str]) -> None:
    child.kill()
    child.wait(30)
    assert not holder_is_gone(token_of(child.pid, "1", host="another-host/boot/pid:[1]"))
    assert not holder_is_gone("run-7f3a")  # a durable run's id: it lapses with its expiry
    assert not holder_is_gone(uuid.uuid4().hex)  # a token made before holders were named
    assert not holder_is_gone(token_of(0, ""))
    assert not holder_is_gone(f"{uuid.uuid4().hex}|x|1|{host_id()}")


def test_without_a_boot_id_no_lease_is_ever_stale(child: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A host name alone does not tell machines apart (macOS, BSD, Windows: no /proc): leases lapse instead."""
    import loopctl.sessions.holders as holders

    child.kill()
    child.wait(30)
    dead = token_of(child.pid, started(child.pid) or "1")
    monkeypatch.setattr(holders, "_read", lambda path: "")  # what a system without /proc reads
    monkeypatch.setattr(holders, "_host", None)
    assert not holder_is_gone(dead.rsplit("|", 1)[0] + "|" + host_id())
