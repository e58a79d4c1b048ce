"""SqliteMemoryStore: durability, concurrency, search parity, clear errors."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Mapping

import pytest
from support import run_in_threads

from loopctl import BareLoop, RunConfig
from loopctl.context import InMemoryStore, MemoryEntry, SqliteMemoryStore
from loopctl.context.sqlite_store import fts5_available
from loopctl.driver.llm_turn import MEMORY_PREFIX
from loopctl.errors import ConfigError, LoopError
from loopctl.testing import ScriptedClient, call, reply
from loopctl.tools import Tool, ToolContext

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "memory.db"


CORPUS = [
    MemoryEntry("The deploy key lives in Vault under ops/deploy", tags=("ops",), created_at=1.0),
    MemoryEntry("Deploys happen on Fridays; deploy carefully", created_at=2.0),
    MemoryEntry("Lunch is at noon", tags=("food",), created_at=3.0),
    MemoryEntry("Kubernetes staging cluster is called kite", tags=("kubernetes", "ops"), created_at=4.0),
    MemoryEntry("old irrelevant fact about deploys", relevance=0.01, created_at=5.0),
    MemoryEntry("Unicode: café résumé naïve", created_at=6.0),
]
QUERIES = ["where is the deploy key?", "OPS", "kubernetes cluster", "lunch", "zebra", "CAFÉ", "deploy"]


@pytest.mark.parametrize("use_fts", [True, False], ids=["fts", "scan"])
def test_search_matches_in_memory_store(db: Path, use_fts: bool) -> None:
    ref = InMemoryStore(CORPUS)
    with SqliteMemoryStore(db, use_fts=use_fts) as s:
        assert s.uses_fts is (use_fts and fts5_available())
        s.store_many(CORPUS)
        for q in QUERIES:
            assert [e.id for e in s.retrieve(q, 10)] == [e.id for e in ref.retrieve(q, 10)], q
        assert s.retrieve("zebra", 5) == []
        assert len(s.retrieve("deploy", 1)) == 1
        assert s.retrieve("deploy", 0) == []
        with pytest.raises(ConfigError, match="-2"):
            s.retrieve("deploy", -2)


def test_reopened_store_returns_what_was_stored(db: Path) -> None:
    with SqliteMemoryStore(db) as s:
        s.store_many(CORPUS)
        s.store(MemoryEntry("replaced text", id=CORPUS[2].id, created_at=3.0))
    with SqliteMemoryStore(db) as again:
        assert len(again) == len(CORPUS)
        got = {e.id: e for e in again.entries()}
        assert got[CORPUS[0].id] == CORPUS[0]
        assert got[CORPUS[2].id].text == "replaced text"
        assert [e.text for e in again.retrieve("lunch", 5)] == []  # the old text is gone from the index too
        assert again.retrieve("replaced", 5)[0].id == CORPUS[2].id
        assert again.get(CORPUS[3].id) == CORPUS[3]
        assert again.delete(CORPUS[3].id) and not again.delete(CORPUS[3].id)
        again.consolidate()
        assert all(e.relevance >= 0.05 for e in again.entries())
        assert len(again) == len(CORPUS) - 2


def test_fts_index_built_for_rows_written_without_it(db: Path) -> None:
    if not fts5_available():
        pytest.skip("this SQLite has no FTS5")
    con = sqlite3.connect(db)
    con.executescript(
        "CREATE TABLE memories (id TEXT PRIMARY KEY, text TEXT NOT NULL, tags TEXT NOT NULL, "
        "category TEXT NOT NULL, relevance REAL NOT NULL, created_at REAL NOT NULL);"
        "INSERT INTO memories VALUES ('x1', 'prewritten fact', '[]', 'fact', 1.0, 1.0);"
    )
    con.close()
    with SqliteMemoryStore(db) as s:
        assert [e.id for e in s.retrieve("prewritten", 3)] == ["x1"]


def test_malformed_paths_give_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        SqliteMemoryStore(tmp_path)
    missing = tmp_path / "no" / "such" / "dir" / "m.db"
    with pytest.raises(ConfigError, match=str(missing.parent)):
        SqliteMemoryStore(missing)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database" * 200)
    with pytest.raises(ConfigError, match="junk.db.*not a database"):
        SqliteMemoryStore(junk)
    with pytest.raises(ConfigError, match="':memory:'"):
        SqliteMemoryStore(":memory:")
    with pytest.raises(ConfigError, match="42"):
        SqliteMemoryStore(42)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        SqliteMemoryStore("")


def test_closed_store_raises(db: Path) -> None:
    s = SqliteMemoryStore(db)
    s.close()
    s.close()  # idempotent
    with pytest.raises(LoopError, match="closed"):
        s.store(MemoryEntry("x"))


def test_one_store_shared_by_many_threads(db: Path) -> None:
    s = SqliteMemoryStore(db)
    n, per = 8, 60
    barrier = threading.Barrier(n)

    def work(k: int) -> None:
        barrier.wait()
        for i in range(per):
            s.store(MemoryEntry(f"thread{k} note{i} common"))
            if i % 5 == 0:
                s.retrieve("common", 3)

    assert run_in_threads(work, [(k,) for k in range(n)]) == []
    assert len(s) == n * per
    assert len(s.retrieve("thread5", 1000)) == per
    s.close()


def test_many_stores_on_one_file_from_many_threads(db: Path) -> None:
    n, per = 6, 40
    barrier = threading.Barrier(n)

    def work(k: int) -> None:
        barrier.wait()  # open and create the schema at the same moment
        with SqliteMemoryStore(db) as own:
            for i in range(per):
                own.store(MemoryEntry(f"writer{k} entry{i}"))
                own.retrieve(f"writer{(k + 1) % n}", 2)

    assert run_in_threads(work, [(k,) for k in range(n)]) == []
    with SqliteMemoryStore(db) as s:
        assert len(s) == n * per


class Remember(Tool):
    """Writes a fact into its loop's store (the loop also stores a trajectory)."""

    name = "remember"
    description = "remember a fact"

    def __init__(self, store: SqliteMemoryStore) -> None:
        self.store = store

    def input_schema(self) -> Mapping[str, Any]:
        return {"type": "object", "properties": {"fact": {"type": "string"}}, "required": ["fact"]}

    def call(self, input: Mapping[str, Any], ctx: ToolContext) -> Any:
        self.store.store(MemoryEntry(input["fact"], tags=("fact",)))
        return "stored"


