"""The object diet: what the cyclic collector walks per idle loop and per run in flight.

Every tracked object is walked by each full collection while it holds the
GIL; with thousands of runs in flight that walk is what stalls the runs
waking from their model calls. The budgets are counted on public API with
``gc.get_objects()`` (``tests/object_budget.py``).
"""

from __future__ import annotations

import sys

import pytest
from object_budget import IDLE_LOOP_BUDGET, RUN_IN_FLIGHT_BUDGET, measure

K = 100
# The budgets are CPython 3.11+ figures: there an instance keeps its attributes
# inline, while 3.9 and 3.10 give each unslotted instance a tracked __dict__ of
# its own (and 3.10 tracks thread locks too): 40 and 59.2 on 3.9, 46 and 63.2 on 3.10.
NEW_LAYOUT = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="object budgets are set for CPython >= 3.11's inline attributes"
)


@pytest.fixture(scope="module")
def counts() -> dict[str, float]:
    return measure(K)


def _worst(counter: object) -> str:
    return ", ".join(f"{name} {n / K:.1f}" for name, n in counter.most_common(8))  # type: ignore[attr-defined]


@NEW_LAYOUT
def test_idle_loop_within_budget(counts: dict[str, object]) -> None:
    per_loop = counts["per_loop"]
    assert isinstance(per_loop, float)
    assert per_loop <= IDLE_LOOP_BUDGET, f"{per_loop:.1f} tracked objects per idle loop: {_worst(counts['loop_types'])}"


@NEW_LAYOUT
def test_run_in_flight_within_budget(counts: dict[str, object]) -> None:
    per_run = counts["per_run"]
    assert isinstance(per_run, float)
    assert per_run <= RUN_IN_FLIGHT_BUDGET, (
        f"{per_run:.1f} tracked objects per run in flight: {_worst(counts['run_types'])}"
    )


def test_measure_counts_what_a_loop_holds() -> None:
    # The helper must see objects at all: a loop and a parked run are never free.
    m = measure(10)
    assert m["per_loop"] >= 5 and m["per_run"] >= 10, m
