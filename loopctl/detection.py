"""Loop and convergence detection.

``LoopDetector`` watches tool operations: an operation is (tool, input,
result). The same operation seen ``warn_at`` times in the last ``window``
operations warns once per pattern; at ``stop_at`` it arms a stop that the
NEXT dispatch's ``pre_check`` turns into ``LoopDetected``. A result that
differs for the same (tool, input) forgets the pattern, so polling a
changing resource, paging (different inputs) and retrying after an error
(different result) never count.

``ConvergenceDetector`` watches terminal answers only: word-set Jaccard
similarity (case-folded, punctuation ignored) with the previous answer at or
above ``threshold`` for ``count`` answers in a row means converged.

Both are thread-safe (``LoopDetector`` a lock each, ``ConvergenceDetector`` one lock
for all) and never raise from ``record``; bad
thresholds raise ``ConfigError`` naming the value at construction.
``LoopDetector.record`` runs on every tool result, so its common path stays
cheap: an input that is a dict of scalars is keyed by a sorted tuple (JSON
only for other inputs), and the pattern text is built only when a warning
or a stop fires.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Mapping
from typing import Any, Optional, Union

from loopctl.checks import integer, number, shown
from loopctl.context.memory import words
from loopctl.errors import ConfigError, LoopDetected
from loopctl.text import masked_head

_ACTIONS = ("warn", "stop", "ask_user")
#: Shared by every ``ConvergenceDetector``: it sees one terminal answer per
#: run, so a lock each would only add an object per loop for the cyclic GC.
_answers_lock = threading.Lock()


# One encoder for every call: ``json.dumps`` with options builds a new one each time.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)


def _canonical(input: object) -> str:
    try:
        return _ENCODER.encode(input)
    except (TypeError, ValueError):
        return repr(input)


# A cheap identity for an input: a dict of str keys and scalar values becomes a
# sorted tuple of (key, type, value) (the type keeps 1, 1.0 and True apart as JSON
# does; a float is kept as its repr so -0.0 and NaN compare as JSON text does);
# anything else is its canonical JSON text. The JSON text for a warning is built
# only when one fires.
_Key = Union[str, tuple[tuple[str, type, Any], ...]]
_SCALARS = frozenset({str, int, bool, type(None)})


def _key(input: object) -> _Key:
    if type(input) is not dict:
        return _canonical(input)
    items: list[tuple[str, type, object]] = []
    for k, v in input.items():
        t = type(v)
        if type(k) is not str:
            return _canonical(input)
        if t in _SCALARS:
            items.append((k, t, v))
        elif t is float:
            items.append((k, t, repr(v)))
        else:
            return _canonical(input)
    items.sort()  # keys are unique, so the types are never compared
    return tuple(items)


def _key_text(key: _Key) -> str:
    """The canonical JSON text of the input ``key`` was made from."""
    if isinstance(key, str):
        return key
    return _canonical({k: float(v) if t is float else v for k, t, v in key})


def _describe(tool: str, key: _Key) -> str:
    canon = _key_text(key)
    shown = canon if len(canon) <= 80 else masked_head(canon, 77) + "..."
    return f"{tool}({shown})"


class LoopDetector:
    """Counts identical (tool, input, result) operations.

    Args:
        warn_at: repetitions that fire one warning per pattern (>= 2).
        stop_at: repetitions that arm a stop (0 disables stops; else >= warn_at).
        window: how many recent operations are remembered (>= warn_at, >= stop_at).

    Raises:
        ConfigError: a threshold is out of range (the message names it).
    """

    def __init__(self, warn_at: int = 3, stop_at: int = 10, window: int = 50) -> None:
        self.warn_at = integer(warn_at, "LoopDetector.warn_at", 2)
        self.stop_at = integer(stop_at, "LoopDetector.stop_at", 0)
        if stop_at and stop_at < warn_at:
            raise ConfigError(
                f"LoopDetector.stop_at must be 0 or >= warn_at ({shown(warn_at)}), got {shown(stop_at)}"
            )
        self.window = integer(window, "LoopDetector.window", 1)
        if window < max(warn_at, stop_at):
            raise ConfigError(
                f"LoopDetector.window must be >= warn_at and stop_at ({shown(max(warn_at, stop_at))}), "
                f"got {shown(window)}"
            )
        self._lock = threading.Lock()
        # The window and the warned set are made on the first tool result: an
        # idle loop holds no containers for the cyclic GC to walk.
        self._ops: Optional[deque[tuple[tuple[str, _Key], int, int]]] = None  # (sig, result hash, epoch)
        self._current: dict[tuple[str, _Key], tuple[int, int, int]] = {}  # sig -> (hash, count, epoch)
        self._epoch = 0
        self._warned: Optional[set[tuple[tuple[str, _Key], int]]] = None
        self._pending: Optional[tuple[tuple[str, _Key], int]] = None  # (sig, count); text built late

    def pre_check(self) -> Optional[LoopDetected]:
        """Before a dispatch: the armed stop as ``LoopDetected`` (window cleared), else None."""
        with self._lock:
            pending = self._pending
            if pending is None:
                return None
            self._clear()
        (tool, key), n = pending
        return LoopDetected(f"{_describe(tool, key)} repeated {n} times")

    def record(self, tool: str, input: Mapping[str, Any], output: str, is_error: bool = False) -> Optional[tuple[str, int]]:
        """Note one finished operation.

        Returns:
            ``(pattern, repetitions)`` when this operation fires the warning
            for its pattern (once per pattern), else None.
        """
        sig = (tool, _key(input))
        rhash = hash((bool(is_error), output or ""))
        with self._lock:
            self._epoch += 1
            cur = self._current.get(sig)
            if cur is not None and cur[0] == rhash:
                count, epoch = cur[1] + 1, cur[2]
            else:
                if cur is not None and self._warned is not None:
                    self._warned.discard((sig, cur[0]))  # a differing result forgets the pattern
                count, epoch = 1, self._epoch
            self._current[sig] = (rhash, count, epoch)
            ops = self._ops
            if ops is None:
                ops = self._ops = deque()
            ops.append((sig, rhash, epoch))
            if len(ops) > self.window:
                evicted = ops.popleft()
                self._evict(evicted)
                if evicted[0] == sig:  # the eviction may have lowered this very pattern's count
                    cur = self._current.get(sig)
                    count = cur[1] if cur is not None else 0
            if self.stop_at and count >= self.stop_at:
                self._pending = (sig, count)
            warned = self._warned
            if count < self.warn_at or (warned is not None and (sig, rhash) in warned):
                return None
            if warned is None:
                self._warned = {(sig, rhash)}
            else:
                warned.add((sig, rhash))
        return (_describe(tool, sig[1]), count)

    def _evict(self, old: tuple[tuple[str, _Key], int, int]) -> None:
        sig, rhash, epoch = old
        cur = self._current.get(sig)
        if cur is None or cur[0] != rhash or cur[2] != epoch:
            return  # that occurrence belonged to a forgotten pattern
        if cur[1] <= 1:
            del self._current[sig]
            if self._warned is not None:
                self._warned.discard((sig, rhash))
        else:
            self._current[sig] = (rhash, cur[1] - 1, epoch)

    def consume_pending_stop(self) -> Optional[LoopDetected]:
        """Drop an armed stop (the run ended first); the window is cleared with it."""
        return self.pre_check()

    @property
    def has_pending_stop(self) -> bool:
        """True while a stop is armed."""
        return self._pending is not None

    def max_repetitions(self) -> int:
        """The highest repetition count of any live pattern."""
        with self._lock:
            return max((c for _, c, _ in self._current.values()), default=0)

    def reset(self) -> None:
        """Forget everything, armed stop included."""
        with self._lock:
            self._clear()

    def _clear(self) -> None:
        self._ops = None
        self._current.clear()
        self._warned = None
        self._pending = None

    def __repr__(self) -> str:
        return f"<LoopDetector warn_at={self.warn_at} stop_at={self.stop_at} window={self.window}>"


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """|a ∩ b| / |a ∪ b| (1.0 for two empty sets)."""
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


class ConvergenceDetector:
    """Spots the agent giving the same final answer again and again.

    Args:
        threshold: Jaccard similarity in [0, 1] at which two answers match.
        count: answers in a row that must match (>= 2).
        action: ``"warn"`` (default), ``"stop"`` (``LoopDetected``) or
            ``"ask_user"`` (``UserInputRequired``); the driver acts on it.

    Raises:
        ConfigError: a value is out of range (the message names it).
    """

    def __init__(self, threshold: float = 0.95, count: int = 3, action: str = "warn") -> None:
        self.threshold = number(threshold, "ConvergenceDetector.threshold", 0, 1)
        self.count = integer(count, "ConvergenceDetector.count", 2)
        if action not in _ACTIONS:
            raise ConfigError(f"ConvergenceDetector.action must be one of {_ACTIONS}, got {shown(action)}")
        self.action = action
        self._lock = _answers_lock
        self._previous: Optional[frozenset[str]] = None
        self._streak = 0

    def record(self, text: str) -> Optional[tuple[float, int]]:
        """Note one terminal answer.

        Returns:
            ``(similarity, consecutive_count)`` when the last ``count`` answers
            matched (and on every further matching answer), else None.
        """
        ws = words(text or "")
        with self._lock:
            if not ws:
                self._previous, self._streak = None, 0
                return None
            prev = self._previous
            self._previous = ws
            if prev is None:
                self._streak = 1
                return None
            similarity = jaccard(prev, ws)
            self._streak = self._streak + 1 if similarity >= self.threshold else 1
            if self._streak >= self.count:
                return (similarity, self._streak)
        return None

    @property
    def streak(self) -> int:
        """Answers in the current run of matches."""
        return self._streak

    def reset(self) -> None:
        """Forget the answers seen."""
        with self._lock:
            self._previous, self._streak = None, 0

    def __repr__(self) -> str:
        return f"<ConvergenceDetector threshold={self.threshold} count={self.count} action={self.action!r}>"


__all__ = ["ConvergenceDetector", "LoopDetector", "jaccard"]
