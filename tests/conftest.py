"""Shared fixtures: every test checks that no loopctl thread outlives it; ``server``.

This folder is put on ``sys.path`` (whatever pytest's import mode) so test
modules import their shared helpers as ``from support import ...`` and the
fake server as ``from fakeserver import ...``.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from fakeserver import FakeServer

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)


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
