"""Frozen argument values and the gate's id renaming, without a run."""

from __future__ import annotations

import copy
import json
import pickle
from contextlib import nullcontext
from typing import Any

import pytest

from loopctl.driver.admission import admit, unique_ids
from loopctl.frozen import FrozenDict, FrozenList, freeze, freeze_arguments, thaw
from loopctl.messages import ToolCallPart
from loopctl.tools import ToolRegistry, tool


def test_a_frozen_value_refuses_every_change_at_any_depth_and_behaves_like_plain_json() -> None:
    plain: dict[str, Any] = {"items": [1, {"tags": ["a"]}], "n": 2}
    frozen = freeze_arguments(plain)
    plain["items"][1]["tags"].append("changed")  # the source changing later changes nothing
    assert frozen == {"items": [1, {"tags": ["a"]}], "n": 2}
    attempts = [
        lambda: frozen.__setitem__("n", 3), lambda: frozen.update(n=3), lambda: frozen.pop("n"),
        lambda: frozen.setdefault("m", 1), lambda: frozen.clear(), lambda: frozen["items"].append(3),
        lambda: frozen["items"].extend([3]), lambda: frozen["items"][1]["tags"].insert(0, "x"),
        lambda: frozen["items"].__setitem__(0, 9), lambda: frozen["items"].sort(),
    ]
    for attempt in attempts:
        with pytest.raises(TypeError):
            attempt()
    assert frozen == {"items": [1, {"tags": ["a"]}], "n": 2}
    assert json.loads(json.dumps(frozen)) == frozen
    back = pickle.loads(pickle.dumps(frozen))
    assert back == frozen and type(back["items"]) is FrozenList
    assert copy.deepcopy(frozen) is frozen and freeze_arguments(frozen) is frozen
    mine = thaw(frozen)
    mine["items"][1]["tags"].append("mine")
    assert type(mine) is dict and type(mine["items"]) is list and frozen["items"][1]["tags"] == ["a"]
    assert isinstance(frozen, dict) and isinstance(FrozenDict(), dict)


def test_repeated_ids_are_renamed_deterministically_skipping_ids_already_taken() -> None:
    calls = [ToolCallPart(cid, "t", {}) for cid in ("c1", "c1", "c1-2", "c2", "c1")]
    assert [c.id for c in unique_ids(calls)] == ["c1", "c1-3", "c1-2", "c2", "c1-4"]
    assert [c.id for c in unique_ids(unique_ids(calls))] == ["c1", "c1-3", "c1-2", "c2", "c1-4"]


def test_admission_resolves_validates_and_freezes_and_is_idempotent() -> None:
    @tool
    def add(a: int, b: int) -> int:
        """Add.

        Args:
            a: one.
            b: two.
        """
        return a + b

    registry = ToolRegistry([add])
    both = [ToolCallPart("c", "add", {"a": 1, "b": 2}), ToolCallPart("c", "add", {"a": "x"})]
    first = admit(both, registry, nullcontext)
    assert [(a.call.id, a.tool, a.problem is None) for a in first] == [("c", add, True), ("c-2", add, False)]
    assert all(type(a.call.input) is FrozenDict for a in first)
    again = admit([a.call for a in first], registry, nullcontext)
    assert [a.call for a in again] == [a.call for a in first] and again[0].call is first[0].call
    assert first[0].arguments() == {"a": 1, "b": 2} and type(first[0].arguments()) is dict


def test_arguments_nested_too_deeply_become_an_invalid_call_not_a_crash() -> None:
    deep: dict[str, Any] = {}
    for _ in range(5000):
        deep = {"a": deep}
    [admitted] = admit([ToolCallPart("c", "t", deep)], ToolRegistry(), nullcontext)
    assert admitted.call.input == {} and "nested too deeply" in (admitted.call.invalid or "")


def test_calling_init_again_changes_nothing() -> None:
    # An observer handed the shared value cannot refill it through __init__.
    args = freeze({"to": "alice", "items": [1, 2]})
    args.__init__({"to": "mallory"})  # type: ignore[misc]
    args["items"].__init__([9])  # type: ignore[misc]
    assert args == {"to": "alice", "items": [1, 2]}
    empty = FrozenDict()
    empty.__init__({"to": "mallory"})  # type: ignore[misc]
    assert empty == {}
