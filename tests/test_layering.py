"""Imports run downward only (STYLE "The house"), checked with stdlib ``ast``.

Every ``import`` in ``loopctl/**/*.py`` counts, wherever it sits: inside a
function, under ``if TYPE_CHECKING:``, relative or absolute. The rules are
data (``RULES``); a failure names the file, the line and the import.
"""

from __future__ import annotations

import ast
import fnmatch
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple, Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "loopctl"


class Rule(NamedTuple):
    """One layering rule.

    ``files`` are globs relative to the repo root. An import is a violation
    when it matches a ``forbidden`` prefix, or, when ``allowed`` is given,
    when it is a loopctl module outside every ``allowed`` prefix. ``exempt``
    lists files the rule does not apply to.
    """

    name: str
    files: tuple[str, ...]
    forbidden: tuple[str, ...] = ()
    allowed: Optional[tuple[str, ...]] = None
    exempt: tuple[str, ...] = ()
    exempt_globs: tuple[str, ...] = ()


LOWER_LAYERS = ("loopctl/providers/*", "loopctl/tools/*", "loopctl/context/*")

RULES: tuple[Rule, ...] = (
    Rule(
        "the brain does no IO: no threads, clock, network, logging or OS",
        files=("loopctl/machine/*",),
        forbidden=(
            "threading", "_thread", "time", "requests", "tenacity", "logging", "socket",
            "os", "asyncio", "concurrent", "subprocess", "select", "selectors", "signal",
            "random", "uuid", "datetime", "http", "urllib",
        ),
    ),
    Rule(
        "the brain imports only the leaves (errors, messages) and itself",
        files=("loopctl/machine/*",),
        allowed=("loopctl.errors", "loopctl.messages", "loopctl.machine"),
    ),
    Rule(
        "the JSON-text leaf imports nothing of loopctl",
        files=("loopctl/jsontext.py",),
        allowed=(),
    ),
    Rule(
        "the text leaf imports nothing of loopctl but the JSON-text leaf (whose names it re-exports)",
        files=("loopctl/text.py",),
        allowed=("loopctl.jsontext",),
    ),
    Rule(
        "leaves import nothing of loopctl but the text leaf (the one redaction)",
        files=("loopctl/errors.py", "loopctl/messages.py", "loopctl/cancel.py", "loopctl/frozen.py"),
        allowed=("loopctl.text",),
    ),
    Rule(
        "the value checks import only the errors and text leaves",
        files=("loopctl/checks.py",),
        allowed=("loopctl.errors", "loopctl.text"),
    ),
    Rule(
        "the duration check imports only the errors leaf and the value checks",
        files=("loopctl/timeouts.py",),
        allowed=("loopctl.errors", "loopctl.text", "loopctl.checks"),
    ),
    Rule(
        "approval values import only the frozen-value and text leaves",
        files=("loopctl/approvals/values.py",),
        allowed=("loopctl.frozen", "loopctl.text"),
    ),
    Rule(
        "approvals import only the leaves, the records, tools and events: never the driver",
        files=("loopctl/approvals/*",),
        allowed=(
            "loopctl.approvals", "loopctl.errors", "loopctl.messages", "loopctl.frozen", "loopctl.text",
            "loopctl.timeouts", "loopctl.records", "loopctl.tools", "loopctl.events",
        ),
    ),
    Rule(
        "typed output is pure: the leaves, configs, the tools' schema machinery and itself",
        files=("loopctl/output/*",),
        allowed=(
            "loopctl.errors", "loopctl.messages", "loopctl.output", "loopctl.machine.steps", "loopctl.text",
            "loopctl.config", "loopctl.checks",
            "loopctl.tools.schema", "loopctl.tools.schemacheck", "loopctl.tools.validation", "loopctl.tools.docstrings",
        ),
        forbidden=("threading", "time", "requests", "logging", "socket", "os", "asyncio"),
    ),
    Rule(
        "configs import only the leaves",
        files=("loopctl/config.py",),
        allowed=("loopctl.errors", "loopctl.messages", "loopctl.checks", "loopctl.timeouts"),
    ),
    Rule(
        "records import only the leaves and configs",
        files=("loopctl/records.py",),
        allowed=(
            "loopctl.errors", "loopctl.messages", "loopctl.config", "loopctl.approvals.values", "loopctl.frozen",
            "loopctl.text",
        ),
    ),
    Rule(
        "the events package (events, observers, hooks) imports only the leaves and itself",
        files=("loopctl/events/*",),
        allowed=("loopctl.errors", "loopctl.messages", "loopctl.text", "loopctl.events"),
    ),
    Rule(
        "the old observer and hook paths only re-export the events package",
        files=("loopctl/observers/*", "loopctl/hooks/*"),
        allowed=("loopctl.events",),
    ),
    Rule(
        "providers, tools and context never import the driver or the machine",
        files=LOWER_LAYERS,
        # ``loopctl`` itself is the facade, which imports the driver.
        forbidden=("loopctl.driver", "loopctl.machine", "loopctl.hosting", "loopctl.demo"),
    ),
    Rule(
        "providers, tools and context never import the facade (it imports the driver)",
        files=LOWER_LAYERS,
        allowed=("loopctl.",),  # submodules only, never bare ``loopctl``
    ),
    Rule(
        "session stores import only the leaves and themselves (the driver ties them to a loop)",
        files=("loopctl/sessions/*",),
        allowed=("loopctl.errors", "loopctl.messages", "loopctl.checks", "loopctl.timeouts", "loopctl.sessions"),
    ),
    Rule(
        "the Celery package drives runs through their handles: never the machine, the demo or MCP",
        files=("loopctl/contrib/celery/*",),
        forbidden=("loopctl.machine", "loopctl.demo", "loopctl.testing", "loopctl.contrib.mcp"),
    ),
    Rule(
        "the Celery package imports submodules, never the facade (it would load every integration's peers)",
        files=("loopctl/contrib/celery/*",),
        allowed=("loopctl.",),
    ),
    Rule(
        "the library never imports an integration (users do); only the demo's MCP servers use one",
        files=("loopctl/*",),
        forbidden=("loopctl.contrib",),
        exempt=("loopctl/demo/mcp_servers.py",),
        exempt_globs=("loopctl/contrib/*",),
    ),
    Rule(
        "library code never imports loopctl.testing",
        files=("loopctl/*",),
        forbidden=("loopctl.testing",),
        exempt=("loopctl/testing.py", "loopctl/demo/cli.py", "loopctl/demo/model.py"),
    ),
    Rule(
        "only the demo app and ``python -m loopctl`` import the demo app",
        files=("loopctl/*",),
        forbidden=("loopctl.demo",),
        exempt=("loopctl/__main__.py",),
        exempt_globs=("loopctl/demo/*",),
    ),
)


