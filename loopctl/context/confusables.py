"""Folding look-alike letters to Latin, so a phrase spelled with them is still that phrase.

A small skeleton in the spirit of Unicode TR39: each character is
compatibility-decomposed (NFKD: fullwidth and styled letters become plain
ones), its marks (nonspacing and enclosing, whatever their combining class)
and the code points Unicode calls default-ignorable (drawn as nothing:
joiners, variation selectors, Hangul fillers, tags) are dropped, and
Cyrillic and Greek letters that look like Latin ones map to those (``а`` ->
``a``, ``ν`` -> ``v``). The table covers the Latin alphabet's look-alikes in
those two scripts; it is for matching only, never for showing text.
``fold`` keeps, for every folded character, the index of the character it
came from, so a match in the folded text names a span of the original.
"""

from __future__ import annotations

import bisect
import unicodedata

# Pairs of (look-alikes, the Latin letter they pass for), lower then upper case.
_PAIRS = (
    ("аɑα", "a"), ("АΑ", "A"),
    ("ьβ", "b"), ("ЬВΒ", "B"),
    ("сϲ", "c"), ("СϹ", "C"),
    ("ԁ", "d"), ("Ԁ", "D"),
    ("еєε", "e"), ("ЕЄΕ", "E"),
    ("ғ", "f"), ("ҒϜ", "F"),
    ("ɡ", "g"), ("Ԍ", "G"),
    ("һ", "h"), ("НΗ", "H"),
    ("іıιї", "i"), ("ІΙЇ", "I"),
    ("ј", "j"), ("ЈͿ", "J"),
    ("кκ", "k"), ("КΚ", "K"),
    ("ӏ", "l"), ("Ӏ", "L"),
    ("м", "m"), ("МΜ", "M"),
    ("пη", "n"), ("ΝП", "N"),
    ("оοσ", "o"), ("ОΟ", "O"),
    ("рρ", "p"), ("РΡ", "P"),
    ("ԛ", "q"), ("Ԛ", "Q"),
    ("гᴦ", "r"), ("Г", "R"),
    ("ѕ", "s"), ("Ѕ", "S"),
    ("тτ", "t"), ("ТΤ", "T"),
    ("υ", "u"),
    ("νѵ", "v"), ("Ѵ", "V"),
    ("ԝωш", "w"), ("ԜШ", "W"),
    ("хχ", "x"), ("ХΧ", "X"),
    ("уγү", "y"), ("УΥҮ", "Y"),
    ("ᴢ", "z"), ("Ζ", "Z"),
)

_TABLE = {ord(ch): latin for chars, latin in _PAIRS for ch in chars}

# Unicode's Default_Ignorable_Code_Point ranges (DerivedCoreProperties.txt,
# reserved code points included, as the property does): a renderer draws
# them as nothing, so one inside a phrase hides it from a match and not from
# a reader. Neither the category nor the combining class finds them all: the
# Hangul fillers are letters, the variation selectors and the grapheme
# joiner marks of combining class 0. Listed here, not read from
# ``unicodedata``, so every Python version drops the same ones.
_IGNORABLE = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
    (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
    (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF),
)
_IGNORABLE_STARTS = tuple(start for start, _ in _IGNORABLE)
# Nonspacing and enclosing marks, whatever their combining class (a class-0
# mark is still drawn on the letter before it, or not at all).
_MARKS = frozenset({"Mn", "Me"})


def _is_ignorable(ch: str) -> bool:
    """True when ``ch`` is a default-ignorable code point (drawn as nothing)."""
    cp = ord(ch)
    i = bisect.bisect_right(_IGNORABLE_STARTS, cp) - 1
    return i >= 0 and cp <= _IGNORABLE[i][1]


def _dropped(ch: str) -> bool:
    return _is_ignorable(ch) or unicodedata.combining(ch) != 0 or unicodedata.category(ch) in _MARKS


def fold(text: str) -> tuple[str, list[int]]:
    """``text``'s skeleton and, for each of its characters, the index it came from in ``text``.

    ASCII passes through as itself; any other character is NFKD-decomposed,
    stripped of marks and default-ignorable code points, and mapped through
    the look-alike table.
    """
    if text.isascii():
        return text, list(range(len(text)))
    out: list[str] = []
    origin: list[int] = []
    for i, ch in enumerate(text):
        if ch.isascii():
            out.append(ch)
            origin.append(i)
            continue
        for part in unicodedata.normalize("NFKD", ch):
            if _dropped(part):
                continue
            out.append(_TABLE.get(ord(part), part))
            origin.append(i)
    return "".join(out), origin


__all__ = ["fold"]
