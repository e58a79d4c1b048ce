"""Configured durations: the one check every user-set timeout and wait passes.

A duration is a finite number of seconds (``bool`` is not a number);
``NaN``, infinities, negatives (however large: an int past the float range
too) and zero (where zero makes no sense) are refused at configuration with
``ConfigError`` (a ``ValueError``) naming the field and the value. A finite
value beyond what the platform can wait (``threading.TIMEOUT_MAX``, about
292 years; a positive int past the float range too) is clamped to it, so
no wait on a ``Condition`` or ``Event`` can raise ``OverflowError`` later.
Use None (where allowed) to wait for ever. ``bounded`` clamps a computed
wait the same way at the waiting site.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Optional

from loopctl.checks import as_float, shown
from loopctl.errors import ConfigError

#: The longest wait the platform accepts, in seconds.
TIMEOUT_MAX = float(threading.TIMEOUT_MAX)

#: The longest busy wait SQLite takes, in seconds: it counts milliseconds in
#: a 32-bit int (about 24.8 days), and a longer wait would wrap to none at all.
SQLITE_TIMEOUT_MAX = (2**31 - 1) / 1000


def seconds(value: Any, field: str, *, optional: bool = True, zero: bool = False) -> Optional[float]:
    """``value`` checked as a duration and clamped to ``TIMEOUT_MAX``.

    Args:
        value: the configured number of seconds (or None when ``optional``).
        field: the field's name for the message (``"RunConfig.approval_timeout"``).
        optional: None is allowed (it means "no limit").
        zero: 0 is allowed.

    Raises:
        ConfigError: not a finite number in range (the message names
            ``field`` and ``value``).
    """
    if value is None and optional:
        return None
    number = as_float(value)
    if number == math.inf and isinstance(value, int):
        return TIMEOUT_MAX  # an int past the float range: far beyond any wait (a float infinity is refused)
    if number is None or not math.isfinite(number) or not (number > 0 or (zero and number == 0)):
        kind = "finite number of seconds >= 0" if zero else "finite positive number of seconds"
        hint = " (None for no limit)" if optional else ""
        raise ConfigError(f"{field} must be a {kind}, got {shown(value)}{hint}")
    return min(number, TIMEOUT_MAX)


def required_seconds(value: object, field: str, *, zero: bool = False) -> float:
    """``seconds`` for a duration that must be given (None refused).

    Raises:
        ConfigError: not a finite number in range (naming ``field`` and ``value``).
    """
    out = seconds(value, field, optional=False, zero=zero)
    assert out is not None
    return out


def sqlite_seconds(value: object, field: str) -> float:
    """``required_seconds`` (0 allowed) for a SQLite busy timeout, clamped to ``SQLITE_TIMEOUT_MAX``.

    Raises:
        ConfigError: not a finite number >= 0 (naming ``field`` and ``value``).
    """
    return min(required_seconds(value, field, zero=True), SQLITE_TIMEOUT_MAX)


def clamp(value: object) -> object:
    """A converter: a number beyond ``TIMEOUT_MAX`` becomes ``TIMEOUT_MAX`` (not a float infinity); the rest as given."""
    number = as_float(value)
    if number is None or not number > TIMEOUT_MAX or (number == math.inf and not isinstance(value, int)):
        return value  # the validator refuses what is not a duration: NaN, a float infinity, a negative
    return TIMEOUT_MAX


def bounded(wait: Optional[float]) -> Optional[float]:
    """A computed wait made safe for ``Condition.wait`` / ``Event.wait`` (None stays None)."""
    if wait is None:
        return None
    return min(max(0.0, wait), TIMEOUT_MAX)


__all__ = [
    "SQLITE_TIMEOUT_MAX", "TIMEOUT_MAX", "bounded", "clamp", "required_seconds", "seconds", "sqlite_seconds",
]
