"""Sub-agent events: a sub-agent run's events carried to the run that called it.

Two paths, each keeping its channel's rules: the calling run's tap gets them
inline from the sub-agent run's own tap (``TapForward``; taps never block,
so they arrive in order and before the sub-agent run is done), and its
observers through ``Forwarder``, an observer on the sub-agent loop
(delivered like any observer, unfenced, so a blocked observer above never
holds the sub-agent's cancel). Either way an event is re-stamped with the
calling run's id and the sub-agent path (``"research"``, one level deeper
``"research/search"``), and nothing comes after the calling run's own
``run_end``: the registry's tap drops what arrives later, and a forwarded
event that reaches the observers' queue after the calling run sealed it
(just before its ``on_run_end``) is dropped as it comes up.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, Callable

import attrs

from loopctl.driver.subagent_path import join_path
from loopctl.events import EVENT_METHODS, Event, Observer, RunEnd

log = logging.getLogger("loopctl")
_lock = threading.Lock()  # guards the forwarder table and each forwarder's links


class _Link:
    __slots__ = ("events", "name")

    def __init__(self, events: Any, name: str) -> None:
        self.events = events  # the calling run's RunEvents
        self.name = name


class TapForward:
    """A sub-agent run's tap: its events, re-stamped, into the calling run's tap, inline.

    Taps never block (the registry's appends under a lock), so the calling
    run's tap gets a sub-agent's events in order and before the sub-agent
    run is done: its ``run_end`` always precedes the caller's own.
    """

    __slots__ = ("tap", "run_id", "name")

    def __init__(self, tap: Callable[[Event], None], run_id: str, name: str) -> None:
        self.tap = tap
        self.run_id = run_id
        self.name = name

    def __call__(self, event: Event) -> None:
        out = attrs.evolve(event, run_id=self.run_id, subagent=join_path(self.name, event.subagent))
        try:
            self.tap(out)
        except Exception:
            log.exception("event tap raised on a sub-agent's %s", type(out).__name__)


class Forwarder(Observer):
    """Carries a sub-agent loop's events to the calling run's observers (one per loop).

    Delivered like any observer (unfenced, one at a time), so a blocked
    observer above never holds the sub-agent's cancel.
    """

    def __init__(self) -> None:
        self._links: dict[str, _Link] = {}

    def link(self, run_id: str, events: object, name: str) -> None:
        """Forward the events of run ``run_id`` to ``events`` under ``name``."""
        with _lock:
            self._links[run_id] = _Link(events, name)

    def unlink(self, run_id: str) -> None:
        """Stop forwarding run ``run_id``'s events (no error if unknown)."""
        with _lock:
            self._links.pop(run_id, None)

    def forward(self, event: Event) -> None:
        """Re-emit ``event`` to the calling run's observers."""
        link = self._links.get(event.run_id)
        if link is None:
            return  # a direct run of this loop: nobody above it
        if type(event) is RunEnd and not event.subagent:
            self.unlink(event.run_id)  # the run's last event
        events = link.events
        emitter = events.emitter
        if emitter.observes(type(event)):
            out = attrs.evolve(event, run_id=events.run_id, subagent=join_path(link.name, event.subagent))
            emitter.deliver(_deliver, (events, out), None)


def _deliver(item: tuple[Any, Event]) -> None:
    """A forwarded event, as its turn in the calling loop's delivery comes; dropped once that run is sealed."""
    events, event = item
    if not events.sealed:  # checked in delivery order: nothing of the run comes after its on_run_end
        events.emitter.fan_out(event)


for _method in set(EVENT_METHODS.values()):
    setattr(Forwarder, _method, Forwarder.forward)

_FORWARDERS: weakref.WeakKeyDictionary[object, Forwarder] = weakref.WeakKeyDictionary()


def forwarder_for(loop: Any) -> Forwarder:
    """The loop's forwarding observer, registered on first use.

    Raises:
        ConfigError: a run is in flight on ``loop`` (observers are fixed then).
    """
    with _lock:
        fw = _FORWARDERS.get(loop)
        if fw is not None:
            return fw
        fw = Forwarder()
        loop.with_observer(fw)
        _FORWARDERS[loop] = fw
        return fw


__all__ = ["Forwarder", "TapForward", "forwarder_for"]
