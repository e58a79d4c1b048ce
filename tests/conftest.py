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
#: 0 turns the watchdog off.
HUNG_TEST_S = float(os.environ.get("LOOPCTL_TEST_HANG_S", "300"))
_watchdog_fd: list[int] = []


def _watchdog_wanted(config: pytest.Config) -> bool:
    # Not while a person debugs (--pdb, --trace), nor when pytest's own
    # faulthandler_timeout is set (its per-test timer would replace this one).
    try:
        own_timeout = float(config.getini("faulthandler_timeout") or 0)
    except ValueError:  # -p no:faulthandler: the option does not exist
        own_timeout = 0.0
    return (
        HUNG_TEST_S > 0
        and not own_timeout
        and not config.getoption("usepdb", False)
        and not config.getoption("trace", False)
    )


def _run_as_a_command() -> bool:
    """True under ``pytest`` or ``python -m pytest``, not ``pytest.main()`` inside a longer process."""
    return "pytest" in Path(sys.argv[0]).parts[-2:]


def pytest_configure(config: pytest.Config) -> None:
    if _watchdog_wanted(config):
        # A copy of the real stderr, taken while output capture is off: during
        # a test, fd 2 goes to the capture file, which an exiting process never shows.
        _watchdog_fd.append(os.dup(2))
        _arm_watchdog()


def pytest_unconfigure(config: pytest.Config) -> None:
    if not _watchdog_fd:
        return
    if _run_as_a_command():
        _arm_watchdog()  # the exit comes next: a hang there (joining a stuck thread) is caught too
        return
    faulthandler.cancel_dump_traceback_later()
    os.close(_watchdog_fd.pop())


def _arm_watchdog() -> None:
    # Each call restarts the one timer.
    if _watchdog_fd:
        faulthandler.dump_traceback_later(HUNG_TEST_S, exit=True, file=_watchdog_fd[0])


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
