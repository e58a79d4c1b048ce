"""``Flag`` (a run's done and wake-up flags, a cancel signal's flag) and a signal's listener slot.

Both are kept light for the object diet: a ``Flag`` is one object where a
``threading.Event`` is six, and a signal with one listener holds it without
a list. These tests pin the behaviour that lightness must not change.
"""

from __future__ import annotations

import functools
import threading

from loopctl.cancel import CancelSignal, Flag


def test_set_wakes_every_waiter_whenever_it_lands() -> None:
    for _ in range(50):
        flag = Flag()
        ready = threading.Barrier(5)
        woke: list[bool] = []

        def waiter(flag: Flag = flag, ready: threading.Barrier = ready, woke: list[bool] = woke) -> None:
            ready.wait()
            woke.append(flag.wait(30.0))

        threads = [threading.Thread(target=waiter, name=f"loopctl-test-flag-{i}") for i in range(4)]
        for t in threads:
            t.start()
        ready.wait()
        flag.set("done")
        for t in threads:
            t.join(30.0)
        assert woke == [True] * 4
        assert flag._waiters is None  # every waiter took its lock back out


def test_wait_times_out_false_and_leaves_no_waiter() -> None:
    flag = Flag()
    assert flag.wait(0.01) is False
    assert flag.wait(0) is False
    assert flag._waiters is None and not flag.is_set()


def test_set_is_idempotent_and_keeps_the_first_reason() -> None:
    flag = Flag()
    flag.set("first")
    flag.set("second")
    assert flag.is_set() and flag.reason == "first"
    assert flag.wait() is True


def test_a_wait_beyond_the_platform_limit_is_clamped() -> None:
    flag = Flag()
    setter = threading.Thread(target=flag.set, name="loopctl-test-flag-setter")
    setter.start()
    assert flag.wait(threading.TIMEOUT_MAX * 10) is True  # would raise OverflowError unclamped
    setter.join(30.0)


class _Counter:
    def __init__(self) -> None:
        self.calls = 0

    def hit(self) -> None:
        self.calls += 1


def test_one_listener_then_two_then_one_fire_exactly_once_each() -> None:
    signal = CancelSignal()
    a, b = _Counter(), _Counter()
    signal.add_listener(a.hit)
    signal.add_listener(b.hit)
    signal.remove_listener(a.hit)  # a bound method made anew: removed by equality
    signal.cancel("stop")
    assert (a.calls, b.calls) == (0, 1)
    signal.cancel("again")  # already fired: no second call
    assert b.calls == 1


def test_removing_the_only_listener_leaves_none() -> None:
    signal = CancelSignal()
    a = _Counter()
    signal.add_listener(a.hit)
    signal.remove_listener(a.hit)
    signal.remove_listener(a.hit)  # absent now: no error
    assert signal._listeners is None
    signal.cancel()
    assert a.calls == 0


def test_listeners_fire_in_the_order_they_were_added() -> None:
    signal = CancelSignal()
    order: list[str] = []
    for name in ("first", "second", "third"):
        signal.add_listener(functools.partial(order.append, name))
    signal.cancel()
    assert order == ["first", "second", "third"]
