"""Sub-agent paths: a sub-agent's name, or names joined by "/" for one deeper down (``"research/search"``)."""

from __future__ import annotations

from loopctl.checks import shown
from loopctl.errors import ConfigError


def join_path(name: str, sub: str) -> str:
    """``name`` prefixed to a sub-agent path (``"research"`` + ``"search"``)."""
    return f"{name}/{sub}" if sub else name


def check_path(to: object) -> str:
    """``to`` as a sub-agent path: a name, or names joined by "/" (``"research/search"``).

    Every ``steer(..., to=)`` checks its path here, in-process and across
    machines alike, before it looks for a run in flight.

    Raises:
        ConfigError: (a ``ValueError``) not a str, empty, or with an empty
            segment (``"a//b"``, ``"/a"``, ``"a/"``).
    """
    if not isinstance(to, str) or not to or any(not seg for seg in to.split("/")):
        raise ConfigError(
            f"steer to= must be a sub-agent name or a path like 'research/search', got {shown(to)}"
        )
    return to


__all__ = ["check_path", "join_path"]
