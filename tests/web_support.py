"""A registry for the web examples' tests: conversations in a SQLite store in a folder of its own.

``StoredRegistry()`` is a ``RunRegistry(session_store=SQLiteSessionStore(...))``
on a fresh temporary file (or the ``path`` given, to play a restarted
server on the same file); ``close()`` also closes the store and removes a
folder it made.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional, Union

from loopctl.hosting.registry import RunRegistry
from loopctl.sessions import SQLiteSessionStore


class StoredRegistry(RunRegistry):
    """A registry whose conversations live in a SQLite file (temporary unless ``path`` is given)."""

    def __init__(self, path: Optional[Union[str, Path]] = None, **kw: Any) -> None:
        self.folder: Optional[Path] = None
        if path is None:
            self.folder = Path(tempfile.mkdtemp(prefix="loopctl-web-"))
            path = self.folder / "web.db"
        self.path = Path(path)
        super().__init__(session_store=SQLiteSessionStore(self.path), **kw)

    def close(self, timeout: Optional[float] = 10.0) -> None:
        super().close(timeout)
        self.session_store.close()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
