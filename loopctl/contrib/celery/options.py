"""Checking ``CeleryRunRegistry``'s arguments: each bad value is a ``ConfigError`` naming it.

That includes a run's ``output_type``, refused before queueing when a worker
could not rebuild it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Callable, Optional, Union

import attrs

from loopctl.checks import integer, shown
from loopctl.config import RunConfig, type_ref
from loopctl.errors import ConfigError
from loopctl.output import OutputSpec
from loopctl.timeouts import required_seconds

#: ``resume`` values: durable runs, or at most once (None means "never" too).
RESUME_MODES = ("on_worker_loss", "never")


def factory_spec(factory: Union[str, Callable[..., object]]) -> str:
    if isinstance(factory, str):
        module, sep, attr = factory.partition(":")
        if sep and module and attr:
            return factory
        raise ConfigError(f"loop_factory must look like 'pkg.module:factory', got {shown(factory)}")
    qual = getattr(factory, "__qualname__", "")
    module = getattr(factory, "__module__", "")
    if callable(factory) and module and qual and "<" not in qual:
        return f"{module}:{qual}"
    raise ConfigError(
        f"loop_factory must be 'pkg.module:factory' or a module-level function, got {shown(factory)}"
    )


def resume_mode_of(value: object) -> str:
    if value is None or value == "never":
        return ""
    if value == "on_worker_loss":
        return "on_worker_loss"
    raise ConfigError(f"CeleryRunRegistry resume must be None, 'on_worker_loss' or 'never', got {shown(value)}")


def max_resumes_of(value: object) -> int:
    return integer(value, "CeleryRunRegistry.max_resumes", 0)


def duration(name: str, value: object, minimum: float) -> float:
    """A finite number of seconds >= ``minimum`` (a huge one clamped, as every duration)."""
    field = f"CeleryRunRegistry.{name}"
    out = required_seconds(value, field, zero=True)
    if out < minimum:
        raise ConfigError(f"{field} must be a number of seconds >= {minimum}, got {shown(value)}")
    return out



def check_portable_output(output_type: object) -> None:
    """Refuse, before queueing, an answer type a worker could not rebuild."""
    if output_type is None:
        return
    OutputSpec.of(output_type)  # unsupported: a ConfigError here, not on a worker
    if not isinstance(output_type, Mapping) and type_ref(output_type) is None:
        raise ConfigError(
            f"output_type {shown(output_type)} cannot travel to a worker: use a class defined "
            "at module level (importable by the workers) or a JSON Schema dict"
        )


def checked_run(
    conversation: object, input: object, config: Optional[RunConfig], output_type: object
) -> Optional[RunConfig]:
    """The run's config (with ``output_type`` set) once the arguments are valid and portable to a worker."""
    if not isinstance(conversation, str) or not conversation:
        raise ConfigError(f"conversation must be a non-empty str, got {shown(conversation)}")
    if not isinstance(input, str):
        raise TypeError(f"run input must be a str, got {type(input).__name__}")
    if config is not None and not isinstance(config, RunConfig):
        raise ConfigError(f"config must be a RunConfig, got {type(config).__name__}")
    if output_type is not None:
        config = attrs.evolve(config or RunConfig(), output_type=output_type)
    if config is not None:
        check_portable_output(config.output_type)
    return config


__all__ = ["RESUME_MODES", "checked_run", "factory_spec", "duration", "max_resumes_of", "resume_mode_of"]
