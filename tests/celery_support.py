"""Real Redis and real Celery workers for the distributed tests and benchmark.

``RedisServer`` starts ``redis-server`` on a free 127.0.0.1 port with
persistence off (no RDB, no AOF, its own temp dir) and waits for its
"Ready to accept connections" line; ``CeleryWorker`` starts
``celery -A tests.celery_app worker --pool threads`` pointing at it and
waits for its "ready." line. Both are stopped (and, when needed, killed) by
``stop()``. Their output is drained by a reader thread so they never block
on a full pipe; the last lines are kept for failure messages.
"""

from __future__ import annotations

import collections
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Deque, Dict, Iterator, List, Optional, Sequence

REPO = Path(__file__).resolve().parent.parent
ENV_URL = "LOOPCTL_TEST_REDIS_URL"
START_TIMEOUT = 30.0


def missing_requirements() -> Optional[str]:
    """Why the distributed tests cannot run here, or None when they can."""
    if shutil.which("redis-server") is None:
        return "redis-server is not installed (apt-get install redis-server)"
    for module in ("celery", "redis"):
        try:
            __import__(module)
        except ImportError:
            return f"python package {module!r} is not installed (pip install 'loopctl[celery]')"
    return None


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Process:
    """A child process whose output is drained and scanned for a ready line."""

    def __init__(self, argv: Sequence[str], ready_text: str, env: Optional[Dict[str, str]] = None,
                 cwd: Optional[Path] = None, label: str = "process") -> None:
        self._ready_text = ready_text
        self._ready = threading.Event()
        self.lines: Deque[str] = collections.deque(maxlen=200)
        self._line = threading.Condition()
        self.label = label
        self.proc = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=str(cwd) if cwd else None,
        )
        self._reader = threading.Thread(target=self._drain, name=f"test-drain-{label}", daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        out = self.proc.stdout
        assert out is not None
        for line in out:
            with self._line:
                self.lines.append(line.rstrip("\n"))
                self._line.notify_all()
            if self._ready_text in line:
                self._ready.set()
        self._ready.set()  # EOF: the process is gone; wait_ready reports it

    def wait_line(self, text: str, timeout: float) -> str:
        """The first kept output line containing ``text``, waiting up to ``timeout`` for it."""
        with self._line:
            found = self._line.wait_for(lambda: next((ln for ln in self.lines if text in ln), None), timeout)
        if found is None:
            raise AssertionError(f"{self.label} never printed {text!r}:\n{self.tail()}")
        return found

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        if not self._ready.wait(timeout) or self.proc.poll() is not None:
            self.stop()
            tail = "\n".join(list(self.lines)[-30:])
            raise RuntimeError(f"{self.label} did not become ready:\n{tail}")

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill9(self) -> None:
        """SIGKILL, and reap it."""
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._reader.join(5)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; reap and join the reader."""
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._reader.join(5)

    def tail(self, n: int = 40) -> str:
        return "\n".join(list(self.lines)[-n:])


class RedisServer:
    """A private redis-server on a free loopback port, persistence off."""

    def __init__(self) -> None:
        self.port = free_port()
        self._dir = tempfile.mkdtemp(prefix="loopctl-test-redis-")
        self._p = _Process(
            [
                "redis-server",
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", self._dir,
                "--databases", "4",
                "--loglevel", "notice",
            ],
            "Ready to accept connections",
            label=f"redis-{self.port}",
        )
        self._p.wait_ready()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def stop(self) -> None:
        self._p.stop(grace=5)
        shutil.rmtree(self._dir, ignore_errors=True)


class CeleryWorker:
    """``celery -A tests.celery_app worker --pool threads`` on the given queues."""

    def __init__(self, redis_url: str, name: str, queues: str = "celery", concurrency: int = 4,
                 app: str = "tests.celery_app", extra_env: Optional[Dict[str, str]] = None) -> None:
        env = dict(os.environ)
        env.update(extra_env or {})
        env[ENV_URL] = redis_url
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env["PYTHONUNBUFFERED"] = "1"
        self.name = name
        self._p = _Process(
            [
                sys.executable, "-m", "celery", "-A", app, "worker",
                "--pool", "threads", "-c", str(concurrency),
                "-Q", queues, "-n", f"{name}@%h",
                "--without-heartbeat", "--without-gossip", "--without-mingle",
                "--loglevel", "INFO",
            ],
            " ready.",
            env=env,
            cwd=REPO,
            label=f"worker-{name}",
        )
        self._p.wait_ready()

    @property
    def pid(self) -> int:
        return self._p.pid

    def alive(self) -> bool:
        return self._p.alive()

    def kill9(self) -> None:
        self._p.kill9()

    def stop(self) -> None:
        self._p.stop(grace=15)

    def tail(self, n: int = 40) -> str:
        return self._p.tail(n)


def release_held(client: Any, held: str, target: str = "celery") -> int:
    """Move every task message from queue ``held`` (no consumer) to ``target``, in order."""
    moved = 0
    while client.lmove(held, target, "RIGHT", "LEFT") is not None:
        moved += 1
    return moved


def wait_signal(client: Any, key: str, timeout: float = 20.0) -> str:
    """Pop one item pushed on ``key`` by a worker (bounded; fails loudly)."""
    got = client.blpop([key], timeout=timeout)
    if got is None:
        raise AssertionError(f"no signal on {key!r} within {timeout}s")
    return str(got[1])


def stop_all(items: List[Any]) -> None:
    """Stop workers and servers, ignoring the ones already gone."""
    for item in reversed(items):
        try:
            item.stop()
        except Exception:  # a teardown must stop the rest
            pass


def monotonic_deadline(seconds: float) -> float:
    return time.monotonic() + seconds


__all__ = [
    "CeleryWorker",
    "RedisServer",
    "free_port",
    "missing_requirements",
    "release_held",
    "stop_all",
    "wait_signal",
]


def redis_for_module(db: int) -> Iterator[str]:
    """A module fixture's body: a private redis-server's URL for database ``db``, stopped after (skips without one)."""
    import pytest

    why = missing_requirements()
    if why is not None:
        pytest.skip(why)
    server = RedisServer()
    try:
        yield server.url(db)
    finally:
        server.stop()

