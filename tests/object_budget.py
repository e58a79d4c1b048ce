"""How many objects the cyclic collector tracks per idle loop and per run in flight.

Measured through public API only: build ``k`` ``BareLoop``s (one tool, one
model client shared by all, as a web process shares its client and its
tools), count the objects ``gc.get_objects()`` returns after a full
collection, and divide the growth by ``k``; then start one run on each loop
whose model call parks on a gate (a ``threading.Event``), wait until all
``k`` are parked, and count again. A full collection runs before each count
so garbage waiting for the collector is not counted.

``python tests/object_budget.py`` prints both figures and, by type, where
the objects come from (the type's name and the module that defines it).
"""

from __future__ import annotations

import collections
import gc
import sys
import threading
from collections.abc import Iterator
from typing import Any

from loopctl import BareLoop, ModelRequest, ModelResponse
from loopctl.providers.base import IteratorStream, response_events
from loopctl.testing import reply
from loopctl.tools import tool

#: The budgets the object diet aims at (tracked objects).
IDLE_LOOP_BUDGET = 40
RUN_IN_FLIGHT_BUDGET = 60


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class GatedClient:
    """A model client shared by many loops: every call parks until the gate opens, then answers."""

    model = "gated"

    def __init__(self, k: int) -> None:
        self.gate = threading.Event()
        self.all_parked = threading.Event()
        self._k = k
        self._parked = 0
        self._lock = threading.Lock()
        self._answer = reply("done")

    def _park(self) -> ModelResponse:
        with self._lock:
            self._parked += 1
            if self._parked == self._k:
                self.all_parked.set()
        if not self.gate.wait(60.0):
            raise RuntimeError("the gate never opened")
        return self._answer

    def complete(self, request: ModelRequest) -> ModelResponse:
        """Park on the gate, then answer."""
        return self._park()

    def stream(self, request: ModelRequest) -> IteratorStream:
        """Park on the gate, then stream the answer."""
        return IteratorStream(iter(response_events(self._park(), 64)))


def _tracked() -> list[Any]:
    gc.collect()
    return gc.get_objects()


def _new(before: list[Any], after: list[Any]) -> Iterator[Any]:
    seen = {id(o) for o in before}
    return (o for o in after if id(o) not in seen)


def _kind(o: Any) -> str:
    t = type(o)
    return f"{t.__module__}.{t.__qualname__}"


def measure(k: int = 200) -> dict[str, Any]:
    """Tracked objects per idle loop and per run in flight, and both by type (counts over ``k``).

    Returns ``{"per_loop": float, "per_run": float, "loop_types": Counter,
    "run_types": Counter}``; the counters hold totals over the ``k`` loops.
    """
    client = GatedClient(k)
    BareLoop(client, [add]).close()  # first-use costs (caches, imports) out of the count
    gc.collect()
    base = _tracked()
    loops = [BareLoop(client, [add]) for _ in range(k)]
    idle = _tracked()
    loop_types = collections.Counter(_kind(o) for o in _new(base, idle))
    per_loop = (len(idle) - len(base)) / k
    del base
    handles = []
    try:
        handles = [loop.start("what is 1 + 2?") for loop in loops]
        if not client.all_parked.wait(60.0):
            raise RuntimeError("the runs never reached their model call")
        busy = _tracked()
        run_types = collections.Counter(_kind(o) for o in _new(idle, busy))
        per_run = (len(busy) - len(idle)) / k
        del busy, idle
    finally:
        client.gate.set()
        for h in handles:
            h.result(60.0)
        for loop in loops:
            loop.close()
    return {"per_loop": per_loop, "per_run": per_run, "loop_types": loop_types, "run_types": run_types}


def main() -> None:
    k = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    m = measure(k)
    for title, key, counter, budget in (
        ("idle loop", "per_loop", m["loop_types"], IDLE_LOOP_BUDGET),
        ("run in flight", "per_run", m["run_types"], RUN_IN_FLIGHT_BUDGET),
    ):
        print(f"tracked objects per {title}: {m[key]:.1f} (budget <= {budget})")
        for name, count in counter.most_common():
            if count / k >= 0.5:
                print(f"  {count / k:6.1f}  {name}")


if __name__ == "__main__":
    main()
