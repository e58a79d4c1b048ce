"""Docstring reading for ``@tool``: the description and per-parameter text.

Google style (``Args:`` / ``Arguments:`` / ``Parameters:`` / ``Attributes:``
sections, ``name: text`` or ``name (type): text`` with indented
continuation lines) and Sphinx style (``:param name: text``) are read.
The description is everything before the first section header.

The texts go to the model as they are read, so reStructuredText markup
that only a documentation tool understands is turned into plain Markdown
first: an inline literal ````value```` becomes `` `value` ``, and a role
such as ``:class:`Path``` becomes `` `Path` ``.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from typing import Optional

_SECTIONS = (
    "args", "arguments", "parameters", "params", "attributes", "returns", "return",
    "raises", "yields", "examples", "example", "note", "notes", "see also", "warning",
    "warnings", "todo",
)
_HEADER = re.compile(r"^\s*([A-Za-z][A-Za-z ]*):\s*$")
_ENTRY = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SPHINX = re.compile(r"^\s*:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")
_LITERAL = re.compile(r"``(?=\S)(.+?)(?<=\S)``")
_ROLE = re.compile(r":[a-z][\w.+-]*:`~?([^`]+)`")


def plain(text: str) -> str:
    """``text`` with reStructuredText inline literals and roles as Markdown code."""
    return _ROLE.sub(r"`\1`", _LITERAL.sub(r"`\1`", text))


def _is_header(line: str) -> bool:
    m = _HEADER.match(line)
    return m is not None and m.group(1).strip().lower() in _SECTIONS


def description(doc: Optional[str]) -> str:
    """The text before the first section header (or ``:param``), stripped."""
    if not doc:
        return ""
    lines = inspect.cleandoc(doc).splitlines()
    kept: list[str] = []
    for line in lines:
        if _is_header(line) or line.lstrip().startswith(":param") or line.lstrip().startswith(":return"):
            break
        kept.append(line)
    return plain("\n".join(kept).strip())


def parse_args_section(
    doc: Optional[str], sections: Sequence[str] = ("Args", "Arguments", "Parameters", "Params")
) -> dict[str, str]:
    """Map parameter name to its description from the given section(s)."""
    if not doc:
        return {}
    wanted = {s.lower() for s in sections}
    lines = inspect.cleandoc(doc).splitlines()
    out: dict[str, str] = {}
    for line in lines:
        m = _SPHINX.match(line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    in_section = False
    base_indent = 0
    current: Optional[str] = None
    for line in lines:
        if _is_header(line):
            in_section = _HEADER.match(line).group(1).strip().lower() in wanted  # type: ignore[union-attr]
            base_indent = -1
            current = None
            continue
        if not in_section:
            continue
        if not line.strip():
            current = None
            continue
        indent = len(line) - len(line.lstrip())
        if base_indent < 0:
            base_indent = indent
        if indent <= base_indent:
            if indent < base_indent:
                in_section = False
                continue
            m = _ENTRY.match(line.strip())
            if m:
                current = m.group(1).lstrip("*")
                out[current] = m.group(2).strip()
            else:
                current = None
        elif current is not None:
            out[current] = (out[current] + " " + line.strip()).strip()
    return {name: plain(text) for name, text in out.items()}


__all__ = ["description", "parse_args_section"]