def test_two_loops_on_two_threads_share_one_file(db: Path) -> None:
    rounds = 10
    written = threading.Barrier(2)
    results: dict[str, list[str]] = {}

    def agent(name: str, other: str) -> None:
        store = SqliteMemoryStore(db)
        script: list[Any] = []
        for i in range(rounds):
            script += [call("remember", fact=f"{name} fact number {i}"), reply("ok")]
        script.append(reply("read done"))
        client = ScriptedClient(script)
        loop = BareLoop(client, [Remember(store)]).with_memory(store)
        for i in range(rounds):
            loop.run(f"note {i}", RunConfig(memory_top_k=0))
        written.wait(30)
        loop.run(f"what did {other} write", RunConfig(memory_top_k=50))
        results[name] = [m.text for m in client.requests[-1].messages if m.text.startswith(MEMORY_PREFIX)]
        loop.close()
        store.close()

    assert run_in_threads(agent, [("alpha", "beta"), ("beta", "alpha")]) == []
    for name, other in (("alpha", "beta"), ("beta", "alpha")):
        (mem,) = results[name]
        for i in range(rounds):
            assert f"{other} fact number {i}" in mem
    with SqliteMemoryStore(db) as s:
        entries = s.entries()
        facts = [e for e in entries if "fact" in e.tags]
        assert sorted(e.text for e in facts) == sorted(f"{n} fact number {i}" for n in ("alpha", "beta") for i in range(rounds))
        # the loops stored one trajectory per successful tool call, too
        trajectories = [e for e in entries if e.category == "trajectory" or "trajectory" in e.tags]
        assert len(trajectories) == 2 * rounds
        assert all(e.text.startswith("tool=remember; input=") for e in trajectories)


_WRITER = r"""
import sys
from loopctl.context import MemoryEntry, SqliteMemoryStore
s = SqliteMemoryStore(sys.argv[1])
i = 0
while True:
    e = MemoryEntry("durable entry %d " % i + "p" * 2000)
    s.store(e)
    sys.stdout.write(e.id + "\n")
    sys.stdout.flush()
    i += 1
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_committed_entries_survive_a_killed_process(db: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(db)], stdout=subprocess.PIPE, text=True, env=env)
    committed: list[str] = []
    try:
        assert proc.stdout is not None
        while len(committed) < 40:
            line = proc.stdout.readline()
            assert line, "writer died early"
            committed.append(line.strip())
        proc.send_signal(signal.SIGKILL)  # mid-write: it is inside its next store()
    finally:
        proc.kill()
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
    with SqliteMemoryStore(db) as s:
        ids = {e.id for e in s.entries()}
        assert set(committed) <= ids
        con = sqlite3.connect(db)
        try:
            assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        finally:
            con.close()
        assert s.retrieve("durable", 1)
