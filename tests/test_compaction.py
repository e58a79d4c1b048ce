"""Compactors: truncation boundaries, pair safety (property-tested), summaries."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopctl.context import HeuristicTokenCounter, SummarizingCompactor, TruncatingCompactor
from loopctl.context.compactors import (
    EXTRA_CONTEXT_PREFIX,
    SUMMARY_PREFIX,
    CompactionRequest,
    render_transcript,
    safe_split,
    tool_pairs,
)
from loopctl.errors import ConfigError, ModelError
from loopctl.messages import (
    Message,
    ModelRequest,
    ModelResponse,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)
from loopctl.testing import reply


def tc(cid: str, name: str = "t") -> ToolCallPart:
    return ToolCallPart(cid, name, {"k": cid})


def tr(cid: str, out: str = "out", name: str = "t") -> ToolResultPart:
    return ToolResultPart(cid, name, out)


def exchange(cid: str) -> list[Message]:
    return [Message.assistant("", [tc(cid)]), Message.from_tool_results([tr(cid)])]


def texts(n: int, start: int = 0) -> list[Message]:
    return [Message.user(f"u{i}") if i % 2 == 0 else Message.assistant(f"a{i}") for i in range(start, start + n)]


# -- truncation ----------------------------------------------------------------------


def test_short_conversation_left_alone() -> None:
    msgs = texts(6)
    assert TruncatingCompactor().compact(msgs) is msgs
    assert TruncatingCompactor(min_messages=2).compact(texts(2)) is not None


def test_keeps_first_and_recent_tail() -> None:
    msgs = texts(20)
    out = TruncatingCompactor().compact(msgs)
    assert out[0] is msgs[0]
    assert list(out[1:]) == msgs[-4:]


def test_split_moves_earlier_so_a_pair_is_not_split() -> None:
    msgs = texts(10) + exchange("c1") + texts(3, 10)
    # len 15; split at 11 would cut c1's call (index 10) from its result (11)
    assert safe_split(msgs, 4) == 10
    out = TruncatingCompactor().compact(msgs)
    assert out[1].tool_calls[0].id == "c1"
    assert out[2].tool_results[0].tool_call_id == "c1"
    assert len(out) == 1 + 5


def test_nested_straddles_resolve() -> None:
    # call c1 at 8, call c2 at 9, c2's result at 10, c1's result at 11, then text
    msgs = texts(8) + [
        Message.assistant("", [tc("c1")]),
        Message.assistant("", [tc("c2")]),
        Message.from_tool_results([tr("c2")]),
        Message.from_tool_results([tr("c1")]),
    ] + texts(2, 20)
    assert safe_split(msgs, 3) == 8  # 11 straddles c1 -> 8
    assert safe_split(msgs, 4) == 8  # 10 straddles c1 and c2 -> 8
    assert safe_split(msgs, 2) == 12  # nothing straddles


def test_split_reaching_the_first_message_returns_unchanged() -> None:
    msgs = [Message.user("goal"), Message.assistant("", [tc(f"c{i}") for i in range(3)])] + texts(6, 2) + [
        Message.from_tool_results([tr("c0"), tr("c1"), tr("c2")])
    ]
    # the only pair spans index 1..8: the split is pushed to 1 -> nothing to drop
    c = TruncatingCompactor(preserve_recent=2, min_messages=2)
    assert c.compact(msgs) is msgs


def test_results_of_calls_in_first_message_are_reattached() -> None:
    first = Message.assistant("start", [tc("f1")])
    msgs = [first, Message.from_tool_results([tr("f1", "first result")])] + texts(10, 2)
    out = TruncatingCompactor().compact(msgs)
    assert out[0] is first
    assert out[1].role is Role.USER and out[1].tool_results == [tr("f1", "first result")]
    assert list(out[2:]) == msgs[-4:]


def test_orphan_results_dropped_and_empty_messages_removed() -> None:
    msgs = texts(8) + [Message.from_tool_results([tr("ghost")]), Message.user("after")] + texts(2, 30)
    out = TruncatingCompactor(preserve_recent=4).compact(msgs)
    assert all(not m.tool_results for m in out)
    assert [m.text for m in out] == ["u0", "after", "u30", "a31"]


def test_mixed_orphan_in_kept_message_keeps_its_text() -> None:
    mixed = Message(Role.USER, (tr("ghost"), TextPart("keep me")))
    msgs = texts(10) + [mixed] + texts(2, 40)
    out = TruncatingCompactor(preserve_recent=3).compact(msgs)
    assert out[1].parts == (TextPart("keep me"),)


def test_target_shrinks_the_tail() -> None:
    big = [Message.user("x" * 4000) for _ in range(10)]
    msgs = [Message.user("goal")] + big
    counter = HeuristicTokenCounter()
    out = TruncatingCompactor().compact(msgs, CompactionRequest(target=2500, counter=counter))
    assert len(out) == 3  # first + 2 big (1004 tokens each)
    out1 = TruncatingCompactor().compact(msgs, CompactionRequest(target=10, counter=counter))
    assert len(out1) == 2  # never below one recent message


def test_extra_context_inserted_after_first() -> None:
    msgs = texts(12)
    out = TruncatingCompactor().compact(msgs, CompactionRequest(extra_context="keep: file.py"))
    assert out[1].text == f"{EXTRA_CONTEXT_PREFIX}\nkeep: file.py"
    assert list(out[2:]) == msgs[-4:]


@pytest.mark.parametrize("kwargs, bad", [({"preserve_recent": 0}, "0"), ({"min_messages": 1}, "1")])
def test_truncating_validates(kwargs: dict[str, Any], bad: str) -> None:
    with pytest.raises(ConfigError, match=bad):
        TruncatingCompactor(**kwargs)


# -- the pair-safety property ---------------------------------------------------------


@st.composite
def conversations(draw: Any, unique_ids: bool = True) -> list[Message]:
    ids = iter(range(10_000))
    msgs: list[Message] = []
    if draw(st.booleans()):
        msgs.append(Message.user("goal"))
    else:  # a first message with its own calls (a resumed history)
        k = draw(st.integers(1, 2))
        calls = [tc(f"id{next(ids)}") for _ in range(k)]
        msgs.append(Message.assistant("plan", calls))
        msgs.append(Message.from_tool_results([tr(c.id) for c in calls]))
    for _ in range(draw(st.integers(0, 25))):
        kind = draw(st.sampled_from(["text", "text", "tools", "tools", "split", "orphan"]))
        if kind == "text":
            msgs.append(Message.user("u") if draw(st.booleans()) else Message.assistant("a"))
        elif kind == "orphan":
            msgs.append(Message.from_tool_results([tr(f"ghost{next(ids)}")]))
        else:
            k = draw(st.integers(1, 3))
            names = [f"id{next(ids)}" if unique_ids else f"id{draw(st.integers(0, 2))}" for _ in range(k)]
            calls = [tc(n) for n in names]
            msgs.append(Message.assistant(draw(st.sampled_from(["", "thinking aloud"])), calls))
            results = [tr(c.id) for c in calls]
            if kind == "split" and k > 1:  # results arrive in two messages around a steer
                msgs.append(Message.from_tool_results(results[:1]))
                msgs.append(Message.user("steer"))
                msgs.append(Message.from_tool_results(results[1:]))
            else:
                msgs.append(Message.from_tool_results(draw(st.permutations(results))))
    return msgs


def _assert_pair_safe(original: list[Message], out: list[Message]) -> None:
    assert out, "never empty"
    assert out[0] is original[0], "first message kept"
    assert len(out) <= len(original)
    pairs, orphans = tool_pairs(out)
    # no orphan tool result (the first message is kept verbatim, so exempt it)
    assert not [o for o in orphans if o[0] != 0]
    # a call kept without its result only when the original had no result for it
    orig_pairs, _ = tool_pairs(original)
    answered = Counter(p.id for c, _ in orig_pairs for p in original[c].parts if type(p) is ToolCallPart)
    calls_out = Counter(p.id for m in out for p in m.parts if type(p) is ToolCallPart)
    results_out = Counter(p.tool_call_id for m in out for p in m.parts if type(p) is ToolResultPart)
    for cid, n in calls_out.items():
        assert results_out[cid] >= min(n, answered[cid]), f"call {cid} separated from its result"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(), st.integers(1, 6), st.integers(2, 8))
def test_truncation_is_pair_safe(msgs: list[Message], keep: int, min_messages: int) -> None:
    result = TruncatingCompactor(keep, min_messages).compact(msgs)
    if len(msgs) <= min_messages:
        assert result is msgs
    if result is not msgs:  # "nothing to do" hands the input back as it was
        _assert_pair_safe(msgs, list(result))


@settings(max_examples=100, deadline=None)
@given(conversations(unique_ids=False), st.integers(1, 6))
def test_truncation_pair_safe_with_reused_ids(msgs: list[Message], keep: int) -> None:
    result = TruncatingCompactor(keep, 2).compact(msgs)
    out = list(result)
    assert out and out[0] is msgs[0]
    if result is msgs:
        return
    _, orphans = tool_pairs(out)
    assert not [o for o in orphans if o[0] != 0]


@settings(max_examples=150, deadline=None)
@given(conversations(), st.integers(1, 6), st.booleans())
def test_summarizing_is_pair_safe(msgs: list[Message], keep: int, fail: bool) -> None:
    def summarize(req: ModelRequest) -> ModelResponse:
        if fail:
            raise ModelError("down")
        return reply("a summary")

    result = SummarizingCompactor(keep, 2).compact(msgs, CompactionRequest(summarize=summarize))
    if result is not msgs:
        _assert_pair_safe(msgs, list(result))


# -- summarizing ----------------------------------------------------------------------


def _conv() -> list[Message]:
    return [Message.user("the objective")] + texts(6, 1) + exchange("c9") + texts(6, 20)


def test_summary_replaces_older_part_and_keeps_tail_verbatim() -> None:
    msgs = _conv()
    seen: list[ModelRequest] = []

    def summarize(req: ModelRequest) -> ModelResponse:
        seen.append(req)
        return reply("  they talked a lot  ")

    c = SummarizingCompactor(preserve_recent=6, min_messages=8)
    out = c.compact(msgs, CompactionRequest(summarize=summarize, instructions="keep file names", extra_context="x=1"))
    assert out[0] is msgs[0]
    assert out[1].role is Role.USER
    assert out[1].text == f"{SUMMARY_PREFIX}\nthey talked a lot\n\n{EXTRA_CONTEXT_PREFIX}\nx=1"
    assert list(out[2:]) == msgs[-6:]
    (req,) = seen
    body = req.messages[0].text
    assert "keep file names" in body
    assert "assistant called t with" in body and "tool t result: out" in body  # the pair is rendered
    assert "the objective" not in body  # the first message is kept, not summarized
    assert req.tools == () and req.options is not None and req.options.max_tokens == 1024


@pytest.mark.parametrize(
    "summarize",
    [None, lambda r: (_ for _ in ()).throw(ModelError("down")), lambda r: reply("   ")],
    ids=["no-model", "call-fails", "empty-summary"],
)
def test_summary_failure_falls_back_to_truncation(summarize: Any, caplog: pytest.LogCaptureFixture) -> None:
    msgs = _conv()
    out = SummarizingCompactor(preserve_recent=6, min_messages=8).compact(msgs, CompactionRequest(summarize=summarize))
    assert out[0] is msgs[0]
    assert list(out[1:]) == msgs[-6:]
    assert "truncating instead" in caplog.text


def test_summarizing_short_conversation_untouched_and_validation() -> None:
    msgs = texts(8)
    assert SummarizingCompactor().compact(msgs, CompactionRequest(summarize=lambda r: reply("s"))) is msgs
    with pytest.raises(ConfigError, match="max_summary_tokens"):
        SummarizingCompactor(max_summary_tokens=1)
    with pytest.raises(ConfigError, match="prompt"):
        SummarizingCompactor(prompt="  ")


def test_render_transcript_cuts_oldest_first() -> None:
    msgs = [Message.user("A" * 3000), Message.user("the newest words")]
    text = render_transcript(msgs, 1000)
    assert text.startswith("[...earlier part cut...]") and text.endswith("the newest words")
