"""Shared fixtures: every test checks that no loopctl thread outlives it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest


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
