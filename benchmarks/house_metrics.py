"""The shape of the house: sizes, types and reach-ins of ``loopctl/``, read with stdlib ``ast``.

Static figures, no timing: modules over 450 lines, functions over 60
lines, classes over 15 attributes, functions with 8 or more parameters,
uses of ``Any`` outside JSON mappings, reads of another object's private
fields, the public members of ``BareLoop`` and text that points outside
the package. Each is printed as a ``RESULT`` line beside its goal (the
floor column is the goal, so the ratio says how far off it is); the
offenders are listed above the lines. ``--list`` prints every offender,
not just the first few.

    python benchmarks/house_metrics.py [--list] [--smoke]

Heuristics, stated so the figures can be judged:

- a class's attributes are the names bound in its body (not methods), its
  ``__slots__`` entries and the ``self.x = ...`` targets of its methods;
- parameters do not count ``self``/``cls``; ``*args``/``**kwargs`` count;
- ``Any`` inside ``dict[str, Any]``/``Dict``/``Mapping``/``MutableMapping``
  with ``str`` keys, or ``list[Any]``/``List[Any]``/``Sequence[Any]``, is a
  JSON value and does not count, nor does ``Any`` in an import;
- a private reach-in is ``x._name`` (not a dunder) where ``x`` is not
  ``self``, ``cls``, ``super()`` or a module brought in by ``import``, and
  the read is not inside a class that itself declares ``_name`` (a method,
  a class-level name, a ``__slots__`` entry or a ``self._name`` it sets):
  privacy is per class, so ``other._items`` in ``MessagesView.__eq__`` or
  ``parent._event`` between two ``CancelSignal`` objects is the class
  reading its own fields, not a reach into another class. A different class
  using the same private name inside such a class goes uncounted.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PACKAGE = ROOT / "loopctl"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from run_all import SMOKE_HELP, report  # noqa: E402

MODULE_LINES = 450
FUNCTION_LINES = 60
CLASS_ATTRS = 15
PARAMS = 8
JSON_CONTAINERS = {"dict", "Dict", "Mapping", "MutableMapping", "list", "List", "Sequence"}
#: Text that only makes sense to someone holding a document outside the package.
OUTSIDE = re.compile(r"SPEC\s*§|§\s*\d|\bissue\s+#?\d+|\bthe seed\b|\breference\s+§", re.IGNORECASE)


class Finding(NamedTuple):
    where: str
    what: str


def modules() -> Iterator[tuple[str, str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        yield path.relative_to(ROOT).as_posix(), text, ast.parse(text)


def functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def length(node: ast.AST) -> int:
    return int(getattr(node, "end_lineno", 0) or 0) - int(getattr(node, "lineno", 0)) + 1


def param_count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def class_attributes(cls: ast.ClassDef) -> set[str]:
    names: set[str] = set()
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            names.add(stmt.target.id)
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name) and target.id == "__slots__":
                    names |= {e.value for e in ast.walk(stmt.value)
                              if isinstance(e, ast.Constant) and isinstance(e.value, str)}
                elif isinstance(target, ast.Name):
                    names.add(target.id)
    for fn in functions(cls):
        for node in ast.walk(fn):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name) and node.value.id == "self"):
                names.add(node.attr)
    return {n for n in names if not (n.startswith("__") and n.endswith("__"))}


def _is_any(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "Any") or (
        isinstance(node, ast.Attribute) and node.attr == "Any")


def _json_anys(tree: ast.AST) -> set[int]:
    """ids of the ``Any`` nodes that are JSON values (see the module's heuristics)."""
    ok: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Subscript):
            continue
        base = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", "")
        if base not in JSON_CONTAINERS:
            continue
        args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        keyed = len(args) == 2 and isinstance(args[0], ast.Name) and args[0].id == "str"
        if (len(args) == 1 or keyed) and _is_any(args[-1]):
            ok.add(id(args[-1]))
    return ok


def any_uses(tree: ast.AST) -> int:
    trees = [tree]
    for node in ast.walk(tree):  # quoted annotations are code too
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "Any" in node.value:
            try:
                trees.append(ast.parse(node.value, mode="eval"))
            except SyntaxError:
                continue
    count = 0
    for t in trees:
        json = _json_anys(t)
        count += sum(1 for n in ast.walk(t) if _is_any(n) and id(n) not in json)
    return count


