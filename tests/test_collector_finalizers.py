"""Cleanup that the garbage collector runs never waits for a lock.

A client's registered secrets and a loop's temp dir are let go by
``weakref.finalize`` callbacks when their owner is collected. The collector
runs those callbacks inside whatever allocation triggered it, on whatever
thread made it; when that thread is itself inside the same lock's section
(registering another client's secrets, making another loop's dir), a
callback that waits for the lock hangs the thread for good. Python 3.9 did
so in CI: a test constructing a client hung in ``register_secrets``.

Each test churns owners that only the collector can free (each is in a
cycle) while stepping the collector's first threshold through small values,
so that its runs land at every point of the locked sections, not only
before them (a threshold of 1 collects each owner at the first allocation
after it dies, outside any lock). It churns on a thread of its own, so a hang
is seen as a thread still alive, not as a suite that never ends. Without the
fix both hang on every run, on 3.9 and on 3.13.
"""

from __future__ import annotations

import gc
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import pytest

from loopctl.driver import tempdir
from loopctl.text import redact, register_secrets

THRESHOLDS = range(2, 80)
PER_THRESHOLD = 6
ROUNDS = len(THRESHOLDS) * PER_THRESHOLD
HANG_S = 60.0  # far beyond the churn's ~1 s: only a hang gets near it


class Owner:
    """An object only the collector frees (it refers to itself)."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def eager_collector() -> Iterator[None]:
    old = gc.get_threshold()
    try:
        yield
    finally:
        gc.set_threshold(*old)


def thresholds() -> Iterator[int]:
    """The round numbers, with the collector's thresholds set for each."""
    i = 0
    for t in THRESHOLDS:
        gc.set_threshold(t, 1, 1)
        for _ in range(PER_THRESHOLD):
            yield i
            i += 1


def finishes(churn: Callable[[], None]) -> bool:
    """Run ``churn`` on a thread of its own; False when it is still running after HANG_S."""
    failure: list[BaseException] = []

    def body() -> None:
        try:
            churn()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failure.append(exc)

    t = threading.Thread(target=body, name="test-collector-churn", daemon=True)
    t.start()
    t.join(HANG_S)
    if failure:
        raise failure[0]
    return not t.is_alive()


def test_a_client_collected_while_another_registers_its_secrets_never_hangs(eager_collector: None) -> None:
    forms = [f"collected-owner-secret-{i:05d}" for i in range(ROUNDS)]
    masked_while_alive: list[bool] = []

    def churn() -> None:
        for i in thresholds():
            form = forms[i]
            owner = Owner()
            register_secrets(owner, [form])
            masked_while_alive.append(redact(f"a {form} b") == "a <redacted> b")
            del owner

    assert finishes(churn), "register_secrets hung on a finalizer waiting for the secrets lock"
    assert all(masked_while_alive)
    gc.collect()
    # Every owner is gone: its forms are forgotten, none lingers masked.
    still_masked = [f for f in forms if redact(f) != f]
    assert still_masked == []


def test_loops_collected_while_another_makes_and_removes_its_temp_dir_never_hang(
    eager_collector: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Loops under one base become garbage while, under a second base, a
    # loop's dir is made and removed each round: the first dir under a base
    # makes (and sweeps) the process's parent there, the last removes it,
    # both inside the temp dir lock, and both allocate plenty.
    dropped_base, busy_base = tmp_path / "dropped", tmp_path / "busy"
    dropped_base.mkdir()
    busy_base.mkdir()
    dropped: list[Path] = []

    def churn() -> None:
        for i in thresholds():
            monkeypatch.setattr(tempfile, "tempdir", str(dropped_base))
            owner = Owner()
            managed = tempdir.ManagedTempDir(owner, f"dropped-{i}")
            path = managed.ensure()
            assert path is not None
            dropped.append(path)
            del owner, managed
            monkeypatch.setattr(tempfile, "tempdir", str(busy_base))
            busy_owner = Owner()
            busy = tempdir.ManagedTempDir(busy_owner, f"busy-{i}")
            assert busy.ensure() is not None
            busy.close()

    assert finishes(churn), "a temp dir's lock was waited for by a collected loop's finalizer"
    gc.collect()
    assert [p for p in dropped if p.exists()] == []
    assert tempdir._collected == []  # noqa: SLF001 - nothing waits for a later section to count it down
    # The last loop under each base is gone: so is the process's parent dir there.
    assert list(dropped_base.iterdir()) == []
    assert list(busy_base.iterdir()) == []
