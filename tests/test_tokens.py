"""Token counting: the heuristic, presets, the incremental meter, calibration."""

from __future__ import annotations

import math
from typing import Any

import pytest
from support import CountingCounter

from loopctl import BareLoop, SessionConfig
from loopctl.context import (
    ConversationMeter,
    HeuristicTokenCounter,
    TokenCounter,
    UsageCalibration,
    count_messages,
)
from loopctl.errors import ConfigError
from loopctl.messages import Message, Role, ThinkingPart, ToolCallPart, ToolResultPart, Usage
from loopctl.observers import CallbackObserver, Compaction, Event
from loopctl.testing import ScriptedClient, reply


def test_heuristic_counts_chars_over_ratio_plus_framing() -> None:
    c = HeuristicTokenCounter()
    assert c.count_text("") == 0
    assert c.count_text("abcd") == 1 and c.count_text("abcde") == 2
    assert c.count_message(Message.user("x" * 40)) == 4 + 10
    assert c.count_message(Message(Role.ASSISTANT, ())) == 4
    call = ToolCallPart("id", "search", {"q": "abc"})
    assert c.count_message(Message.assistant("", [call])) == 4 + math.ceil((6 + len(repr({"q": "abc"}))) / 4)
    res = ToolResultPart("id", "search", "r" * 100)
    assert c.count_message(Message.from_tool_results([res])) == 4 + math.ceil(106 / 4)
    th = Message(Role.ASSISTANT, (ThinkingPart("t" * 8),))
    assert c.count_message(th) == 4 + 2
    assert isinstance(c, TokenCounter)


def test_presets() -> None:
    assert (HeuristicTokenCounter.openai().chars_per_token, HeuristicTokenCounter.openai().per_message) == (4.3, 4)
    assert (HeuristicTokenCounter.anthropic().chars_per_token, HeuristicTokenCounter.anthropic().per_message) == (3.6, 5)
    assert HeuristicTokenCounter.gemini().chars_per_token == 4.05
    assert HeuristicTokenCounter.local_default().chars_per_token == 3.8
    # a smaller ratio means more tokens for the same text
    text = "y" * 1000
    assert HeuristicTokenCounter.anthropic().count_text(text) > HeuristicTokenCounter.openai().count_text(text)


@pytest.mark.parametrize("kwargs, bad", [
    ({"chars_per_token": 0}, "0"),
    ({"chars_per_token": float("nan")}, "nan"),
    ({"chars_per_token": float("inf")}, "inf"),
    ({"per_message": -1}, "-1"),
    ({"chars_per_token": True}, "True"),
])
def test_counter_validates(kwargs: dict[str, Any], bad: str) -> None:
    with pytest.raises(ConfigError, match=bad):
        HeuristicTokenCounter(**kwargs)


def test_meter_counts_only_new_messages() -> None:
    c = CountingCounter()
    meter = ConversationMeter(c)
    hist = [Message.user(f"m{i}" * 10) for i in range(100)]
    pending = [Message.user("p")]
    total = meter.measure(hist, pending, 1, 1)
    assert total == count_messages(HeuristicTokenCounter(), hist + pending)
    assert c.calls == 101
    pending.append(Message.assistant("reply"))
    assert meter.measure(hist, pending, 1, 1) == count_messages(HeuristicTokenCounter(), hist + pending)
    assert c.calls == 102  # only the new message was counted
    meter.measure(hist, pending, 1, 1)
    assert c.calls == 102


def test_meter_recounts_a_replaced_list_once() -> None:
    c = CountingCounter()
    meter = ConversationMeter(c)
    hist = [Message.user("a" * 40)] * 10
    meter.measure(hist, [], 1, 1)
    compacted = hist[:3]
    assert meter.measure(compacted, [], 2, 1) == 3 * 14  # a new epoch: recount
    calls = c.calls
    assert meter.measure(compacted, [], 2, 1) == 3 * 14
    assert c.calls == calls
    # a list that shrank under the same identity is recounted, never mis-summed
    assert meter.measure(compacted[:1], [], 2, 1) == 14


