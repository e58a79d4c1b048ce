"""Who holds a lease: tokens that name their process, and this process's leases at exit.

A lease token made here reads ``uuid|pid|start|host``: ``pid`` and
``start`` (the process's start time from ``/proc``, empty where there is no
``/proc``) name the holder process, and ``host`` names the pid space it
lives in (host name, boot id and pid namespace), so a pid is only ever
compared with pids of the same space. The rules:

- A lease is *stale* when its token names a process of this host's pid
  space that no longer exists: no such pid, a zombie, or a pid reused by a
  process that started at another time. An acquire may take a stale lease
  over at once (by compare-and-set on its token) instead of waiting for it
  to lapse, and a delete does not count it as a run holding the session.
- A token of another host, of a live process, or in any other form (a
  durable run's id) is never stale: such a lease lapses with its expiry.
- The leases this process holds are released when the interpreter exits:
  the run threads are daemon threads, and once the interpreter is gone no
  write of theirs can land anyway. A forked child never releases its
  parent's leases.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
import uuid
from typing import Callable, Dict, Optional, Tuple

log = logging.getLogger("loopctl")

_SEPARATOR = "|"
_lock = threading.Lock()
_host: Optional[str] = None
_held: Dict[int, Tuple[int, Callable[[], None]]] = {}  # id -> (pid that took it, release)
_exit_hook = False


def host_id() -> str:
    """This process's pid space: host name, boot id and pid namespace (what is readable)."""
    global _host
    if _host is None:
        parts = [socket.gethostname()]
        parts.append(_read("/proc/sys/kernel/random/boot_id").strip())
        try:
            parts.append(os.readlink("/proc/self/ns/pid"))
        except OSError:
            parts.append("")
        _host = "/".join(parts).replace(_SEPARATOR, "_")
    return _host


def _knows_its_host() -> bool:
    """True where the host id tells machines apart (a boot id: Linux's /proc).

    A host name alone does not (two machines may share one, over one Redis),
    so without a boot id no lease is ever judged stale: it lapses instead.
    """
    return os.name != "nt" and bool(_read("/proc/sys/kernel/random/boot_id").strip())


def process_start(pid: int) -> Optional[Tuple[str, str]]:
    """(state, start time in clock ticks since boot) of ``pid`` from ``/proc``; None when unreadable."""
    data = _read(f"/proc/{pid}/stat")
    # The command name (field 2) may hold spaces and parentheses: count from its end.
    fields = data.rpartition(")")[2].split()
    if len(fields) < 20:
        return None
    return fields[0], fields[19]


def new_token() -> str:
    """A fresh lease token naming this process."""
    pid = os.getpid()
    got = process_start(pid)
    start = got[1] if got is not None else ""
    return _SEPARATOR.join((uuid.uuid4().hex, str(pid), start, host_id()))


def holder_is_gone(token: str) -> bool:
    """Whether ``token`` names a process of this host's pid space that no longer exists."""
    parts = token.split(_SEPARATOR, 3)
    if not _knows_its_host() or len(parts) != 4 or parts[3] != host_id():
        return False
    if not (parts[1].isascii() and parts[1].isdigit()):
        return False
    pid, start = int(parts[1]), parts[2]
    if pid <= 0:
        return False
    got = process_start(pid)
    if got is None:
        # No /proc entry (no /proc here, or one that hides other users' processes): ask the kernel.
        return not _pid_exists(pid)
    state, started = got
    if state in ("Z", "X"):
        return True  # dead, waiting to be reaped: it will never renew or write again
    return bool(start) and started != start  # another process now has the pid


def describe(token: str) -> str:
    """The holder a token names, for a log line (``process 1234``)."""
    parts = token.split(_SEPARATOR, 3)
    return f"process {parts[1]}" if len(parts) == 4 else "a named holder"


def track(lease: object, release: Callable[[], None]) -> None:
    """Release ``lease`` (with ``release``) when the interpreter exits, unless ``untrack`` came first."""
    global _exit_hook
    with _lock:
        _held[id(lease)] = (os.getpid(), release)
        if not _exit_hook:
            # Registered at the first lease, after the store's own exit hooks: it runs before them
            # (last registered, first run), while the store's connection is still open.
            atexit.register(_release_all)
            _exit_hook = True


def untrack(lease: object) -> None:
    """Forget ``lease`` (it was released)."""
    with _lock:
        _held.pop(id(lease), None)


def _release_all() -> None:
    with _lock:
        mine = [release for pid, release in _held.values() if pid == os.getpid()]
        _held.clear()
    for release in mine:
        try:
            release()
        except Exception:  # the lease then lapses (or is taken over) on its own
            log.warning("releasing a session lease at exit failed", exc_info=True)


def _reset_after_fork() -> None:
    """A forked child starts with a fresh lock (the parent's may be held by a thread the child lacks)."""
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists, under another user
    return True


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


__all__ = ["describe", "holder_is_gone", "host_id", "new_token", "process_start", "track", "untrack"]
