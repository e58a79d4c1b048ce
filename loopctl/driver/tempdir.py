"""The managed temp dir: made when a tool first asks, gone with its loop or process.

Layout: ``{base}/loopctl-p{pid}-{token}/loopctl-{session_id}/``. The parent is this
process's own (``token`` is random per process, so a reused pid never names
it); it holds an ``owner.lock`` file that the process keeps ``flock``-ed
while the parent exists. The kernel drops that lock when the process dies
by any means (``os._exit``, ``kill -9``), so a parent whose lock can be
taken belongs to no live process: the first time a process makes its
parent under a base, it sweeps such dead parents of others there. A parent
without a lock file is swept only once it is older than
``UNLOCKED_GRACE_S`` (its maker may be between ``mkdir`` and locking).

A loop's directory is made on the first read of ``ToolContext.temp_dir``
(never by a tool that does not read it), removed by ``close()`` or garbage
collection of the loop; the parent is removed when the process's last loop
directory under that base is, and at interpreter exit. Nothing here runs
per run or per tool call unless a tool reads the path. Without ``fcntl``
(Windows) nothing is locked and nothing swept.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Dict, Optional

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("loopctl")

PREFIX = "loopctl-p"
LOCK_NAME = "owner.lock"
UNLOCKED_GRACE_S = 60.0

_TOKEN = os.urandom(4).hex()
_lock = threading.Lock()  # guards _parents and every parent's make/remove
#: Guards every loop's first ``ensure()`` (taken before ``_lock``). One for all
#: loops, not one each: a host holds thousands of idle loops, each object of
#: which the cyclic GC walks, and a first use is rare and short.
_ensure_lock = threading.Lock()
_temp_base: Optional[Path] = None


def _system_temp() -> Path:
    """The system temp dir as a ``Path``, one object shared while it stays the same."""
    global _temp_base
    text = tempfile.gettempdir()
    base = _temp_base
    if base is None or str(base) != text:
        base = _temp_base = Path(text)
    return base
_parents: Dict[Path, _ProcessDir] = {}
_swept: set[Path] = set()
# Bases whose loop was collected, not yet counted down. A collected loop's
# finalizer only appends here: the collector may run it inside any allocation,
# on a thread that already holds _lock (in acquire), where waiting would hang.
_collected: list[Path] = []


def process_dir_name() -> str:
    """This process's parent directory name (pid plus a per-process token)."""
    return f"{PREFIX}{os.getpid()}-{_TOKEN}"