def test_a_count_that_raises_midway_leaves_the_meter_as_it_was() -> None:
    """A run abandoned inside a user's counter raises out of it: the meter keeps nothing half-counted."""

    class Failing(CountingCounter):
        fail_at = -1

        def count_message(self, message: Message) -> int:
            if self.calls == self.fail_at:
                raise RuntimeError("abandoned")
            return super().count_message(message)

    c = Failing()
    meter = ConversationMeter(c)
    hist = [Message.user("a" * 40)] * 3
    assert meter.measure(hist, [], 1, 1) == 3 * 14
    compacted = [Message.user("b" * 40)] * 4
    c.fail_at = c.calls + 2  # a new epoch, recounted from zero: the third count raises
    with pytest.raises(RuntimeError):
        meter.measure(compacted, [], 2, 1)
    assert meter.measure(hist, [], 1, 1) == 3 * 14  # still the old tally, counted nothing again
    c.fail_at = -1
    assert meter.measure(compacted, [], 2, 1) == 4 * 14


def test_meter_compares_epochs_by_value() -> None:
    c = CountingCounter()
    meter = ConversationMeter(c)
    hist = [Message.user("x")] * 5
    meter.measure(hist, [], 10**6, 0)
    calls = c.calls
    meter.measure(hist, [], int("1000000"), 0)  # an equal int, not the same object
    assert c.calls == calls
    meter.reset()
    meter.measure(hist, [], 10**6, 0)
    assert c.calls == calls + 5


def test_calibration_clamps_and_moves_halfway() -> None:
    cal = UsageCalibration()
    assert cal.scale(1000) == 1000
    cal.note_prediction(1000)
    cal.observe(0)  # ignored
    assert cal.ratio is None
    cal.observe(2000)
    assert cal.ratio == 2.0 and cal.scale(1000) == 2000
    cal.observe(1000)  # sample 1.0 -> halfway: 1.5
    assert cal.ratio == 1.5
    cal.observe(100_000)  # clamped to 4.0 -> (1.5 + 4) / 2
    assert cal.ratio == 2.75
    cal.observe(1)  # clamped to 0.25
    assert cal.ratio == pytest.approx(1.5)
    fresh = UsageCalibration()
    fresh.observe(500)  # no prediction yet: ignored
    assert fresh.ratio is None


def test_provider_usage_calibrates_the_loop_estimate() -> None:
    """A provider counting 3x our estimate makes the loop compact earlier."""
    cfg = SessionConfig(context_window=10_000, compact_threshold=80)
    hist = [Message.user("h" * 3000) if i % 2 == 0 else Message.assistant("h" * 3000) for i in range(8)]
    # 8 x 754 = 6032 raw: under the 8000 line until calibrated
    events: list[Event] = []
    client = ScriptedClient([reply("a", usage=Usage(input_tokens=18_200, output_tokens=5)), reply("b")])
    loop = BareLoop(client, config=cfg, history=hist).with_observer(CallbackObserver(events.append))
    loop.run("first")
    assert not any(isinstance(e, Compaction) for e in events)
    ratio = loop._meter.calibration.ratio
    assert ratio is not None and 2.9 < ratio < 3.1
    loop.run("second")
    (comp,) = [e for e in events if isinstance(e, Compaction)]
    assert comp.tokens_before > 8000  # the calibrated figure crossed the line
    assert len(client.requests[1].messages) < len(client.requests[0].messages)


def test_set_token_counter_reaches_the_manager() -> None:
    loop = BareLoop(ScriptedClient([]))
    c = HeuristicTokenCounter.anthropic()
    loop.set_token_counter(c)
    assert loop._parts.context_manager.counter is c and loop._meter.counter is c


def test_tool_schema_text_is_cached_by_identity_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The overhead counts each schema's JSON, encoded once per schema; the cache stays bounded."""
    import json

    from loopctl.driver import meter as meter_mod
    from loopctl.messages import ToolSchema

    monkeypatch.setattr(meter_mod, "_SCHEMA_JSON", {})  # the module's own cache is left as it was
    a = ToolSchema("a", "first", {"type": "object"})
    text = meter_mod._schema_json(a)
    assert json.loads(text) == a.to_dict()
    assert meter_mod._schema_json(a) is text  # the same schema: the same text, not encoded again
    b = ToolSchema("a", "second", {"type": "object"})  # equal name, other schema: its own text
    assert json.loads(meter_mod._schema_json(b)) == b.to_dict()
    for i in range(meter_mod._SCHEMA_JSON_MAX + 5):  # bounded: the cache is emptied, never grows past it
        meter_mod._schema_json(ToolSchema(f"t{i}", "d", {}))
    assert len(meter_mod._SCHEMA_JSON) <= meter_mod._SCHEMA_JSON_MAX
