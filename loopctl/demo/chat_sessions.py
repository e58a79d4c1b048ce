"""``loopctl chat --session NAME``: a named conversation kept across invocations.

Conversations live in a ``SQLiteSessionStore`` under the user's data
directory, ``sessions.db`` in:

- Linux and other Unixes: ``$XDG_DATA_HOME/loopctl``, else ``~/.local/share/loopctl``;
- macOS: ``~/Library/Application Support/loopctl``;
- Windows: ``%LOCALAPPDATA%\\loopctl`` (else ``%APPDATA%``, else the home folder).

``--session-db PATH`` chooses the file instead. The directory is created
(private to the user) when missing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Optional, Tuple

from loopctl.errors import ConfigError
from loopctl.sessions import SQLiteSessionStore
from loopctl.sessions.base import Session

DB_NAME = "sessions.db"


def data_dir(env: Mapping[str, str], platform: str = sys.platform) -> Path:
    """The user's loopctl data directory for ``platform`` (not created)."""
    home = Path(env.get("HOME") or env.get("USERPROFILE") or Path.home())
    if platform.startswith("win"):
        local = env.get("LOCALAPPDATA") or env.get("APPDATA")
        return (Path(local) if local else home / "AppData" / "Local") / "loopctl"
    if platform == "darwin":
        return home / "Library" / "Application Support" / "loopctl"
    xdg = env.get("XDG_DATA_HOME")
    # The XDG spec: a relative XDG_DATA_HOME is invalid and is ignored.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else home / ".local" / "share"
    return base / "loopctl"


def open_chat_session(name: str, db: Optional[str], env: Mapping[str, str]) -> Tuple[SQLiteSessionStore, Session]:
    """The store and the session ``name`` in it (``db`` or the default file).

    Raises:
        ConfigError: the file cannot be used, or an empty name.
    """
    if not name:
        raise ConfigError("--session needs a non-empty name")
    if db:
        path = Path(db).expanduser()
    else:
        folder = data_dir(env)
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise ConfigError(f"cannot create the session folder {str(folder)!r}: {exc.strerror}") from exc
        path = folder / DB_NAME
    store = SQLiteSessionStore(path)
    try:
        session = store.session(name)
    except (TypeError, ValueError) as exc:
        store.close()
        raise ConfigError(f"--session {name[:80]!r}: {exc}") from exc
    return store, session


__all__ = ["DB_NAME", "data_dir", "open_chat_session"]
