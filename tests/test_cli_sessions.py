"""``loopctl chat --session NAME`` keeps a named conversation across invocations (point 6 of sessions)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from loopctl.demo.chat_sessions import DB_NAME, data_dir
from loopctl.demo.cli import main
from loopctl.sessions import SQLiteSessionStore


def chat(argv: list[str], lines: str, env: dict[str, str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["chat", *argv], stdin=io.StringIO(lines), stdout=out, stderr=err, env=env)
    return code, out.getvalue(), err.getvalue()


def test_6_chat_session_continues_a_named_conversation_across_invocations(tmp_path: Path) -> None:
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "HOME": str(tmp_path / "home")}
    code, out, _ = chat(["--session", "work/ünï"], "What is 12 + 30?\n", env)
    assert code == 0 and "a new conversation" in out and "12 + 30 = 42." in out
    code, out, _ = chat(["--session", "work/ünï"], "multiply 6 by 7\n", env)
    assert code == 0 and "continuing (4 earlier messages)" in out and "6 * 7 = 42." in out
    code, out, _ = chat(["--session", "other"], "What is 1 + 1?\n", env)
    assert "a new conversation" in out
    db = tmp_path / "data" / "loopctl" / DB_NAME
    store = SQLiteSessionStore(db)
    msgs = store.session("work/ünï").messages()
    assert msgs[0].text == "What is 12 + 30?" and msgs[4].text == "multiply 6 by 7" and len(msgs) == 8
    assert sorted(i.id for i in store.list()) == ["other", "work/ünï"]
    store.close()
    assert (tmp_path / "data" / "loopctl").stat().st_mode & 0o077 == 0  # private to the user


def test_6_session_db_chooses_the_file_and_json_mode_keeps_notes_on_stderr(tmp_path: Path) -> None:
    db = tmp_path / "mine.db"
    code, out, err = chat(["--session", "s", "--session-db", str(db), "--json"], "What is 2 + 2?\n", {})
    assert code == 0 and "a new conversation" in err
    assert all(json.loads(line) for line in out.splitlines())
    store = SQLiteSessionStore(db)
    assert len(store.session("s").messages()) == 4
    store.close()


def test_6_a_session_in_use_elsewhere_is_reported_and_left_unchanged(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    store = SQLiteSessionStore(db)
    lease = store.session("busy").acquire()
    code, out, err = chat(["--session", "busy", "--session-db", str(db)], "What is 2 + 2?\n", {})
    assert "session 'busy' is busy" in err
    lease.release()
    assert store.session("busy").messages() == []
    store.close()


def test_6_usage_errors_for_session_flags(tmp_path: Path) -> None:
    code, _, err = chat(["--session-db", str(tmp_path / "x.db")], "", {})
    assert code == 2 and "--session-db needs --session NAME" in err
    code, _, err = chat(["--session", "x", "--session-db", str(tmp_path / "no" / "such" / "x.db")], "", {})
    assert code == 1 and "does not exist" in err


def test_6_the_data_folder_follows_each_platform(tmp_path: Path) -> None:
    home = str(tmp_path)
    assert data_dir({"HOME": home, "XDG_DATA_HOME": "/x/data"}, "linux") == Path("/x/data/loopctl")
    assert data_dir({"HOME": home}, "linux") == tmp_path / ".local" / "share" / "loopctl"
    assert data_dir({"HOME": home, "XDG_DATA_HOME": "relative"}, "linux") == tmp_path / ".local/share/loopctl"
    assert data_dir({"HOME": home}, "darwin") == tmp_path / "Library" / "Application Support" / "loopctl"
    assert data_dir({"LOCALAPPDATA": "/w/Local", "HOME": home}, "win32") == Path("/w/Local/loopctl")
    assert data_dir({"USERPROFILE": home}, "win32") == tmp_path / "AppData" / "Local" / "loopctl"