class Import(NamedTuple):
    module: str
    line: int
    text: str


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(dotted: str) -> bool:
    base = ROOT.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports_of(source: str, modname: str, is_package: bool) -> Iterator[Import]:
    """Every module an import statement in ``source`` refers to (resolved)."""
    tree = ast.parse(source)
    package = modname if is_package else modname.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(alias.name, node.lineno, f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                if node.level > 1:
                    base_parts = base_parts[: -(node.level - 1)]
                base = ".".join(base_parts)
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            names = ", ".join(a.name for a in node.names)
            text = f"from {'.' * node.level}{node.module or ''} import {names}"
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                # ``from loopctl import errors`` imports the module loopctl.errors
                yield Import(sub if is_module(sub) else target, node.lineno, text)


def matches(module: str, prefix: str) -> bool:
    if prefix.endswith("."):
        return module.startswith(prefix)
    return module == prefix or module.startswith(prefix + ".")


def violations(rule: Rule, rel: str, imports: list[Import]) -> list[str]:
    found = []
    for imp in imports:
        bad = any(matches(imp.module, p) for p in rule.forbidden)
        if rule.allowed is not None and matches(imp.module, "loopctl"):
            bad = bad or not any(matches(imp.module, p) for p in rule.allowed)
        if bad:
            found.append(f"{rel}:{imp.line}: `{imp.text}` ({imp.module})")
    return found


def files_for(rule: Rule) -> list[Path]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if (
            any(fnmatch.fnmatch(rel, g) for g in rule.files)
            and rel not in rule.exempt
            and not any(fnmatch.fnmatch(rel, g) for g in rule.exempt_globs)
        ):
            out.append(path)
    return out


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_layering_rule_holds(rule: Rule) -> None:
    files = files_for(rule)
    assert files, f"rule {rule.name!r} matches no file: its globs are stale"
    problems: list[str] = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        imports = list(imports_of(path.read_text(encoding="utf-8"), module_name(path),
                                  path.name == "__init__.py"))
        problems += violations(rule, rel, imports)
    assert not problems, f"layering rule broken: {rule.name}\n  " + "\n  ".join(problems)


# -- the checker itself catches what it must ----------------------------------------------

SNEAKY = '''
from __future__ import annotations
from typing import TYPE_CHECKING
from loopctl import errors
from . import steps
if TYPE_CHECKING:
    from ..driver.loop import BareLoop
def later():
    import threading
    from loopctl.providers import base
    from loopctl import BareLoop
'''


def test_checker_resolves_relative_lazy_and_type_checking_imports() -> None:
    found = {i.module for i in imports_of(SNEAKY, "loopctl.machine.machine", False)}
    assert {
        "loopctl.errors",
        "loopctl.machine.steps",
        "loopctl.driver.loop",
        "threading",
        "loopctl.providers.base",
        "loopctl",  # a name from the facade
    } <= found


def test_checker_reports_file_line_and_import_text() -> None:
    imports = list(imports_of(SNEAKY, "loopctl.machine.machine", False))
    brain = [r for r in RULES if r.files == ("loopctl/machine/*",)]
    problems = [p for rule in brain for p in violations(rule, "loopctl/machine/x.py", imports)]
    text = "\n".join(problems)
    assert "loopctl/machine/x.py:9: `import threading` (threading)" in text
    assert "`from ..driver.loop import BareLoop` (loopctl.driver.loop)" in text
    assert "`from loopctl.providers import base`" in text
    assert "`from loopctl import BareLoop` (loopctl)" in text
    assert "steps" not in text and "errors" not in text  # allowed imports pass


def test_the_package_rules_refuse_the_driver() -> None:
    sneaky = "from loopctl.driver.admission import Admitted\nfrom loopctl.events import RunEnd\n"
    for package, rel in (("loopctl.approvals.gate", "loopctl/approvals/gate.py"),
                         ("loopctl.events.types", "loopctl/events/types.py")):
        imports = list(imports_of(sneaky, package, False))
        rules = [r for r in RULES if any(fnmatch.fnmatch(rel, g) for g in r.files)]
        assert rules, rel
        problems = [p for rule in rules for p in violations(rule, rel, imports)]
        assert any("loopctl.driver.admission" in p for p in problems), rel
        assert not any("loopctl.events)" in p for p in problems), rel  # both may import events


# -- no import cycle between any two modules -------------------------------------------------


def import_graph() -> dict[str, set[str]]:
    """Module -> the loopctl modules it imports (every import, type-only included)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        mod = module_name(path)
        source = path.read_text(encoding="utf-8")
        graph[mod] = {
            imp.module
            for imp in imports_of(source, mod, path.name == "__init__.py")
            if matches(imp.module, "loopctl") and imp.module != mod
        }
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    group.append(top)
                    if top == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_no_two_modules_import_each_other_even_round_a_circle() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles (type-only imports count):\n  " + "\n  ".join(
        " <-> ".join(group) for group in found
    )


def test_cycle_finder_sees_a_type_only_circle() -> None:
    graph = {
        "loopctl.driver.loop": {"loopctl.driver.turns"},
        "loopctl.driver.turns": {"loopctl.driver.llm_turn"},
        "loopctl.driver.llm_turn": {"loopctl.driver.loop"},  # under TYPE_CHECKING
        "loopctl.errors": set(),
    }
    assert cycles(graph) == [["loopctl.driver.llm_turn", "loopctl.driver.loop", "loopctl.driver.turns"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
