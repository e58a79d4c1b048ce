"""The loop's read-only views and its two cross-thread seams.

Everything here only reads. ``cancel()``, ``is_cancelled()``,
``cancel_signal()`` and ``steering()`` are safe from any thread at any
time; the other accessors belong to the thread that owns the loop.
"""

from __future__ import annotations

from typing import Any, Optional

from loopctl.config import RunConfig, SessionConfig
from loopctl.driver.signals import CancelSignal, Steering
from loopctl.machine import LoopMachine, MachineState
from loopctl.messages import Message
from loopctl.records import Session
from loopctl.tools.registry import ToolRegistry


class ViewsMixin:
    """Accessors for ``BareLoop`` (mixed in; reads its private fields)."""

    _cancel: CancelSignal
    _steering: Steering
    _session: Session
    _machine: LoopMachine
    _client: Any
    _tools: ToolRegistry
    _session_config: SessionConfig
    _active: Any
    _last_config: Optional[RunConfig]

    # -- cancellation and steering (any thread) --------------------------------

    def cancel(self, reason: Optional[str] = None) -> None:
        """Cancel the run in flight, or the next run if none is (any thread)."""
        self._cancel.cancel(reason)

    def is_cancelled(self) -> bool:
        """True while the cancel signal is fired (any thread)."""
        return self._cancel.is_cancelled()

    def cancel_signal(self) -> CancelSignal:
        """The loop's shared ``CancelSignal`` (any thread)."""
        return self._cancel

    def steering(self) -> Steering:
        """The loop's one shared ``Steering`` (any thread)."""
        return self._steering

    @property
    def session(self) -> Session:
        """The audit trail: one ``Run`` per run, success or failure."""
        return self._session

    @property
    def machine(self) -> LoopMachine:
        """The brain (read-only use)."""
        return self._machine

    @property
    def client(self) -> Any:
        """The model client."""
        return self._client

    @property
    def tools(self) -> ToolRegistry:
        """The tool registry."""
        return self._tools

    @property
    def session_config(self) -> SessionConfig:
        """The session configuration."""
        return self._session_config

    @property
    def is_running(self) -> bool:
        """True while a run is in flight."""
        return self._active is not None

    def conversation(self) -> list[Message]:
        """History plus pending (a new list)."""
        return self._machine.full_history()

    def run_config(self) -> Optional[RunConfig]:
        """The in-flight run's config, or the last run's; None before the first."""
        return self._last_config

    def state(self) -> MachineState:
        """The machine's state."""
        return self._machine.state

    def should_continue(self) -> bool:
        """True while the machine is not terminal."""
        return not self._machine.is_terminal


__all__ = ["ViewsMixin"]
