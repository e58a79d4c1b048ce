"""Memory: entries, InMemoryStore scoring, and the loop's use of memory (SPEC §9)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from support import run_in_threads

from loopctl import BareLoop, RunConfig
from loopctl.context import InMemoryStore, MemoryEntry
from loopctl.context.memory import (
    MEMORY_PREFIX,
    MEMORY_SUFFIX,
    Memory,
    rank,
    score,
    trajectory_entry,
    words,
)
from loopctl.errors import ConfigError
from loopctl.messages import Role
from loopctl.testing import ScriptedClient, reply


def test_entry_defaults_and_validation() -> None:
    e = MemoryEntry("hello", tags=("a",))
    assert e.category == "fact" and e.relevance == 1.0 and len(e.id) == 32
    assert MemoryEntry("x").id != MemoryEntry("x").id
    assert MemoryEntry.from_dict(e.to_dict()) == e
    with pytest.raises(ConfigError, match="1.5"):
        MemoryEntry("x", relevance=1.5)
    with pytest.raises(TypeError, match="'ab'"):
        MemoryEntry("x", tags="ab")  # a bare string is not a tag tuple
    with pytest.raises(TypeError):
        MemoryEntry(3)  # type: ignore[arg-type]


def test_words_casefold_and_ignore_punctuation() -> None:
    assert words("Hello, WORLD! hello?") == {"hello", "world"}


def test_retrieve_scores_by_word_overlap_case_insensitive() -> None:
    s = InMemoryStore()
    s.store(MemoryEntry("The deploy key lives in Vault", tags=()))
    s.store(MemoryEntry("Deploy happens on Fridays, deploy carefully"))
    s.store(MemoryEntry("Unrelated note about lunch"))
    got = s.retrieve("where is the DEPLOY key?", 5)
    texts = [e.text for e in got]
    assert texts[0] == "The deploy key lives in Vault"  # more query words matched
    assert "Unrelated note about lunch" not in texts  # no overlap -> not returned
    assert len(got) == 2


def test_no_overlap_returns_nothing_and_limit_is_respected() -> None:
    s = InMemoryStore([MemoryEntry(f"fact {i}") for i in range(10)])
    assert s.retrieve("zebra", 5) == []
    assert len(s.retrieve("fact", 3)) == 3
    assert s.retrieve("fact", 0) == []
    with pytest.raises(ConfigError, match="-1"):
        s.retrieve("fact", -1)


def test_tag_match_counts_and_boosts() -> None:
    s = InMemoryStore()
    tagged = MemoryEntry("use the staging cluster", tags=("kubernetes",))
    plain = MemoryEntry("kubernetes staging cluster notes")
    s.store(tagged)
    s.store(plain)
    # Only the tag matches "kubernetes" for the first entry, but it is returned.
    got = s.retrieve("kubernetes", 5)
    assert {e.id for e in got} == {tagged.id, plain.id}
    # Tag plus overlap outranks overlap alone.
    both = s.retrieve("kubernetes staging cluster", 5)
    assert both[0].id == tagged.id


def test_relevance_weighs_in_and_consolidate_prunes() -> None:
    low = MemoryEntry("alpha beta", relevance=0.01)
    high = MemoryEntry("alpha beta", relevance=0.9)
    s = InMemoryStore([low, high])
    assert [e.id for e in s.retrieve("alpha", 2)] == [high.id, low.id]
    s.consolidate()
    assert [e.id for e in s.entries()] == [high.id]


def test_store_replaces_same_id() -> None:
    s = InMemoryStore()
    e = MemoryEntry("v1", id="same")
    s.store(e)
    s.store(MemoryEntry("v2 text", id="same"))
    assert len(s) == 1 and s.entries()[0].text == "v2 text"


def test_protocol_and_score_zero_without_overlap() -> None:
    assert isinstance(InMemoryStore(), Memory)
    e = MemoryEntry("abc def")
    assert score(e, words("xyz"), "xyz") == 0.0
    assert score(e, words("abc"), "abc") > 0.0
    assert rank([e], "", 3) == []


def test_trajectory_entry_truncates_input_and_result() -> None:
    e = trajectory_entry("grep", {"pattern": "x" * 900}, "y" * 900)
    assert e.category == "trajectory" and e.tags == ("trajectory", "grep")
    assert e.text.startswith("tool=grep; input=")
    inp = e.text.split("; input=", 1)[1].split("; result=", 1)[0]
    res = e.text.split("; result=", 1)[1]
    assert len(inp) == 500 and len(res) == 500


def test_concurrent_store_and_retrieve_lose_nothing() -> None:
    s = InMemoryStore()
    n_threads, per = 8, 200
    barrier = threading.Barrier(n_threads)

    def work(k: int) -> None:
        barrier.wait()
        for i in range(per):
            s.store(MemoryEntry(f"worker{k} item{i} shared"))
            if i % 10 == 0:
                assert len(s.retrieve("shared", 3)) == 3 or i == 0

    assert run_in_threads(work, [(k,) for k in range(n_threads)]) == []
    assert len(s) == n_threads * per
    assert len(s.retrieve("worker3", 1000)) == per


# -- the loop's use of memory -------------------------------------------------------


def test_memory_message_is_transient_prefixed_and_uses_turn_input() -> None:
    store = InMemoryStore([MemoryEntry("the answer is 42", tags=("answer",)), MemoryEntry("nothing in common")])
    seen: list[Any] = []

    class Spy(InMemoryStore):
        def retrieve(self, query: str, limit: int = 5) -> list[MemoryEntry]:
            seen.append((query, limit))
            return store.retrieve(query, limit)

    client = ScriptedClient([reply("done")])
    loop = BareLoop(client).with_memory(Spy())
    loop.run("what is the answer", RunConfig(memory_top_k=2))
    assert seen == [("what is the answer", 2)]
    req = client.requests[0]
    mem = [m for m in req.messages if m.text.startswith(MEMORY_PREFIX)]
    assert len(mem) == 1 and mem[0].role is Role.USER
    assert mem[0].text == MEMORY_PREFIX + "\nthe answer is 42\n" + MEMORY_SUFFIX
    # never persisted
    assert all(not m.text.startswith(MEMORY_PREFIX) for m in loop.conversation())


def test_memory_top_k_zero_disables_and_no_match_sends_nothing() -> None:
    calls: list[str] = []

    class Spy(InMemoryStore):
        def retrieve(self, query: str, limit: int = 5) -> list[MemoryEntry]:
            calls.append(query)
            return super().retrieve(query, limit)

    client = ScriptedClient([reply("a"), reply("b")])
    loop = BareLoop(client).with_memory(Spy([MemoryEntry("zzz")]))
    loop.run("hello", RunConfig(memory_top_k=0))
    assert calls == []
    loop.run("hello again")
    assert calls == ["hello again"]
    assert not any(m.text.startswith(MEMORY_PREFIX) for r in client.requests for m in r.messages)


def test_consolidate_only_after_successful_run_and_errors_logged(caplog: pytest.LogCaptureFixture) -> None:
    count = [0]

    class Store(InMemoryStore):
        def consolidate(self) -> None:
            count[0] += 1
            raise RuntimeError("boom")

    from loopctl.errors import ModelError

    client = ScriptedClient([reply("ok"), ModelError("bad request")])
    loop = BareLoop(client, config=__import__("loopctl").SessionConfig()).with_memory(Store())
    loop.run("one")  # consolidate raises: logged, the run still succeeds
    assert count[0] == 1
    assert "memory consolidate failed" in caplog.text
    with pytest.raises(ModelError):
        loop.run("two")
    assert count[0] == 1  # failed run: no consolidate
