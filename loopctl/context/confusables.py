"""Folding look-alike letters to Latin, so a phrase spelled with them is still that phrase.

A small skeleton in the spirit of Unicode TR39: each character is
compatibility-decomposed (NFKD: fullwidth and styled letters become plain
ones), its combining marks are dropped, and Cyrillic and Greek letters that
look like Latin ones map to those (``а`` -> ``a``, ``ν`` -> ``v``). The
table covers the Latin alphabet's look-alikes in those two scripts; it is
for matching only, never for showing text. ``fold`` keeps, for every folded
character, the index of the character it came from, so a match in the
folded text names a span of the original.
"""

from __future__ import annotations

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


def fold(text: str) -> tuple[str, list[int]]:
    """``text``'s skeleton and, for each of its characters, the index it came from in ``text``.

    ASCII passes through as itself; any other character is NFKD-decomposed,
    stripped of combining marks and mapped through the look-alike table.
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
            if unicodedata.combining(part):
                continue
            out.append(_TABLE.get(ord(part), part))
            origin.append(i)
    return "".join(out), origin


__all__ = ["fold"]
