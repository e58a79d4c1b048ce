"""The in-place setters of earlier releases, kept for one release.

A loop is configured with its chained ``with_*`` calls. Each name below
still works: it warns (``DeprecationWarning``, naming the replacement) and
calls its ``with_*`` form, returning None as it used to.
"""

from __future__ import annotations

import warnings
from typing import Callable

DEPRECATED_SETTERS = {
    name: "with_" + name[4:]
    for name in (
        "set_request_options", "set_token_counter", "set_context_manager", "set_hook_executor",
        "set_health_registry", "set_reflector", "set_recovery_strategy", "set_pipeline", "set_fallback",
        "set_loop_detector", "set_convergence_detector", "set_approval",
    )
}


def old_setter(owner: object, name: str) -> Callable[[object], None]:
    """``owner``'s deprecated setter ``name`` (it warns now, once per lookup).

    Raises:
        AttributeError: ``name`` is no such setter (names the attribute).
    """
    target = DEPRECATED_SETTERS.get(name)
    if target is None:
        raise AttributeError(f"{type(owner).__name__!r} object has no attribute {name!r}")
    warnings.warn(
        f"BareLoop.{name}() is deprecated; use {target}() (it returns the loop)", DeprecationWarning, stacklevel=3
    )
    configure = getattr(owner, target)

    def setter(value: object) -> None:
        configure(value)

    return setter


__all__ = ["DEPRECATED_SETTERS", "old_setter"]
