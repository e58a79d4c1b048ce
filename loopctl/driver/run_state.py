"""RunState: what one run holds, in one place.

A run is split once: ``RunState`` is what it holds (its fence and record,
the loop's collaborators it was lent, its input, config and policy, the
figures it carries from one step to the next); ``RunDriver`` (run.py) is
what it does, in timeline order, with the model turn (llm_turn.py) and the
compaction pass (compaction.py) as its methods. The dispatcher and the
durable checkpoint sink are lent the same object.

The state shared with the run's waiter and handle (the fence, the done and
wake flags, the approval slot) is ``RunContext`` (handle.py): it outlives
the run's work, so the handle keeps only it and everything below is freed
when the run ends. What only the run's work needs (the model call in flight,
the tally of its tool calls) lives here, reached from the context through
its ``driver`` while the run lasts.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Callable, Optional, Protocol

import attrs

from loopctl.config import ParallelDispatch, RunConfig
from loopctl.driver.checkpoint import DurableRun, ResumePoint
from loopctl.driver.emission import RunEvents
from loopctl.driver.handle import RunContext
from loopctl.driver.meter import TokenMeter
from loopctl.driver.parts import LoopParts
from loopctl.driver.resources import LoopResources, ToolTally
from loopctl.driver.signals import RunSteering
from loopctl.errors import Cancelled, ConfigError, LoopError
from loopctl.machine import LoopMachine, MachinePolicy
from loopctl.messages import RequestOptions, StopReason, ToolResultPart
from loopctl.output import OutputCheck

if TYPE_CHECKING:
    from loopctl.cancel import CancelSignal
    from loopctl.driver.admission import Admitted
    from loopctl.driver.session_link import SessionLink
    from loopctl.records import Session

class Release(Protocol):
    """The loop as its run sees it: only how the run frees it, last thing in ``finalize``.

    The loop itself is lent, not its bound ``_release``: a bound method would
    be one more object per run in flight.
    """

    def _release(self, rc: RunContext, error: Optional[LoopError], keep_cancel: bool) -> None: ...


#: The config of a run started without one: shared, as it is immutable.
_DEFAULT_CONFIG = RunConfig()


def run_config(input: object, config: Optional[RunConfig], output_type: object) -> RunConfig:
    """The run's config (``output_type`` applied) once ``input`` and ``config`` are valid."""
    if not isinstance(input, str):
        raise TypeError(f"run input must be a str, got {type(input).__name__}")
    if config is None:
        config = _DEFAULT_CONFIG
    elif not isinstance(config, RunConfig):
        raise ConfigError(f"config must be a RunConfig, got {type(config).__name__}")
    if output_type is not None:
        config = attrs.evolve(config, output_type=output_type)
    return config


@functools.lru_cache(maxsize=64)
def policy_for(max_turns: int, context_window: int, compact_threshold: int, auto_compact: bool) -> MachinePolicy:
    """The machine's policy for these settings: immutable, so runs with the same settings share one."""
    return MachinePolicy(max_turns, context_window, compact_threshold, auto_compact)


