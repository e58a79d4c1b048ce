"""Configured durations: the one check every user-set timeout and wait passes.

A duration is a finite number of seconds (``bool`` is not a number);
``NaN``, infinities, negatives (and zero, where zero makes no sense) are
refused at configuration with ``ConfigError`` (a ``ValueError``) naming the
field and the value. A finite value beyond what the platform can wait
(``threading.TIMEOUT_MAX``, about 292 years) is clamped to it, so no wait
on a ``Condition`` or ``Event`` can raise ``OverflowError`` later. Use None
(where allowed) to wait for ever. ``bounded`` clamps a computed wait the
same way at the waiting site.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Optional

from loopctl.errors import ConfigError

#: The longest wait the platform accepts, in seconds.
TIMEOUT_MAX = float(threading.TIMEOUT_MAX)


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
    ok = not isinstance(value, bool) and isinstance(value, (int, float))
    if ok:
        try:
            number = float(value)
        except OverflowError:  # an int too large for a float: far beyond any wait
            return TIMEOUT_MAX
        ok = not math.isnan(number) and number != math.inf and (number > 0 or (zero and number == 0))
    if not ok:
        kind = "number of seconds >= 0" if zero else "positive number of seconds"
        hint = "finite; None for no limit" if optional else "finite"
        raise ConfigError(f"{field} must be a {kind}, got {value!r:.80} ({hint})")
    return min(number, TIMEOUT_MAX)


def required_seconds(value: object, field: str, *, zero: bool = False) -> float:
    """``seconds`` for a duration that must be given (None refused).

    Raises:
        ConfigError: not a finite number in range (naming ``field`` and ``value``).
    """
    out = seconds(value, field, optional=False, zero=zero)
    assert out is not None
    return out


def clamp(value: object) -> object:
    """A converter: a finite number beyond ``TIMEOUT_MAX`` becomes ``TIMEOUT_MAX``; anything else as given."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    try:
        number = float(value)
    except OverflowError:
        return TIMEOUT_MAX
    return TIMEOUT_MAX if math.isfinite(number) and number > TIMEOUT_MAX else value


def bounded(wait: Optional[float]) -> Optional[float]:
    """A computed wait made safe for ``Condition.wait`` / ``Event.wait`` (None stays None)."""
    if wait is None:
        return None
    return min(max(0.0, wait), TIMEOUT_MAX)


__all__ = ["TIMEOUT_MAX", "bounded", "clamp", "required_seconds", "seconds"]