def _same_class_reads(tree: ast.AST) -> set[int]:
    """ids of ``x._name`` nodes inside a class that declares ``_name`` itself."""
    ok: set[int] = set()
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        own = class_attributes(cls) | {
            s.name for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
        ok |= {id(n) for n in ast.walk(cls) if isinstance(n, ast.Attribute) and n.attr in own}
    return ok


def reach_ins(tree: ast.AST) -> Iterator[ast.Attribute]:
    # ``os._exit``, ``sys._getframe``: a module's documented underscore names are its API.
    modules_here = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                    for a in n.names}
    same_class = _same_class_reads(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if id(node) in same_class:
            continue
        if not name.startswith("_") or (name.startswith("__") and name.endswith("__")):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and (owner.id in ("self", "cls") or owner.id in modules_here):
            continue
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
            continue
        yield node


def measure() -> dict[str, list[Finding]]:
    found: dict[str, list[Finding]] = {k: [] for k in ("modules", "functions", "classes", "params", "any",
                                                        "reach", "outside")}
    for rel, text, tree in modules():
        lines = len(text.splitlines())
        if lines > MODULE_LINES:
            found["modules"].append(Finding(rel, f"{lines} lines"))
        for fn in functions(tree):
            if length(fn) > FUNCTION_LINES:
                found["functions"].append(Finding(f"{rel}:{fn.lineno}", f"{fn.name} {length(fn)} lines"))
            if param_count(fn) >= PARAMS:
                found["params"].append(Finding(f"{rel}:{fn.lineno}", f"{fn.name} {param_count(fn)} parameters"))
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            attrs = class_attributes(cls)
            if len(attrs) > CLASS_ATTRS:
                found["classes"].append(Finding(f"{rel}:{cls.lineno}", f"{cls.name} {len(attrs)} attributes"))
        uses = any_uses(tree)
        found["any"] += [Finding(rel, "Any")] * uses
        for node in reach_ins(tree):
            found["reach"].append(Finding(f"{rel}:{node.lineno}", ast.unparse(node)))
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                found["outside"].append(Finding(f"{rel}:{number}", line.strip()[:70]))
    return found


def bareloop_members() -> list[str]:
    from loopctl import BareLoop

    return sorted(n for n in dir(BareLoop) if not n.startswith("_"))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print every offender")
    # Already a few seconds: the tiny mode is the full one (accepted, as every benchmark's is).
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE_HELP}; the same as without it here")
    shown = None if parser.parse_args(argv).list else 5
    found = measure()
    members = bareloop_members()
    for key, items in found.items():
        if key == "any":
            per_file: dict[str, int] = {}
            for f in items:
                per_file[f.where] = per_file.get(f.where, 0) + 1
            items = [Finding(w, f"{n} uses") for w, n in sorted(per_file.items(), key=lambda kv: -kv[1])]
        for f in items[:shown]:
            print(f"{key}: {f.where}: {f.what}")
    # (figure, value, goal, unit): the goal is the issue's; None where it sets none.
    rows = [
        (f"modules over {MODULE_LINES} lines", len(found["modules"]), 0, "modules"),
        (f"functions over {FUNCTION_LINES} lines", len(found["functions"]), 0, "functions"),
        (f"classes over {CLASS_ATTRS} attributes", len(found["classes"]), 2, "classes"),
        (f"functions with {PARAMS}+ parameters", len(found["params"]), None, "functions"),
        ("uses of Any outside JSON mappings", len(found["any"]), 150, "uses"),
        ("reads of another object's private fields", len(found["reach"]), 14, "reads"),
        ("public members of BareLoop", len(members), None, "members"),
        ("text pointing outside the package", len(found["outside"]), 0, "places"),
    ]
    for figure, value, goal, unit in rows:
        if goal is None:
            report(f"{figure} (no goal set)", value, value, unit)
        else:
            report(f"{figure} (floor = goal)", value, goal, unit, target=f"<= {goal} {unit}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
