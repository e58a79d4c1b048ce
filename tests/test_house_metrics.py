"""``benchmarks/house_metrics.py``: the heuristics count what they say, and the figures reach the table."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
house = pytest.importorskip("house_metrics")
run_all = pytest.importorskip("run_all")


def test_any_inside_a_json_mapping_does_not_count_and_any_elsewhere_does() -> None:
    source = (
        "from typing import Any, Dict, List\n"
        "a: dict[str, Any]\n"
        "b: Dict[str, Any]\n"
        "c: List[Any]\n"
        "d: Any\n"
        "e: Dict[int, Any]\n"
        "f: 'Optional[Any]'\n"
        "def g(x: Any) -> typing.Any: ...\n"
    )
    assert house.any_uses(ast.parse(source)) == 5  # d, e, f, g's x and its return


def test_a_reach_in_is_a_private_read_through_another_object() -> None:
    source = (
        "import os\n"
        "os._exit(1)\n"
        "self._a\n"
        "cls._b\n"
        "super()._c()\n"
        "other._d\n"
        "self.peer._e\n"
        "x.__dict__\n"
    )
    assert [ast.unparse(n) for n in house.reach_ins(ast.parse(source))] == ["other._d", "self.peer._e"]


def test_a_class_reading_its_own_private_fields_is_not_a_reach_in() -> None:
    source = (
        "class Signal:\n"
        "    __slots__ = ('_event',)\n"
        "    def _fire(self): ...\n"
        "    def view(self):\n"
        "        v = Signal()\n"
        "        v._event = self._event\n"
        "        self._parent._fire()\n"
        "        return other._state\n"
        "class Store:\n"
        "    def read(self, signal):\n"
        "        return signal._event\n"
    )
    found = [ast.unparse(n) for n in house.reach_ins(ast.parse(source))]
    assert found == ["other._state", "signal._event"]


def test_class_attributes_count_fields_slots_and_self_assignments_once() -> None:
    source = (
        "class C:\n"
        "    __slots__ = ('s1', 's2')\n"
        "    a: int\n"
        "    b = 1\n"
        "    def __init__(self):\n"
        "        self.a = 2\n"
        "        self.c = 3\n"
        "    def m(self):\n"
        "        self.d = 4\n"
        "        other.e = 5\n"
    )
    cls = ast.parse(source).body[0]
    assert isinstance(cls, ast.ClassDef)
    assert house.class_attributes(cls) == {"s1", "s2", "a", "b", "c", "d"}


def test_parameters_leave_out_self_and_count_star_args() -> None:
    fn = ast.parse("def f(self, a, /, b, *args, c, **kw): ...").body[0]
    assert isinstance(fn, ast.FunctionDef)
    assert house.param_count(fn) == 5


def test_every_figure_reaches_the_table_and_the_goals_are_judged(capsys: pytest.CaptureFixture[str]) -> None:
    assert house.main([]) == 0
    rows = run_all.parse(capsys.readouterr().out)
    assert len(rows) == 8, rows
    judged = [run_all.verdict(r) for r in rows if r.target]
    assert len(judged) == 6
    assert all(v.endswith((": met", ": MISSED")) for v in judged), judged
    by_name = {r.figure.split(" (")[0]: r for r in rows}
    assert by_name["text pointing outside the package"].target == "<= 0 places"
    assert int(float(by_name["public members of BareLoop"].value.split()[0])) > 0


def test_the_package_keeps_the_house_in_order() -> None:
    """The layout's limits hold on the package itself: an offender is named here, not found later."""
    found = house.measure()
    limits = {"modules": 0, "functions": 0, "classes": 2, "any": 150, "reach": 14, "outside": 0}
    over = {
        key: [f"{f.where}: {f.what}" for f in found[key]]
        for key, limit in limits.items()
        if len(found[key]) > limit
    }
    assert over == {}
