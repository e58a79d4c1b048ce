"""Memory stays bounded: identical entries are kept once, and a store has a capacity.

Both stores (``InMemoryStore``, ``SqliteMemoryStore``) keep an identical
entry (text, tags, category, relevance) once, refreshed as the most
recently stored; past ``capacity`` the least recently stored entry goes.
Recall is never crowded by copies of one memory.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any, Union

import pytest
from support import Echoed

from loopctl import BareLoop
from loopctl.context import InMemoryStore, MemoryEntry, SqliteMemoryStore
from loopctl.context.memory import DEFAULT_CAPACITY, trajectory_entry
from loopctl.errors import ConfigError
from loopctl.testing import ScriptedClient, call, reply

Store = Union[InMemoryStore, SqliteMemoryStore]


def make_store(kind: str, tmp_path: Path, **kw: Any) -> Store:
    if kind == "memory":
        return InMemoryStore(**kw)
    return SqliteMemoryStore(tmp_path / "memory.db", **kw)


KINDS = ["memory", "sqlite"]


@pytest.mark.parametrize("kind", KINDS)
def test_300_identical_runs_leave_one_trajectory(kind: str, tmp_path: Path) -> None:
    store = make_store(kind, tmp_path)
    client = ScriptedClient([call("echo", x=1), reply("done")] * 300)
    with BareLoop(client, [Echoed()]) as loop:
        loop.set_memory(store)
        for _ in range(300):
            loop.run("echo one")
    [entry] = store.entries()
    assert entry.category == "trajectory" and "result=echoed" in entry.text
    if isinstance(store, SqliteMemoryStore):
        store.close()


@pytest.mark.parametrize("kind", KINDS)
def test_storing_an_identical_entry_refreshes_the_stored_one(kind: str, tmp_path: Path) -> None:
    store = make_store(kind, tmp_path)
    first = MemoryEntry("the staging db is kite", tags=("ops",), created_at=1.0)
    store.store(first)
    store.store(MemoryEntry("the staging db is kite", tags=("ops",), created_at=5.0))
    [kept] = store.entries()
    assert kept.id == first.id and kept.created_at == 5.0
    # Different tags, category or relevance: a different memory.
    store.store(MemoryEntry("the staging db is kite", tags=("db",), created_at=6.0))
    store.store(MemoryEntry("the staging db is kite", tags=("ops",), category="insight", created_at=7.0))
    store.store(MemoryEntry("the staging db is kite", tags=("ops",), relevance=0.5, created_at=8.0))
    assert len(store) == 4
    if isinstance(store, SqliteMemoryStore):
        store.close()


@pytest.mark.parametrize("kind", KINDS)
def test_replacing_an_entry_by_id_frees_its_old_text_for_a_new_entry(kind: str, tmp_path: Path) -> None:
    store = make_store(kind, tmp_path)
    store.store(MemoryEntry("v1 text", id="same"))
    store.store(MemoryEntry("v2 text", id="same"))
    store.store(MemoryEntry("v1 text", id="other"))
    assert sorted((e.id, e.text) for e in store.entries()) == [("other", "v1 text"), ("same", "v2 text")]
    assert store.delete("same") and not store.delete("same")
    store.store(MemoryEntry("v2 text", id="third"))
    assert sorted(e.id for e in store.entries()) == ["other", "third"]
    if isinstance(store, SqliteMemoryStore):
        store.close()


@pytest.mark.parametrize("kind", KINDS)
def test_past_capacity_the_least_recently_stored_entry_is_evicted(kind: str, tmp_path: Path) -> None:
    store = make_store(kind, tmp_path, capacity=3)
    for i in range(3):
        store.store(MemoryEntry(f"fact number {i}", created_at=float(i)))
    store.store(MemoryEntry("fact number 0", created_at=10.0))  # refreshed: now the newest
    store.store(MemoryEntry("fact number 3", created_at=11.0))
    store.store(MemoryEntry("fact number 4", created_at=12.0))
    assert sorted(e.text for e in store.entries()) == ["fact number 0", "fact number 3", "fact number 4"]
    assert len(store) == 3
    if isinstance(store, SqliteMemoryStore):
        store.store_many(MemoryEntry(f"batch fact {i}") for i in range(10))
        assert sorted(e.text for e in store.entries()) == [f"batch fact {i}" for i in (7, 8, 9)]
        store.close()
        with SqliteMemoryStore(tmp_path / "memory.db", capacity=3) as again:
            assert len(again) == 3


def test_the_default_capacity_is_documented_and_applied(tmp_path: Path) -> None:
    assert InMemoryStore().capacity == DEFAULT_CAPACITY == 10_000
    with SqliteMemoryStore(tmp_path / "m.db") as s:
        assert s.capacity == DEFAULT_CAPACITY


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "10", None])
def test_a_bad_capacity_is_refused_naming_the_value(bad: Any, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="capacity"):
        InMemoryStore(capacity=bad)
    with pytest.raises(ConfigError, match="capacity"):
        SqliteMemoryStore(tmp_path / "m.db", capacity=bad)


def test_copies_in_a_file_written_before_dedupe_never_crowd_recall_and_consolidate_merges_them(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    with SqliteMemoryStore(path):
        pass
    con = sqlite3.connect(str(path))
    tags = json.dumps(["trajectory", "echo"])
    with con:
        for i in range(20):
            con.execute(
                "INSERT INTO memories VALUES (?, ?, ?, ?, ?, ?)",
                (f"copy{i}", "tool=echo; input={}; result=deploy ok", tags, "trajectory", 1.0, float(i)),
            )
        con.execute(
            "INSERT INTO memories VALUES (?, ?, ?, ?, ?, ?)",
            ("fact", "deploy with the blue button", "[]", "fact", 1.0, 0.5),
        )
    con.close()
    with SqliteMemoryStore(path) as store:
        got = store.retrieve("deploy", 3)
        assert sorted(e.text for e in got) == ["deploy with the blue button", "tool=echo; input={}; result=deploy ok"]
        store.consolidate()
        assert len(store) == 2
        assert {e.id for e in store.entries()} == {"copy19", "fact"}  # the most recently stored copy


@pytest.mark.parametrize("kind", KINDS)
def test_a_stored_fact_outranks_a_newer_trajectory_with_the_same_overlap(kind: str, tmp_path: Path) -> None:
    store = make_store(kind, tmp_path)
    fact = MemoryEntry("deploy notes: ship on friday", created_at=1.0)
    store.store(fact)
    store.store(trajectory_entry("fetch", "deploy", "notes"))  # newer, same overlap with the query
    got = store.retrieve("deploy notes", 2)
    assert [e.category for e in got] == ["fact", "trajectory"]
    if isinstance(store, SqliteMemoryStore):
        store.close()
