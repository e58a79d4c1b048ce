"""CancelSignal.child(): an independent signal that follows its parent until detached."""

from __future__ import annotations

from loopctl.cancel import CancelSignal


def test_child_fires_with_the_parents_reason() -> None:
    parent = CancelSignal()
    child = parent.child()
    parent.cancel("user stop")
    assert child.is_cancelled() and child.reason == "user stop"


def test_cancelling_the_child_leaves_the_parent_alone() -> None:
    parent = CancelSignal()
    child = parent.child()
    child.cancel("timed out after 2s")
    assert child.is_cancelled() and not parent.is_cancelled()


def test_a_detached_child_no_longer_follows_and_leaves_no_listener() -> None:
    parent = CancelSignal()
    child = parent.child()
    child.detach()
    assert not parent._listeners
    parent.cancel()
    assert not child.is_cancelled()


def test_child_of_an_already_fired_view_is_fired_at_once() -> None:
    loop_signal = CancelSignal()
    view = loop_signal.view()
    loop_signal.cancel("before")
    loop_signal.reset()  # the loop re-armed; the view keeps its run's flag
    child = view.child()
    assert child.is_cancelled() and child.reason == "before"
    assert not loop_signal._listeners