class _ProcessDir:
    """This process's parent directory under one base, and who uses it."""

    __slots__ = ("path", "fd", "users", "pid")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: Optional[int] = None
        self.users = 0
        self.pid = os.getpid()

    def make(self) -> None:
        """Make the directory and take its lock (under ``_lock``)."""
        self.path.mkdir(parents=True, exist_ok=True)
        if fcntl is None:
            return
        # Lock a file under a private name, then rename it into place: a
        # sweeper never sees an unlocked ``owner.lock`` of a live process.
        staging = self.path / f".{LOCK_NAME}.{os.getpid()}"
        fd = os.open(staging, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # a filesystem without flock: a sweeper cannot lock it either
                log.debug("cannot lock %s; it will not be swept after a crash", staging)
            os.rename(staging, self.path / LOCK_NAME)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd

    def remove(self) -> None:
        """Remove the directory and drop the lock (under ``_lock``)."""
        shutil.rmtree(self.path, ignore_errors=True)
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _sweep(base: Path, own: Path) -> None:
    """Remove the parents under ``base`` of processes that no longer exist."""
    if fcntl is None:
        return
    try:
        entries = [e for e in os.scandir(base) if e.name.startswith(PREFIX) and e.path != str(own)]
    except OSError:
        return
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            _sweep_one(Path(entry.path))
        except OSError:
            continue  # someone else's, or gone meanwhile: never our problem


def _sweep_one(path: Path) -> None:
    lock_path = path / LOCK_NAME
    try:
        fd = os.open(lock_path, os.O_RDWR)
    except FileNotFoundError:
        # No lock yet: a maker between mkdir and rename, or one that died there.
        if time.time() - path.stat().st_mtime > UNLOCKED_GRACE_S:
            shutil.rmtree(path, ignore_errors=True)
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # its process is alive
        # Locked: the owner is gone. Make sure the file we locked is still the
        # one in place (the owner may have removed and remade its parent).
        if os.stat(lock_path).st_ino != os.fstat(fd).st_ino:
            return
        log.debug("removing the temp dirs of a dead process: %s", path)
        shutil.rmtree(path, ignore_errors=True)
    finally:
        os.close(fd)


def acquire(base: Path) -> Path:
    """This process's parent under ``base``, made (and the base swept) if needed.

    Raises:
        OSError: the parent cannot be made.
    """
    with _lock:
        key = base
        pd = _parents.get(key)
        if pd is None or pd.pid != os.getpid():  # a forked child makes its own
            pd = _parents[key] = _ProcessDir(base / process_dir_name())
        if pd.users == 0:
            pd.make()
            if key not in _swept:
                _swept.add(key)
                _sweep(base, pd.path)
        pd.users += 1
        _settle_collected_locked()
        return pd.path


def _count_down_locked(base: Path) -> None:
    pd = _parents.get(base)
    if pd is None or pd.pid != os.getpid() or pd.users == 0:
        return
    pd.users -= 1
    if pd.users == 0:
        pd.remove()


def _settle_collected_locked() -> None:
    # Last in every section under _lock: it also counts down what a
    # collection inside the section itself added (after a count up, so a
    # parent still in use is never removed and remade).
    while _collected:
        _count_down_locked(_collected.pop())


def release(base: Path, path: Optional[Path]) -> None:
    """Remove a loop's directory ``path`` (if any); the parent with the last one."""
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
    with _lock:
        _count_down_locked(base)
        _settle_collected_locked()


def _release_collected(base: Path, path: Path) -> None:
    """``release`` for a loop the collector freed: never waits for ``_lock``."""
    shutil.rmtree(path, ignore_errors=True)
    _collected.append(base)
    # Count down now unless the lock is held (maybe by this very thread, which
    # the collector interrupted); its holder, or the next section, counts it down.
    if _lock.acquire(blocking=False):
        try:
            _settle_collected_locked()
        finally:
            _lock.release()


@atexit.register
def _remove_all() -> None:
    with _lock:
        _collected.clear()
        for pd in _parents.values():
            if pd.pid == os.getpid() and pd.users:
                pd.users = 0
                pd.remove()


class ManagedTempDir:
    """One loop's temp dir: its base, its path, made once on first ``ensure()``.

    ``base`` None disables it (``ensure()`` gives None). If it cannot be
    made, tools get the system temp dir, which is never removed.
    """

    __slots__ = ("_finalizer", "_made", "_owner", "_path", "base", "name")

    def __init__(self, owner: Any, session_id: str) -> None:
        self.name = f"loopctl-{session_id}"
        self.base: Optional[Path] = _system_temp()
        self._owner = weakref.ref(owner)
        self._path: Optional[Path] = None
        self._made = False
        self._finalizer: Optional[weakref.finalize[..., None]] = None

    @property
    def path(self) -> Optional[Path]:
        """Where the dir is (or will be); None when disabled."""
        if self.base is None:
            return None
        if self._path is not None:
            return self._path
        return self.base / process_dir_name() / self.name

    def ensure(self) -> Optional[Path]:
        """Make the dir on first use (any thread); the system temp dir if that fails."""
        if self._made:
            return self._path
        with _ensure_lock:
            if self._made:
                return self._path
            base = self.base
            if base is None:
                return None
            try:
                parent = acquire(base)
            except OSError:
                self._fail(base / process_dir_name() / self.name)
                return self._path
            path = parent / self.name
            try:
                path.mkdir(exist_ok=True)
            except OSError:
                release(base, None)
                self._fail(path)
                return self._path
            self._path = path
            owner = self._owner()
            if owner is not None:
                self._finalizer = weakref.finalize(owner, _release_collected, base, path)
            else:  # pragma: no cover - a tool outliving its loop
                release(base, path)
            self._made = True
            return path

    def _fail(self, path: Path) -> None:
        log.warning("cannot create temp dir %s; tools get the system temp dir", path)
        self._path = Path(tempfile.gettempdir())
        self._made = True

    def close(self) -> None:
        """Remove the dir if this loop made it; idempotent."""
        # detach() hands the call over once: close() waits for the lock as an
        # ordinary caller, where the collector's path may not.
        made = self._finalizer.detach() if self._finalizer is not None else None
        if made is not None:
            _, _, (base, path), _ = made
            release(base, path)


__all__ = ["LOCK_NAME", "PREFIX", "ManagedTempDir", "acquire", "process_dir_name", "release"]