class RunState:
    """One run's state: its context, the parts it works with, and its per-run figures.

    Set after construction, before the run's thread starts: ``durable`` (a
    host's checkpoint sink), ``resume_point``, ``link`` (a stored session)
    and ``at_end`` (a host's say at the run's ending point).
    Slotted: thousands may be in flight, and a slotted object is one object
    for the collector to walk, never an object plus its dict.
    """

    __slots__ = (
        "rc", "parts", "machine", "meter", "events", "steering", "session",
        "busy", "loop_cancel", "owner", "resources", "answer_check",
        "run_input", "config", "session_id", "parallel", "policy",
        "durable", "resume_point", "link", "at_end", "tool_names", "base_options",
        "llm_phase", "deferred_tokens", "gathers", "model_call", "turn_model",
        "tally", "admitted", "call_ids", "took_cancel",
        "__weakref__",
    )

    def __init__(
        self,
        rc: RunContext,
        parts: LoopParts,
        machine: LoopMachine,
        meter: TokenMeter,
        events: RunEvents,
        steering: RunSteering,
        session: Session,
        busy: threading.Lock,
        loop_cancel: CancelSignal,
        owner: Release,
        resources: LoopResources,
        answer_check: Optional[OutputCheck] = None,
    ) -> None:
        self.rc = rc
        self.parts = parts
        self.machine = machine
        self.meter = meter
        self.events = events
        self.steering = steering
        self.session = session
        # The loop's side, lent for the run's end: its busy lock, its cancel
        # signal (re-armed as the run frees the loop), and how to free it.
        self.busy = busy
        self.loop_cancel = loop_cancel
        self.owner = owner
        self.resources = resources
        self.answer_check = answer_check  # a typed answer: its type and mode (answers.py)
        run = rc.run
        self.run_input = run.input
        self.config: RunConfig = run.config
        self.session_id = events.session_id
        self.parallel: ParallelDispatch = self.config.parallel  # the dispatcher reads it per batch
        sc = parts.session_config
        self.policy = policy_for(self.config.max_turns, sc.context_window, sc.compact_threshold, sc.auto_compact)
        self.durable: Optional[DurableRun] = None  # set by a host's checkpoint sink (checkpoint.py)
        self.resume_point: Optional[ResumePoint] = None
        self.link: Optional[SessionLink] = None  # the stored session (BareLoop.with_session)
        self.at_end: Optional[Callable[[], Optional[Cancelled]]] = None  # BareLoop.start(at_end=)
        self._start_figures()

    def _start_figures(self) -> None:
        """The run's figures before its first turn: nothing gathered, asked, counted or taken yet."""
        self.tool_names: frozenset[str] = frozenset()
        self.base_options: Optional[RequestOptions] = None
        self.llm_phase: tuple[int, int, Optional[StopReason]] = (0, 0, None)
        self.deferred_tokens = 0  # the extras' cost a deferred turn reserves for the compaction
        self.gathers = False  # contributors or memory: transient extras to gather each turn
        # The model call in flight: the run's cancel listener closes it (any thread).
        self.model_call: object = None
        # The model this turn's call asks for (fixed as it is announced): every
        # model event of the turn names it, whatever model the server says served it.
        self.turn_model = ""
        # The run's tool calls as the loop's tally lock counts them, so a cancel
        # that abandons the run knows how many it leaves behind (made by the
        # first call, on the run's thread while it holds the fence).
        self.tally: Optional[ToolTally] = None
        # The last reply's calls as the admission gate passed them, for the
        # dispatcher to take (once) instead of admitting the same calls again.
        self.admitted: Optional[Sequence[Admitted]] = None
        # Every call id the run has given out (made by its first reply with
        # calls): a reply's calls never reuse one (admission.unique_ids).
        self.call_ids: Optional[set[str]] = None
        # Whether the loop's signal had fired when the run passed its ending
        # point: that cancel is the run's; one fired after it is the next run's.
        self.took_cancel = False

    def tool_tally(self) -> ToolTally:
        """The run's tool tally, made on first use (with the fence held)."""
        tally = self.tally
        if tally is None:
            tally = self.tally = ToolTally()
        return tally

    def boundary(self, after: str) -> None:
        """The run's one checkpoint seam: after each model turn, settled call and tool phase.

        ``after`` is ``"model"``, ``"call"`` or ``"tools"``. A durable run
        hands its resumable state to the host here (see checkpoint.py).
        """
        if self.durable is not None:
            self.durable.boundary(self.machine, self.rc.run.turns, after)

    def settle(self, results: Sequence[ToolResultPart]) -> None:
        """Settled results of the awaited wave (a durable run's checkpoint)."""
        if self.durable is not None:
            self.durable.settle(self.machine, self.rc.run.turns, results)


__all__ = ["Release", "RunState", "policy_for", "run_config"]
