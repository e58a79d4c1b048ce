"""Word wrapping for the terminal: rows break between words, never inside one.

The console wraps what it writes to a terminal itself instead of leaving it
to the terminal's margin, which cuts words ("plu" / "s") and can leave a
lone "." on a row of its own. It also keeps every row one column short of
the width, so it always knows which row the cursor is on. Style escapes
(``ESC[...m``) take no room; wide East Asian characters take two columns.
"""

from __future__ import annotations

import re
import unicodedata

_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _cell(ch: str) -> int:
    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in "WF" else 1


def visible_cells(text: str) -> int:
    """Columns ``text`` takes on a terminal (style escapes take none)."""
    return sum(_cell(ch) for ch in _ESCAPE.sub("", text))


def _cut(row: str, width: int) -> tuple[int, int]:
    """Where ``row`` passes ``width`` columns, and the last space at or before that point."""
    used, space, i = 0, -1, 0
    while i < len(row):
        m = _ESCAPE.match(row, i) if row[i] == "\x1b" else None
        if m is not None:
            i = m.end()
            continue
        ch = row[i]
        if ch == " ":
            space = i
        used += _cell(ch)
        if used > width:
            return i, space
        i += 1
    return len(row), space


def break_row(row: str, width: int) -> tuple[list[str], str]:
    """Split ``row`` into full rows of at most ``width`` columns, and the rest.

    A row ends at the last space that fits (the spaces at the break are
    dropped); only a word wider than a whole row is cut inside. Leading
    spaces (an indent) are never taken as a break.
    """
    width = max(width, 1)
    rows: list[str] = []
    while visible_cells(row) > width:
        cut, space = _cut(row, width)
        if space > 0 and row[:space].strip():
            head, row = row[:space], row[space:].lstrip(" ")
        else:
            head, row = row[:max(cut, 1)], row[max(cut, 1):]
        rows.append(head.rstrip(" "))
    return rows, row


__all__ = ["break_row", "visible_cells"]
