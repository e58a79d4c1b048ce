"""Type hints to JSON Schema, and the converters back to the declared types.

``compile_annotation(hint, where)`` runs once, at decoration time, and
returns a ``Compiled``: the property's JSON Schema and a converter that
turns a *validated* JSON value into the declared Python type (``int`` from
``3.0``, ``Enum`` members, ``attrs`` instances, recursively). Supported:
``str``, ``int``, ``float``, ``bool``, ``None``, ``Any``, ``Optional``/
``Union``, ``list[T]``/``List[T]``, ``dict[str, T]``/``Dict[str, T]``,
``Literal``, ``Enum`` subclasses, ``attrs`` classes, dataclasses and
``TypedDict`` classes (nested; recursive classes are refused). ``Annotated[T, "text"]`` adds a description. Any other
annotation raises ``ConfigError`` naming the place and the type, so a bad
tool fails when it is declared, not when the model first calls it.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import sys
import types
import typing
from collections.abc import Mapping
from typing import Any, Callable, Optional

import attrs

from loopctl.checks import shown
from loopctl.errors import ConfigError
from loopctl.tools.docstrings import parse_args_section
from loopctl.tools.validation import compile_schema

Converter = Callable[[Any], Any]

SUPPORTED = (
    "str, int, float, bool, None, Any, Optional[T], Union[...], list[T], dict[str, T], "
    "Literal[...], Enum subclasses, attrs classes, dataclasses, TypedDict classes"
)

#: ``json_default``'s answer for a default a schema cannot show.
NO_DEFAULT: object = object()

_UNION_TYPE = getattr(types, "UnionType", None)  # ``int | None`` on Python >= 3.10
_NoneType = type(None)


@attrs.frozen
class Compiled:
    """A compiled annotation: its schema and a converter (None means identity)."""

    schema: dict[str, Any]
    convert: Optional[Converter] = None
    optional: bool = False


def type_name(hint: object) -> str:
    """A readable name for an annotation (for error messages)."""
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__qualname__
    return repr(hint).replace("typing.", "")


def _to_int(v: object) -> object:
    return int(v) if isinstance(v, float) else v


def _to_float(v: object) -> object:
    return float(v) if isinstance(v, int) else v


def _enum_schema(cls: type[enum.Enum]) -> dict[str, Any]:
    values = [m.value for m in cls]
    schema: dict[str, Any] = {}
    kind = _uniform_type(values)
    if kind is not None:
        schema["type"] = kind
    schema["enum"] = values
    return schema


def _uniform_type(values: list[Any]) -> Optional[str]:
    if values and all(isinstance(v, str) for v in values):
        return "string"
    if values and all(isinstance(v, bool) for v in values):
        return "boolean"
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "integer"
    return None


def summary(doc: Optional[str]) -> str:
    """The first paragraph of a docstring, on one line ("" when there is none)."""
    if not doc:
        return ""
    text = inspect.cleandoc(doc).split("\n\n", 1)[0]
    return " ".join(text.split())


def compile_annotation(
    hint: Any, where: str, _seen: tuple[type, ...] = (), localns: Optional[Mapping[str, Any]] = None
) -> Compiled:
    """Compile one annotation; ``where`` names the place for error messages.

    ``localns`` resolves string hints inside nested attrs classes that name
    local classes (the decorator passes the defining scope's locals).

    Raises:
        ConfigError: the annotation is not supported.
    """
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Annotated:
        inner = compile_annotation(args[0], where, _seen, localns)
        notes = [a for a in args[1:] if isinstance(a, str)]
        if notes and "description" not in inner.schema:
            return Compiled({**inner.schema, "description": notes[0]}, inner.convert, inner.optional)
        return inner
    if hint is Any:
        return Compiled({})
    if hint is None or hint is _NoneType:
        return Compiled({"type": "null"}, None, True)
    if hint is str:
        return Compiled({"type": "string"})
    if hint is bool:
        return Compiled({"type": "boolean"})
    if hint is int:
        return Compiled({"type": "integer"}, _to_int)
    if hint is float:
        return Compiled({"type": "number"}, _to_float)
    if hint is list:
        return Compiled({"type": "array"})
    if hint is dict:
        return Compiled({"type": "object"})
    if origin is typing.Union or (_UNION_TYPE is not None and origin is _UNION_TYPE):
        return _compile_union(args, where, _seen, localns)
    if origin is typing.Literal:
        return _compile_literal(hint, args, where)
    if origin is list:
        return _compile_list(args, where, _seen, localns)
    if origin is dict:
        return _compile_dict(hint, args, where, _seen, localns)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        if not len(hint):
            raise ConfigError(f"{where}: enum {hint.__qualname__} has no members")
        cls = hint
        return Compiled(_enum_schema(cls), cls)
    if isinstance(hint, type) and attrs.has(hint):
        return _compile_attrs(hint, where, _seen, localns)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _compile_dataclass(hint, where, _seen, localns)
    if _is_typeddict(hint):
        return _compile_typeddict(hint, where, _seen, localns)
    raise ConfigError(f"{where}: unsupported type {type_name(hint)} (supported: {SUPPORTED})")


def _optional(conv: Converter) -> Converter:
    def convert(v: object) -> object:
        return None if v is None else conv(v)

    return convert


def _each_item(conv: Converter) -> Converter:
    def convert(v: Any) -> object:
        return [conv(x) for x in v]

    return convert


def _each_value(conv: Converter) -> Converter:
    def convert(v: Any) -> object:
        return {k: conv(x) for k, x in v.items()}

    return convert


def _compile_union(
    args: tuple[object, ...], where: str, seen: tuple[type, ...], localns: Optional[Mapping[str, Any]]
) -> Compiled:
    members = [a for a in args if a is not _NoneType]
    optional = len(members) < len(args)
    parts = [compile_annotation(a, where, seen, localns) for a in members]
    if len(parts) == 1 and optional:
        inner = parts[0]
        conv = inner.convert
        schema = {"anyOf": [inner.schema, {"type": "null"}]}
        if conv is None:
            return Compiled(schema, None, True)
        return Compiled(schema, _optional(conv), True)
    branches = [p.schema for p in parts] + ([{"type": "null"}] if optional else [])
    pairs = [(compile_schema(p.schema), p.convert) for p in parts]
    if all(c is None for _, c in pairs):
        return Compiled({"anyOf": branches}, None, optional)

    def convert(v: object) -> object:
        if v is None:
            return None
        for accept, conv in pairs:
            if accept(v):
                return v if conv is None else conv(v)
        return v

    return Compiled({"anyOf": branches}, convert, optional)


def _compile_literal(hint: object, args: tuple[object, ...], where: str) -> Compiled:
    for a in args:
        if not (a is None or isinstance(a, (str, int, float, bool))):
            raise ConfigError(
                f"{where}: Literal values must be str, int, float, bool or None, "
                f"got {shown(a)} in {type_name(hint)}"
            )
    values = list(args)
    schema: dict[str, Any] = {}
    kind = _uniform_type(values)
    if kind is not None:
        schema["type"] = kind
    schema["enum"] = values
    return Compiled(schema, None, None in values)


def _compile_list(
    args: tuple[object, ...], where: str, seen: tuple[type, ...], localns: Optional[Mapping[str, Any]]
) -> Compiled:
    if not args or args[0] is Any:
        return Compiled({"type": "array"})
    item = compile_annotation(args[0], f"{where} (list item)", seen, localns)
    conv = item.convert
    schema = {"type": "array", "items": item.schema}
    if conv is None:
        return Compiled(schema)
    return Compiled(schema, _each_item(conv))


def _compile_dict(
    hint: object, args: tuple[object, ...], where: str, seen: tuple[type, ...], localns: Optional[Mapping[str, Any]]
) -> Compiled:
    if not args:
        return Compiled({"type": "object"})
    if args[0] is not str:
        raise ConfigError(f"{where}: dict keys must be str (JSON object keys), got {type_name(hint)}")
    if args[1] is Any:
        return Compiled({"type": "object"})
    value = compile_annotation(args[1], f"{where} (dict value)", seen, localns)
    conv = value.convert
    schema = {"type": "object", "additionalProperties": value.schema}
    if conv is None:
        return Compiled(schema)
    return Compiled(schema, _each_value(conv))


def _attrs_field_docs(cls: type) -> dict[str, str]:
    return parse_args_section(cls.__doc__, ("Attributes", "Args", "Arguments", "Parameters"))


def _compile_attrs(
    cls: type, where: str, seen: tuple[type, ...], localns: Optional[Mapping[str, Any]]
) -> Compiled:
    seen, hints = _class_hints(cls, where, seen, localns)
    fields = []
    for f in attrs.fields(cls):
        if not f.init:
            continue
        hint = hints.get(f.name, f.type)
        if hint is None:
            raise ConfigError(f"{where}: field {cls.__qualname__}.{f.name} has no type annotation")
        factory = isinstance(f.default, attrs.Factory)  # type: ignore[arg-type]
        fields.append(
            _Field(
                getattr(f, "alias", None) or f.name.lstrip("_"),
                f.name,
                hint,
                f.metadata.get("description"),
                f.default is attrs.NOTHING,
                NO_DEFAULT if factory or f.default is attrs.NOTHING else json_default(f.default),
            )
        )
    return _compile_fields(cls, where, seen, localns, fields, cls)


def _is_typeddict(hint: object) -> bool:
    # typing.is_typeddict arrived in Python 3.10; the attributes say the same on 3.9.
    return (
        isinstance(hint, type)
        and issubclass(hint, dict)
        and hasattr(hint, "__total__")
        and hasattr(hint, "__required_keys__")
    )


def _class_hints(
    cls: type, where: str, seen: tuple[type, ...], localns: Optional[Mapping[str, Any]]
) -> tuple[tuple[type, ...], dict[str, Any]]:
    if cls in seen:
        raise ConfigError(f"{where}: class {cls.__qualname__} refers to itself (recursive schemas are not supported)")
    try:
        names = {**(localns or {}), **vars(cls), cls.__name__: cls}
        # Python 3.9 looks each class's module up in sys.modules and fails for a
        # class made by exec'd code (no module there); later Pythons use {}.
        globalns: Optional[dict[str, Any]] = None
        if sys.version_info < (3, 10) and any(b.__module__ not in sys.modules for b in cls.__mro__):
            globalns = {}
        hints = typing.get_type_hints(cls, globalns=globalns, localns=names, include_extras=True)
    except Exception as exc:
        raise ConfigError(f"{where}: cannot resolve the type hints of {cls.__qualname__}: {exc}") from exc
    return seen + (cls,), hints


def _object_schema(cls: type, props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    text = summary(cls.__doc__)
    if text:
        schema["description"] = text
    schema["properties"] = props
    schema["required"] = required
    schema["additionalProperties"] = False
    return schema


def _keyword_converter(
    build: Callable[..., object], convs: list[tuple[str, Optional[Converter]]]
) -> Converter:
    def convert(v: Mapping[str, Any]) -> object:
        kwargs = {}
        for key, conv in convs:
            if key in v:
                x = v[key]
                kwargs[key] = x if conv is None else conv(x)
        return build(**kwargs)

    return convert


@attrs.frozen
class _Field:
    """One field of a class answer or parameter type, whatever kind of class declared it."""

    key: str  # the JSON key, and the constructor's keyword
    name: str  # the attribute's name (for its hint, its docs and error messages)
    hint: object
    description: Optional[str]
    required: bool
    default: object  # NO_DEFAULT when the schema shows none


def _compile_fields(
    cls: type,
    where: str,
    seen: tuple[type, ...],
    localns: Optional[Mapping[str, Any]],
    fields: list[_Field],
    build: Callable[..., object],
) -> Compiled:
    docs = _attrs_field_docs(cls)
    props: dict[str, Any] = {}
    required: list[str] = []
    convs: list[tuple[str, Optional[Converter]]] = []
    for f in fields:
        c = compile_annotation(f.hint, f"{where} -> {cls.__qualname__}.{f.name}", seen, localns)
        prop = dict(c.schema)
        desc = f.description or docs.get(f.name) or docs.get(f.key)
        if desc and "description" not in prop:
            prop["description"] = desc
        if f.required:
            required.append(f.key)
        elif f.default is not NO_DEFAULT:
            prop["default"] = f.default
        props[f.key] = prop
        convs.append((f.key, c.convert))
    return Compiled(_object_schema(cls, props, required), _keyword_converter(build, convs))


def _compile_dataclass(
    cls: type, where: str, seen: tuple[type, ...], localns: Optional[Mapping[str, Any]]
) -> Compiled:
    seen, hints = _class_hints(cls, where, seen, localns)
    fields = [
        _Field(
            f.name,
            f.name,
            hints.get(f.name, f.type),
            f.metadata.get("description"),
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            NO_DEFAULT if f.default is dataclasses.MISSING else json_default(f.default),
        )
        for f in dataclasses.fields(cls)
        if f.init
    ]
    return _compile_fields(cls, where, seen, localns, fields, cls)


def _compile_typeddict(
    cls: type, where: str, seen: tuple[type, ...], localns: Optional[Mapping[str, Any]]
) -> Compiled:
    seen, hints = _class_hints(cls, where, seen, localns)
    optional_keys: frozenset[str] = getattr(cls, "__optional_keys__", frozenset())
    fields = []
    for key, hint in hints.items():
        origin = typing.get_origin(hint)
        # NotRequired[...] / Required[...] wrap the real type (3.11+).
        if origin is not None and getattr(origin, "_name", "") in ("NotRequired", "Required"):
            hint = typing.get_args(hint)[0]
        fields.append(_Field(key, key, hint, None, key not in optional_keys, NO_DEFAULT))
    return _compile_fields(cls, where, seen, localns, fields, dict)


def json_default(value: object) -> object:
    """A default as it appears in a schema, or ``NO_DEFAULT`` when not JSON-able."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, enum.Enum):
        return json_default(value.value)
    if isinstance(value, (list, tuple)):
        items = [json_default(v) for v in value]
        return NO_DEFAULT if any(i is NO_DEFAULT for i in items) else items
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        d = {k: json_default(v) for k, v in value.items()}
        return NO_DEFAULT if any(i is NO_DEFAULT for i in d.values()) else d
    return NO_DEFAULT


def resolve_hints(
    fn: Callable[..., object], where: str, localns: Optional[Mapping[str, Any]] = None
) -> dict[str, Any]:
    """``typing.get_type_hints`` with a clear error (string annotations included).

    Raises:
        ConfigError: a hint cannot be evaluated (an undefined name, or
            ``X | Y`` on Python < 3.10).
    """
    try:
        return typing.get_type_hints(fn, localns=dict(localns) if localns else None, include_extras=True)
    except TypeError as exc:
        hint = " (write Optional[X] / Union[X, Y]: 'X | Y' needs Python 3.10)" if sys.version_info < (3, 10) else ""
        raise ConfigError(f"{where}: cannot evaluate the type hints: {exc}{hint}") from exc
    except Exception as exc:
        raise ConfigError(f"{where}: cannot evaluate the type hints: {exc}") from exc


__all__ = ["Compiled", "NO_DEFAULT", "SUPPORTED", "compile_annotation", "json_default", "resolve_hints", "summary", "type_name"]
