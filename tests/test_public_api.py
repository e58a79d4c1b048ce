"""The public surface: SPEC's names are exported, and every exported name is documented.

The SPEC lists below are copied from SPEC §2 (the import block), §3 (the
machine) and §9 (context).
"""

from __future__ import annotations

import importlib
import inspect
import typing
from types import ModuleType
from typing import Any

import pytest

# SPEC §2, the import block, verbatim.
SPEC_LOOPCTL = [
    "BareLoop", "RunHandle", "Loop", "RunConfig", "SessionConfig", "ParallelDispatch",
    "Message", "Role", "TextPart", "ThinkingPart", "ToolCallPart", "ToolResultPart",
    "Usage", "StopReason", "ModelRequest", "ModelResponse", "RequestOptions",
    "Run", "Turn", "Session",
    "tool", "Tool", "ToolRegistry", "ToolContext", "ToolOutput", "ToolError",
    "Observer", "CancelSignal", "Steering",
    "LoopError", "Cancelled", "MaxTurnsExceeded", "FallbackExhausted",
    "ContextExceeded", "LoopDetected", "UserInputRequired", "ToolRecoveryExhausted",
    "ModelError", "RateLimitEscalation", "ConfigError", "LoopBusy",
    "RunRegistry", "RunStatus",
]
SPEC_TESTING = ["ScriptedClient", "reply", "call", "calls"]
SPEC_PROVIDERS = ["OpenAIClient", "AnthropicClient"]
# SPEC §3: "All these names import from loopctl.machine".
SPEC_MACHINE = [
    "LoopMachine", "MachinePolicy", "CallLLM", "CallTools", "Compact", "Done",
    "Completed", "MaxTurnsReached", "CancelledOutcome", "Failed", "PendingToolCall",
]
# SPEC §9, "Names".
SPEC_CONTEXT = [
    "ContextManager", "TruncatingCompactor", "SummarizingCompactor", "HeuristicTokenCounter",
    "ContextContributor", "GoalReminder", "MemoryEntry", "InMemoryStore", "SqliteMemoryStore",
]
# SPEC §15, sessions.
SPEC_SESSIONS = ["SQLiteSessionStore", "RedisSessionStore"]
SPEC_SESSION_ERRORS = ["SessionBusy", "SessionCorrupt"]

SPEC = {
    "loopctl": SPEC_LOOPCTL + SPEC_SESSION_ERRORS,
    "loopctl.testing": SPEC_TESTING,
    "loopctl.providers": SPEC_PROVIDERS,
    "loopctl.machine": SPEC_MACHINE,
    "loopctl.context": SPEC_CONTEXT,
    "loopctl.sessions": SPEC_SESSIONS,
}
PUBLIC_MODULES = list(SPEC)


def spec_params() -> list[Any]:
    params = []
    for module, names in SPEC.items():
        for name in names:
            params.append(pytest.param(module, name, id=f"{module}.{name}"))
    return params


@pytest.mark.parametrize(("module", "name"), spec_params())
def test_spec_name_is_exported(module: str, name: str) -> None:
    mod = importlib.import_module(module)
    assert name in getattr(mod, "__all__", ()), f"{module}.__all__ lacks {name!r}"
    assert hasattr(mod, name), f"{module} has no attribute {name!r}"


def test_spec_lists_have_no_duplicates() -> None:
    for module, names in SPEC.items():
        assert len(names) == len(set(names)), module


def exported() -> list[Any]:
    params = []
    for module in PUBLIC_MODULES:
        mod = importlib.import_module(module)
        for name in getattr(mod, "__all__", ()):
            params.append(pytest.param(module, name, id=f"{module}.{name}"))
    return params


def own_doc(obj: Any) -> str:
    """The object's own docstring: never one inherited from a base class."""
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__")
    else:
        doc = getattr(obj, "__doc__", None)
    return doc.strip() if isinstance(doc, str) else ""


def undocumented(obj: Any) -> list[str]:
    """What lacks a docstring in ``obj`` (empty when all is documented)."""
    origin = typing.get_origin(obj)
    if origin is typing.Union:
        # An alias is documented by its members.
        return [repr(a) for a in typing.get_args(obj) if not own_doc(a)]
    if inspect.isclass(obj) or inspect.isroutine(obj):
        return [] if own_doc(obj) else [repr(obj)]
    # An enum member or another instance: its class carries the doc.
    return [] if own_doc(type(obj)) else [repr(type(obj))]


@pytest.mark.parametrize(("module", "name"), exported())
def test_every_exported_name_exists_and_has_a_docstring(module: str, name: str) -> None:
    mod = importlib.import_module(module)
    assert hasattr(mod, name), f"{module}.__all__ names {name!r}, which does not exist"
    missing = undocumented(getattr(mod, name))
    assert not missing, f"{module}.{name} has no docstring: {missing}"


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_all_has_no_duplicates(module: str) -> None:
    names = list(importlib.import_module(module).__all__)
    dupes = sorted({n for n in names if names.count(n) > 1})
    assert not dupes, f"{module}.__all__ repeats {dupes}"


def test_every_facade_name_is_one_object_with_its_home_module() -> None:
    import loopctl

    for name in loopctl.__all__:
        obj = getattr(loopctl, name)
        home = getattr(obj, "__module__", None)
        if home and home.startswith("loopctl.") and not typing.get_origin(obj):
            assert getattr(importlib.import_module(home), name, obj) is obj, name


# The value types' public methods and properties are documented too (modules of
# the foundation; other areas' classes are covered at class level above).
FOUNDATION = ["loopctl.messages", "loopctl.config", "loopctl.records", "loopctl.errors",
              "loopctl.machine"]


def public_members(mod: ModuleType) -> list[tuple[str, Any]]:
    out = []
    for cls_name in getattr(mod, "__all__", ()):
        cls = getattr(mod, cls_name)
        if not inspect.isclass(cls):
            continue
        for attr, value in vars(cls).items():
            if attr.startswith("_"):
                continue
            func = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
            if inspect.isfunction(func):
                out.append((f"{cls_name}.{attr}", func))
    return out


@pytest.mark.parametrize("module", FOUNDATION)
def test_foundation_methods_and_properties_have_docstrings(module: str) -> None:
    mod = importlib.import_module(module)
    members = public_members(mod)
    assert members or module == "loopctl.errors"
    missing = [name for name, func in members if not own_doc(func)]
    assert not missing, f"{module}: undocumented public members {missing}"


# The documented import paths of moved modules keep naming the same objects.
ALIASES = [
    ("loopctl.observers", "loopctl.events"),
    ("loopctl.hooks", "loopctl.events.hooks"),
    ("loopctl.approvals", "loopctl.approvals.values"),
]


@pytest.mark.parametrize(("old", "home"), ALIASES, ids=[a for a, _ in ALIASES])
def test_an_old_import_path_names_the_same_objects_as_their_home(old: str, home: str) -> None:
    old_mod, home_mod = importlib.import_module(old), importlib.import_module(home)
    assert sorted(old_mod.__all__) == sorted(home_mod.__all__)
    moved = [name for name in home_mod.__all__ if getattr(old_mod, name) is not getattr(home_mod, name)]
    assert not moved, f"{old} names other objects than {home}: {moved}"
