"""The offline demo model's expressions: trees, numbers, and the task parser.

``Parser`` reads a task sentence ("What is 12 + 30?", "the population of
France plus the population of Spain", "multiply that by 3" after an
answer) into an expression tree of ``Num``, ``Text``, ``Lookup``, ``Bin``
and ``Failure`` nodes. Numbers stay exact: whole numbers are ints at any
size. Pure functions and frozen values: no IO, no state.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from typing import Any, Optional, Union

import attrs

Number = Union[int, float]

# Whole numbers read as exact ints; past this many digits Python refuses
# int(str) (CVE-2020-10735), so such a number is read as a float.
_INTEGER = re.compile(r"[-+]?\d{1,4000}")
# "that" / "the result" in a new question: the previous answer's number.
_PREVIOUS = re.compile(r"\b(?:that|this|the\s+(?:previous\s+|last\s+)?(?:result|answer))\b")
# The number a final answer ends with: "... = 20." or "... is 68400000."
_FIELD_WORDS = {"capital": "capital", "population": "population", "area": "area_km2",
                "currency": "currency", "continent": "continent"}


# -- expression trees ----------------------------------------------------------


@attrs.frozen
class Num:
    """A number (a literal or a tool's numeric result)."""

    value: Number


@attrs.frozen
class Text:
    """A non-numeric fact a tool returned."""

    value: str


@attrs.frozen
class Lookup:
    """``lookup(name, field)`` still to be asked."""

    name: str
    field: str


@attrs.frozen
class Bin:
    """A binary operation: ``op`` is one of ``+ - * /``."""

    op: str
    left: Node
    right: Node


@attrs.frozen
class Failure:
    """A tool error that ends the computation."""

    tool: str
    output: str


Node = Union[Num, Text, Lookup, Bin, Failure]
Signature = tuple[Any, ...]


def normalize(value: Number) -> Number:
    """An integral float below 1e16 as an int; everything else unchanged."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return int(value)
    return value


def fmt(value: Number) -> str:
    """A number as the model writes it (integral values without a decimal point)."""
    value = normalize(value)
    return str(value) if isinstance(value, int) else f"{value:.12g}"


def to_number(text: str) -> Optional[Number]:
    """A tool result read as a number, or None when it is not one.

    Whole numbers stay exact ints at any size (a float would turn
    ``99999999999999999999`` into ``1e+20``).
    """
    text = text.strip().replace(",", "")
    if _INTEGER.fullmatch(text):
        return int(text)
    try:
        value = float(text)
    except ValueError:
        return None
    return normalize(value) if math.isfinite(value) else None


def display(node: Node, parent: int = 0) -> str:
    """An expression as text, with only the parentheses it needs."""
    if isinstance(node, Num):
        return fmt(node.value)
    if isinstance(node, Text):
        return node.value
    if isinstance(node, Lookup):
        return f"the {node.field.replace('_km2', '')} of {node.name}"
    if isinstance(node, Failure):
        return f"<{node.tool} failed>"
    prec = 1 if node.op in "+-" else 2
    right_prec = prec + 1 if node.op in "-/" else prec
    text = f"{display(node.left, prec)} {node.op} {display(node.right, right_prec)}"
    return f"({text})" if prec < parent else text


# -- parsing a task ------------------------------------------------------------


class Parser:
    """Reads a task sentence into an expression tree (None when it is not one).

    Args:
        names: the country names the ``lookup`` tool accepts (from its schema).
    """

    _OPERAND = r"(-?\d+(?:\.\d+)?|@\d+|\([^()]*\))"
    _FILLER = re.compile(
        r"\b(?:what|is|are|the|value|result|of|please|compute|calculate|evaluate|work|out|"
        r"tell|me|how|much|does|do|equal|equals|make|makes|give|find|can|could|would|you|"
        r"answer|get|i|need|to|know|now|instead|then|us|and|also|so|ok|okay|actually|rather|no|wait|hmm)\b"
    )

    def __init__(self, names: Sequence[str] = ()) -> None:
        self.names = {n.lower(): n for n in names}
        alts = "|".join(re.escape(n) for n in sorted(self.names, key=len, reverse=True))
        name_re = f"({alts})" if alts else r"([a-z]+)"
        fields = "|".join(_FIELD_WORDS)
        self._lookup_res = [
            (re.compile(rf"\b({fields})(?:\s+city)?\s+of\s+(?:the\s+)?{name_re}\b"), 1, 2),
            (re.compile(rf"\b{name_re}'s\s+({fields})\b"), 2, 1),
            (re.compile(rf"\bhow\s+many\s+people\s+(?:live|are|living)\s+in\s+{name_re}\b"), 0, 1),
        ]
        o = self._OPERAND
        self._word_ops = [
            (re.compile(rf"\bmultiply\s+{o}\s+(?:by|and|with)\s+{o}"), r"(\1 * \2)"),
            (re.compile(rf"\badd\s+{o}\s+(?:and|to|plus)\s+{o}"), r"(\1 + \2)"),
            (re.compile(rf"\bsubtract\s+{o}\s+from\s+{o}"), r"(\2 - \1)"),
            (re.compile(rf"\bdivide\s+{o}\s+by\s+{o}"), r"(\1 / \2)"),
            (re.compile(rf"\b(?:the\s+)?sum\s+of\s+{o}\s+and\s+{o}"), r"(\1 + \2)"),
            (re.compile(rf"\b(?:the\s+)?product\s+of\s+{o}\s+and\s+{o}"), r"(\1 * \2)"),
            (re.compile(rf"\b(?:the\s+)?difference\s+between\s+{o}\s+and\s+{o}"), r"(\1 - \2)"),
        ]

    def parse(self, sentence: str, previous: Optional[Number] = None) -> Optional[Node]:
        """The task's expression tree, or None when the sentence is not a task.

        Args:
            sentence: the user's text.
            previous: the previous answer, which "that" or "the result" names.
        """
        t = sentence.lower().replace("\u2019", "'")
        if previous is not None:
            t = _PREVIOUS.sub(f" ({fmt(previous)}) ", t)
        for a, b in (("\u00d7", "*"), ("\u00f7", "/"), ("\u2212", "-"), ("what's", "what is")):
            t = t.replace(a, b)
        t = re.sub(r"(?<=\d),(?=\d{3}\b)", "", t)
        lookups: list[Lookup] = []

        def place(m: re.Match[str], field_group: int, name_group: int) -> str:
            field = _FIELD_WORDS[m.group(field_group)] if field_group else "population"
            name = m.group(name_group)
            lookups.append(Lookup(self.names.get(name, name.title()), field))
            return f" @{len(lookups) - 1} "

        for rx, fg, ng in self._lookup_res:
            t = rx.sub(functools.partial(_call_place, place, fg, ng), t)
        changed = True
        while changed:
            changed = False
            for rx, repl in self._word_ops:
                t, n = rx.subn(repl, t)
                changed = changed or n > 0
        for words, sym in (
            (r"multiplied\s+by|times", "*"), (r"plus|added\s+to", "+"),
            (r"minus|less", "-"), (r"divided\s+by|over", "/"),
        ):
            t = re.sub(rf"\b(?:{words})\b", f" {sym} ", t)
        t = re.sub(r"(?<=[\d)])\s*x\s*(?=[-\d@(])", " * ", t)
        t = self._FILLER.sub(" ", t)
        t = re.sub(r"[?!,:;=]|(?<!\d)\.|\.(?!\d)", " ", t).strip()
        if not t or re.search(r"[a-z'\"]", t):
            return None
        tokens = re.findall(r"\d+(?:\.\d+)?|@\d+|[-+*/()]|\S", t)
        try:
            node, rest = self._expr(tokens, lookups)
        except (IndexError, ValueError):
            return None
        return node if not rest else None

    def _expr(self, toks: list[str], lk: list[Lookup]) -> tuple[Node, list[str]]:
        node, toks = self._term(toks, lk)
        while toks and toks[0] in "+-":
            op, (right, toks) = toks[0], self._term(toks[1:], lk)
            node = Bin(op, node, right)
        return node, toks

    def _term(self, toks: list[str], lk: list[Lookup]) -> tuple[Node, list[str]]:
        node, toks = self._factor(toks, lk)
        while toks and toks[0] in ("*", "/"):
            op, (right, toks) = toks[0], self._factor(toks[1:], lk)
            node = Bin(op, node, right)
        return node, toks

    def _factor(self, toks: list[str], lk: list[Lookup]) -> tuple[Node, list[str]]:
        tok = toks[0]
        if tok == "-":
            inner, rest = self._factor(toks[1:], lk)
            if isinstance(inner, Num):
                return Num(-inner.value), rest
            return Bin("*", Num(-1), inner), rest
        if tok == "(":
            node, rest = self._expr(toks[1:], lk)
            if not rest or rest[0] != ")":
                raise ValueError("unbalanced parentheses")
            return node, rest[1:]
        if tok.startswith("@"):
            return lk[int(tok[1:])], toks[1:]
        value = to_number(tok)
        if value is None:
            raise ValueError(f"unexpected token {tok!r}")
        return Num(value), toks[1:]


def _call_place(place: Any, fg: int, ng: int, m: re.Match[str]) -> str:
    return str(place(m, fg, ng))


__all__ = ["Bin", "Failure", "Lookup", "Node", "Num", "Number", "Parser", "Signature", "Text", "display", "fmt", "normalize", "to_number"]
