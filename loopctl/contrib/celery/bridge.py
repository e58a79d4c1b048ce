"""The worker's landing for cancel and steering: the bridge thread and the steer feed.

``Bridge`` subscribes to the run's control channel BEFORE the run is claimed
(so nothing published after the claim is missed) and, once the run is
started, its thread ``loopctl-celery-bridge-<id>`` turns ``c`` (cancel)
into the ``RunHandle``'s cancel, ``s<index> <json>`` (steer) into a
delivery and ``a<json>`` (an approval answer) into the handle's
``approve``/``deny``, replying with the verdict (see ``approvals``). Steers are addressed by their index in the run's Redis steer
list: ``cursor`` is the next index this worker has not taken, so a steer is
taken once whether it came with the claim, on the channel, or by a
catch-up read after a broken subscription; the finish step returns every
index from ``cursor`` on as a leftover. ``SteerFeed`` holds guidance until
the run's slot is open, then pushes it (see its docstring).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, List, Optional, Sequence, Tuple

from loopctl.driver.handle import RunHandle
from loopctl.driver.signals import Steering
from loopctl.errors import LoopError
from loopctl.messages import Message
from loopctl.text import masked_head

from .approvals import answer_here
from .redis import RedisBackend, RegistryUnavailable
from .steers import Steer, settled_prefix, steer_from_json

try:
    from redis.exceptions import RedisError
except ImportError as exc:  # pragma: no cover
    raise ImportError("loopctl.contrib.celery needs the [celery] extra") from exc

log = logging.getLogger("loopctl")


_Taken = Tuple[int, Message, Optional[str]]  # a steer's place among those taken here, its message, its path


class SteerFeed:
    """Steering's landing: a contributor that opens the feed at the first boundary.

    Before the run's slot is open, guidance waits here (``pending``). The
    first time the driver consults contributors (turn 0's request
    preparation) the pending guidance is pushed, so it is in the first
    request; from then on the bridge pushes directly. Guidance for a
    sub-agent (a target path) goes to ``handle.steer_subagent`` instead of
    the run's slot, as soon as the run is started (``attach``). A push the
    slot refuses (the run is ending), and guidance whose sub-agent is not in
    flight, are kept in ``refused``: never given to the run itself.
    ``leftovers`` gives pending + sealed + refused, each message once, in
    the order the steers were taken. ``kept``: sub-agent guidance an earlier
    attempt of a resumed run refused (its checkpoint carries it), returned
    with the leftovers, first.
    """

    def __init__(self, steering: Steering, pending: List[Steer], kept: Sequence[Steer] = ()) -> None:
        self._steering = steering
        self._lock = threading.Lock()
        self._ready = False
        self._pending: List[_Taken] = [(i, m, to) for i, (m, to) in enumerate(pending)]
        self._refused: List[_Taken] = [(-1, m, to) for m, to in kept]  # -1: before every steer taken here
        self._settled = [to is not None for _, to in pending]  # per steer taken (see settled_prefix)
        self._taken: List[_Taken] = [*self._refused, *self._pending]  # every steer, to order the leftovers
        self.handle: Optional[RunHandle] = None  # set once the run is started (sub-agent guidance)

    def contribute(self, ctx: object) -> None:
        """Open the feed on the first call (on the run's thread); never adds a message."""
        if self._ready:
            return None
        with self._lock:
            if not self._ready:
                self._ready = True
                pending, self._pending = self._pending, []
                self._push(pending)
        return None

    def attach(self, handle: RunHandle) -> None:
        """The run is started: guidance for its sub-agents goes out from now on, without waiting.

        Sub-agent guidance taken with the claim is tried here, right after the
        start: a sub-agent started that early takes it; otherwise (usually no
        sub-agent is in flight yet) it is refused, kept for the leftovers.
        """
        with self._lock:
            self.handle = handle
            pending = self._pending
            self._pending = [s for s in pending if s[2] is None]
            self._push([s for s in pending if s[2] is not None])

    def deliver(self, taken: List[Optional[Steer]]) -> None:
        """Hand guidance to the run (the bridge thread); None stands for a malformed steer taken."""
        with self._lock:
            base = len(self._settled)
            self._settled.extend(s is None or s[1] is not None for s in taken)
            steers = [(base + i, s[0], s[1]) for i, s in enumerate(taken) if s is not None]
            self._taken.extend(steers)
            if self._ready:
                self._push(steers)
            else:  # a sub-agent's run has its own slot: only the run's own guidance waits
                self._push([s for s in steers if s[2] is not None])
                self._pending.extend(s for s in steers if s[2] is None)

    def _push(self, steers: List[_Taken]) -> None:
        for taken in steers:
            _, m, to = taken
            if not (self._to_run(m) if to is None else self._to_subagent(to, m)):
                self._refused.append(taken)

    def _to_run(self, message: Message) -> bool:
        try:
            return self._steering.push(message)
        except ValueError:  # stored before steer() refused such messages: kept for the leftovers
            handle = self.handle
            log.error("run %s: guidance with tool calls or results is kept for the leftovers",
                      handle.run_id if handle is not None else "(not started)")
            return False

    def _to_subagent(self, to: str, message: Message) -> bool:
        handle = self.handle
        # A path the run cannot address is kept, as for no sub-agent in flight.
        with contextlib.suppress(ValueError, LoopError):
            if handle is not None and handle.steer_subagent(to, message):
                return True
        log.info(
            "run %s: no sub-agent %r in flight; its guidance is kept for the run's leftovers",
            handle.run_id if handle is not None else "(not started)", to[:80],
        )
        return False

    def settled(self, delivered: int) -> Tuple[int, List[Steer]]:
        """What a checkpoint records once ``delivered`` of the run's own guidance are in.

        Returns:
            How many steers taken here need no feeding again (see
            ``settled_prefix``), and the sub-agent guidance among them, or
            kept from an earlier attempt, that no sub-agent run holds:
            refused, not tried yet (the run reached a checkpoint before its
            start was attached), or handed back by a sub-agent's run that
            ended before reaching it. Settled for feeding, it is still owed
            to the leftovers, so a resumed run must carry it.
        """
        with self._lock:
            n = settled_prefix(self._settled, delivered)
            back = {id(m) for m in self._steering.sealed()}  # the very objects handed on
            owed = self._refused + [s for s in self._pending if s[2] is not None]
            owed += [s for s in self._taken if s[2] is not None and s[0] >= 0 and id(s[1]) in back]
            owed.sort(key=lambda s: s[0])
            return n, [(m, to) for place, m, to in owed if to is not None and place < n]

    def leftovers(self) -> List[Message]:
        """Everything accepted for the run and never delivered (after the run ended)."""
        with self._lock:
            self._ready = True  # nothing may wait in pending after this
            out = [m for _, m, _ in self._pending] + self._steering.take_leftovers() + [m for _, m, _ in self._refused]
            self._pending, self._refused = [], []
            # The slot gives back the very objects pushed: each one's place orders them
            # (sorted is stable: a message the slot got from elsewhere keeps its turn, last).
            place = {id(m): p for p, m, _ in self._taken}
            return sorted(out, key=lambda m: place.get(id(m), len(self._taken)))


class Bridge:
    """The run's control channel on this worker: cancel and steer in, nothing out.

    Every (re)subscription is followed by a catch-up read (the stored cancel
    flag, the steers from ``cursor`` on), so a message published while the
    subscription was down is never missed: redis-py re-subscribes by itself
    after a dropped connection and reports it with a ``subscribe`` message,
    which triggers the catch-up; a subscription that fails outright is
    rebuilt here. ``poke`` (from the heartbeat, which also reads the cancel
    flag and the steer count) is the safety net. Taking steers is serialized
    by one lock, so ``cursor`` moves once per steer.
    """

    def __init__(self, backend: RedisBackend, run_id: str, cursor: int = 0) -> None:
        self._backend = backend
        self._run_id = run_id
        self._slice = backend.block_slice
        self.cursor = cursor
        self._take = threading.Lock()
        self._frozen = False  # set by stop(): cursor is final
        self._handle: Optional[RunHandle] = None
        self._feed: Optional[SteerFeed] = None
        self._thread: Optional[threading.Thread] = None
        self._stopped = False
        self._stop_evt = threading.Event()
        self._ps = self._subscribe()

    def _subscribe(self) -> Any:
        backend = self._backend
        ps = backend.pubsub(f"loopctl-bridge-{self._run_id[:12]}")
        try:
            with backend.guard("subscribe"):
                ps.subscribe(backend.channel(self._run_id))
                deadline = time.monotonic() + backend.socket_timeout
                while True:
                    msg = ps.get_message(timeout=max(0.01, deadline - time.monotonic()))
                    if msg is not None and msg.get("type") == "subscribe":
                        return ps
                    if time.monotonic() >= deadline:
                        raise RegistryUnavailable(
                            f"redis at {backend.url}: no confirmation for the run's channel subscription"
                        )
        except BaseException:
            _close(ps)
            raise

    def start(self, handle: RunHandle, feed: SteerFeed) -> None:
        """Start the bridge thread for the running run."""
        self._handle = handle
        self._feed = feed
        feed.attach(handle)
        t = threading.Thread(
            target=self._main, name=f"loopctl-celery-bridge-{self._run_id[:12]}", daemon=True
        )
        self._thread = t
        t.start()

    def stop(self) -> None:
        """Make the thread leave after what is already on the channel, join it, close.

        Afterwards ``cursor`` is final: every steer from it on is the finish step's.
        """
        self._stopped = True
        self._stop_evt.set()
        t = self._thread
        if t is not None and t.is_alive():
            try:
                self._backend.publish(self._run_id, "x")
            except RegistryUnavailable:
                pass  # the thread leaves at its next empty read
            t.join(self._slice + self._backend.socket_timeout + 1.0)
        with self._take:  # even a thread that is still stuck takes nothing from here on
            self._frozen = True
        self.close()

    def close(self) -> None:
        """Close the subscription's connection."""
        _close(self._ps)

    def poke(self, cancelled: bool, reason: Optional[str], steers: int) -> None:
        """The heartbeat's view of the stored state: apply what the channel missed."""
        handle = self._handle
        if handle is None or self._stopped:
            return
        if cancelled:
            handle.cancel(reason)
        if steers > self.cursor:
            self._catch_up_steers()

    def _main(self) -> None:
        handle = self._handle
        assert handle is not None
        while True:
            try:
                msg = self._ps.get_message(timeout=self._slice)
            except (RedisError, OSError, ValueError) as exc:
                if self._stopped:
                    return
                log.warning("run %s: control channel broke (%s); resubscribing", self._run_id, exc)
                self._resubscribe(handle)
                continue
            if msg is None:
                if self._stopped:
                    return
                continue
            kind = msg.get("type")
            if kind == "subscribe":  # redis-py reconnected and re-subscribed by itself
                self._catch_up(handle)
                continue
            if kind != "message":
                continue
            data: str = msg["data"]
            op = data[:1]
            if op == "c":
                handle.cancel(data[2:] if data[1:2] == "1" else None)
            elif op == "s":
                idx, _, payload = data[1:].partition(" ")
                self._on_steer(int(idx), payload)
            elif op == "a":
                answer_here(self._backend, handle, data[1:])
            elif op in ("e", "x"):
                return

    def _resubscribe(self, handle: RunHandle) -> None:
        _close(self._ps)
        while not self._stopped:
            try:
                self._ps = self._subscribe()
            except RegistryUnavailable:
                self._stop_evt.wait(0.2)  # Redis is down: retry shortly (or leave on stop)
                continue
            self._catch_up(handle)
            return

    def _on_steer(self, index: int, payload: str) -> None:
        with self._take:
            if self._frozen or index < self.cursor:
                return  # stopped, or already taken (in the claim, or by a catch-up)
            raw: List[str] = []
            if index > self.cursor:  # a notification was missed: read the gap, in order
                try:
                    raw = self._backend.steers_from(self._run_id, self.cursor, index - 1)
                except RegistryUnavailable:
                    return  # not taken now: a catch-up or the finish step gets them
                if len(raw) != index - self.cursor:
                    return
            raw.append(payload)
            self.cursor = index + 1
            self._deliver(raw)

    def _deliver(self, raw: List[str]) -> None:
        feed = self._feed
        assert feed is not None
        steers: List[Optional[Steer]] = []
        for text in raw:
            try:
                steers.append(steer_from_json(text))
            except (ValueError, LoopError):
                log.error("run %s: dropped a malformed steer %r", self._run_id, masked_head(text, 80))
                steers.append(None)  # taken all the same: a resumed run must not read it again
        feed.deliver(steers)

    def _catch_up(self, handle: RunHandle) -> None:
        """Apply a stored cancel and take the unread steers (best effort)."""
        try:
            cancelled, reason = self._backend.cancel_requested(self._run_id)
        except RegistryUnavailable:
            return
        if cancelled:
            handle.cancel(reason)
        self._catch_up_steers()

    def _catch_up_steers(self) -> None:
        with self._take:
            if self._frozen:
                return
            try:
                raw = self._backend.steers_from(self._run_id, self.cursor)
            except RegistryUnavailable:
                return
            if raw:
                self.cursor += len(raw)
                self._deliver(raw)


def _close(ps: Any) -> None:
    try:
        ps.close()
    except Exception:  # closing a broken connection must not mask the real error
        log.debug("closing the bridge's pubsub failed", exc_info=True)


__all__ = ["Bridge", "SteerFeed"]
