"""Shared fixtures: every test checks that no loopctl thread outlives it; ``server``.

A watchdog ends the suite when one test (or the exit after the last) runs
for ``HUNG_TEST_S``, printing every thread's stack first: a hang is then
reported in minutes, with where it hangs, instead of by CI's own clock with
nothing said.

This folder is put on ``sys.path`` (whatever pytest's import mode) so test
modules import their shared helpers as ``from support import ...`` and the
fake server as ``from fakeserver import ...``.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from fakeserver import FakeServer

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)


#: Far beyond the slowest test (a Celery kill -9 test, under a minute on 2 cores).
HUNG_TEST_S = float(os.environ.get("LOOPCTL_TEST_HANG_S", "300"))
_watchdog_fd: list[int] = []


def pytest_configure(config: pytest.Config) -> None:
    # A copy of the real stderr, taken while output capture is off: during a
    # test, fd 2 goes to the capture file, which a process that exits never shows.
    _watchdog_fd.append(os.dup(2))
    _arm_watchdog()


def _arm_watchdog() -> None:
    # Each call restarts the one timer. It stays armed between tests and after
    # the last one: a hang at exit (joining a thread stuck in a tool) is caught too.
    fd = _watchdog_fd[0] if _watchdog_fd else 2
    faulthandler.dump_traceback_later(HUNG_TEST_S, exit=True, file=fd)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    _arm_watchdog()
    try:
        yield
    finally:
        _arm_watchdog()


def _loopctl_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("loopctl-")}


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Fail a test that leaves a loopctl-* thread running after it ends.

    Threads get a short grace period to finish unwinding (a run thread that
    was abandoned on cancel exits once its released tool returns); joining
    is the synchronisation, not a sleep.
    """
    before = _loopctl_threads()
    yield
    deadline = time.monotonic() + 5.0
    leaked = _loopctl_threads() - before
    for t in leaked:
        t.join(max(0.0, deadline - time.monotonic()))
    still = [t.name for t in _loopctl_threads() - before if t.is_alive()]
    assert not still, f"loopctl threads leaked: {still}"


@pytest.fixture
def server() -> Iterator[FakeServer]:
    """A fake model server on 127.0.0.1 (``tests/fakeserver.py``), stopped after the test."""
    from fakeserver import FakeServer

    with FakeServer() as s:
        yield s
