"""Configured values: the one check every user-set count, number and flag passes.

A bad value raises ``ConfigError`` (a ``ValueError``) naming the field and
the value. ``bool`` is neither an int nor a number; a number is finite
(NaN, infinities and an int past the float range are refused). Durations
are checked by ``loopctl.timeouts`` on the same terms. A message shows the
value through ``shown``: bounded, and never built in full, so an int of
thousands of digits (whose ``repr`` Python refuses to build) still yields
a message that names the field.
"""

from __future__ import annotations

import math
import reprlib
from typing import Optional

from loopctl.errors import ConfigError
from loopctl.text import masked_head

#: The most characters of a value a message shows.
SHOWN_LIMIT = 80

# Past 256 bits (about 77 digits) an int is shown by its sign and its number
# of digits: its digits would fill the message, and past 4,300 Python
# refuses to write them.
_BIG_INT_BITS = 256


def _digits(x: int) -> int:
    estimate = int(math.log10(abs(x))) + 1
    # log10 rounds up just below a power of ten (10**k - 1 gives k.0).
    return estimate - 1 if abs(x) < 10 ** (estimate - 1) else estimate


class _Shown(reprlib.Repr):
    """``reprlib`` with every limit at ``SHOWN_LIMIT``, big ints counted, strings cut at the head."""

    def __init__(self) -> None:
        super().__init__()
        self.maxstring = self.maxother = self.maxlong = SHOWN_LIMIT

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() <= _BIG_INT_BITS:
            return repr(x)
        return f"{'-' if x < 0 else ''}<int of {_digits(x)} digits>"

    def repr_str(self, x: str, level: int) -> str:
        # Masked before it is cut: a key the cut would split is hidden whole.
        return repr(masked_head(x, self.maxstring))

    def repr_instance(self, x: object, level: int) -> str:
        # Any other object (bytes, a client holding its key): its repr masked, then cut at the head.
        return masked_head(repr(x), self.maxother)


_SHOWN = _Shown()


def shown(value: object) -> str:
    """``repr(value)`` for a message: at most ``SHOWN_LIMIT`` characters, cut before it is built."""
    try:
        text = _SHOWN.repr(value)
    except Exception:  # a repr that raises: the value can only be named by its type
        text = f"<{type(value).__name__}>"
    return masked_head(text, SHOWN_LIMIT)


def as_float(value: object) -> Optional[float]:
    """A real number as a float, an int past the float range as an infinity of its sign; None if not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def integer(value: object, field: str, low: int = 0, high: Optional[int] = None) -> int:
    """``value`` if it is an int between ``low`` and ``high`` (None: no upper bound).

    Raises:
        ConfigError: not an int in range (the message names ``field`` and ``value``).
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"between {low} and {high}"
        raise ConfigError(f"{field} must be an int {bound}, got {shown(value)}")
    return value


def number(
    value: object, field: str, low: Optional[float] = None, high: Optional[float] = None, *, above: bool = False
) -> float:
    """``value`` as a float if it is a finite number between ``low`` and ``high`` (None: unbounded).

    Args:
        above: ``low`` itself is refused (the number must be ``> low``).

    Raises:
        ConfigError: not a finite number in range (the message names ``field`` and ``value``).
    """
    out = as_float(value)
    if (
        out is None
        or not math.isfinite(out)
        or (low is not None and (out < low or (above and out == low)))
        or (high is not None and out > high)
    ):
        bounds = [] if low is None else [f"{'>' if above else '>='} {low}"]
        bounds += [] if high is None else [f"<= {high}"]
        kind = " ".join(["a finite number", " and ".join(bounds)]).strip()
        raise ConfigError(f"{field} must be {kind}, got {shown(value)}")
    return out


def flag(value: object, field: str) -> bool:
    """``value`` if it is True or False.

    Raises:
        ConfigError: anything else (the message names ``field`` and ``value``).
    """
    if not isinstance(value, bool):
        raise ConfigError(f"{field} must be True or False, got {shown(value)}")
    return value


__all__ = ["SHOWN_LIMIT", "as_float", "flag", "integer", "number", "shown"]
