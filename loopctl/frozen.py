"""Deeply immutable JSON-like values: what a tool call's arguments are once admitted.

A leaf: no loopctl imports. ``freeze`` makes a deep copy in which every
object is a ``FrozenDict`` and every array a ``FrozenList`` (subclasses of
``dict`` and ``list``, so equality, ``isinstance`` checks and ``json.dumps``
behave as for the plain value) that refuse every mutation with
``TypeError``. A frozen value can be shared by everyone who reads it (the
approval policy, the person, events, the audit record): nobody can change
what another sees. ``thaw`` gives a fresh plain deep copy (what a tool
receives, free to mutate its own copy).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

_SCALARS = (str, int, float, bool, type(None), bytes)


def _refuse(self: object, *args: object, **kwargs: object) -> NoReturn:
    raise TypeError(f"{type(self).__name__} is immutable: make a copy with thaw() or dict()/list() to change it")


class FrozenDict(dict):  # type: ignore[type-arg]
    """A ``dict`` whose contents (deeply frozen) can no longer change."""

    __slots__ = ()

    def __new__(cls, value: Any = (), /) -> FrozenDict:
        self = dict.__new__(cls)
        items = value.items() if isinstance(value, Mapping) else value
        dict.__init__(self, ((k, freeze(v)) for k, v in items))
        return self

    def __init__(self, value: Any = (), /) -> None:
        """Filled once, by ``__new__``: calling ``__init__`` again changes nothing."""

    __setitem__ = __delitem__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse
    __ior__ = _refuse

    def __reduce__(self) -> tuple[object, ...]:
        return (FrozenDict, (dict(self),))

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: object) -> FrozenDict:
        return self

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset((k, _hashable(v)) for k, v in self.items()))


class FrozenList(list):  # type: ignore[type-arg]
    """A ``list`` whose items (deeply frozen) can no longer change."""

    __slots__ = ()

    def __new__(cls, value: Iterable[Any] = (), /) -> FrozenList:
        self = list.__new__(cls)
        list.__init__(self, (freeze(v) for v in value))
        return self

    def __init__(self, value: Iterable[Any] = (), /) -> None:
        """Filled once, by ``__new__``: calling ``__init__`` again changes nothing."""

    __setitem__ = __delitem__ = _refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse
    __iadd__ = __imul__ = _refuse

    def __reduce__(self) -> tuple[object, ...]:
        return (FrozenList, (list(self),))

    def __copy__(self) -> FrozenList:
        return self

    def __deepcopy__(self, memo: object) -> FrozenList:
        return self

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(_hashable(v) for v in self))


def _hashable(v: object) -> object:
    try:
        hash(v)
    except TypeError:
        return id(v)
    return v


def freeze(value: object) -> object:
    """A deeply immutable copy of ``value`` (a frozen value is returned as it is).

    Mappings become ``FrozenDict``, lists and tuples ``FrozenList``; strings,
    numbers, booleans and None are kept; anything else is deep-copied (so a
    caller's object changed later changes nothing here).
    """
    if isinstance(value, _SCALARS) or type(value) in (FrozenDict, FrozenList):
        return value
    if isinstance(value, Mapping):
        return FrozenDict(value)
    if isinstance(value, (list, tuple)):
        return FrozenList(value)
    return copy.deepcopy(value)


def freeze_arguments(value: Mapping[str, Any]) -> FrozenDict:
    """``freeze`` for a call's arguments (always a mapping)."""
    if type(value) is FrozenDict:
        return value
    return FrozenDict(value)


def thaw(value: object) -> Any:
    """A fresh, plain, mutable deep copy of ``value`` (dicts and lists all the way down)."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, dict) or isinstance(value, Mapping):  # a dict (frozen ones too) skips the ABC check
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    return copy.deepcopy(value)


__all__ = ["FrozenDict", "FrozenList", "freeze", "freeze_arguments", "thaw"]
