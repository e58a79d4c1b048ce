"""ContextManager policy, and compaction through the loop (handlers 1 and 3).

Sizes use the default ``HeuristicTokenCounter`` (4 chars/token, 4 tokens of
framing per message): a message of ``c`` characters costs ``4 + ceil(c/4)``.
"""

from __future__ import annotations

import threading
from typing import Any, Mapping, Optional

import pytest

from loopctl import BareLoop, Cancelled, ContextExceeded, SessionConfig
from loopctl.context import (
    ContextManager,
    ContributorContext,
    HeuristicTokenCounter,
    SummarizingCompactor,
    TruncatingCompactor,
    UsageCalibration,
    count_messages,
)
from loopctl.context.compactors import EXTRA_CONTEXT_PREFIX, SUMMARY_PREFIX, CompactionRequest
from loopctl.errors import ConfigError, ContextOverflow, ModelError
from loopctl.hooks import CompactHookContext, Hook, HookExecutor, PreCompactDecision
from loopctl.messages import Message, ModelRequest, ModelResponse
from loopctl.observers import CallbackObserver, Compaction, Event, TurnEnd
from loopctl.testing import ScriptedClient, call, reply
from loopctl.tools import Tool, ToolContext

WAIT = 10.0
C = HeuristicTokenCounter()


def history(n: int, chars: int) -> list[Message]:
    out = []
    for i in range(n):
        body = f"{i:04d}" + "x" * (chars - 4)
        out.append(Message.user(body) if i % 2 == 0 else Message.assistant(body))
    return out


def observed(loop: BareLoop) -> list[Event]:
    events: list[Event] = []
    loop.register_observer(CallbackObserver(events.append))
    return events


def request_tokens(req: ModelRequest) -> int:
    return count_messages(C, req.messages)


# -- the manager ----------------------------------------------------------------------


def test_policy_figures_and_validation() -> None:
    m = ContextManager(TruncatingCompactor())
    assert (m.threshold_tokens, m.target_tokens) == (160_000, 112_000)
    assert ContextManager(TruncatingCompactor(), 1000, 50, target_pct=50).target_tokens == 250
    cases: list[tuple[dict[str, Any], str]] = [
        ({"context_window": -1}, "-1"),
        ({"compact_threshold": 101}, "101"),
        ({"target_pct": 0}, "target_pct"),
    ]
    for kwargs, bad in cases:
        with pytest.raises(ConfigError, match=bad):
            ContextManager(TruncatingCompactor(), **kwargs)
    with pytest.raises(ConfigError, match="compact"):
        ContextManager(object())  # type: ignore[arg-type]


def test_nothing_to_do_is_none() -> None:
    m = ContextManager(TruncatingCompactor(), 10_000)
    assert m.compact(history(5, 100), reason="threshold", reserved=0, instructions=None, extra_context=None, summarize=None) is None

    class SameSize:
        def compact(self, messages: Any, request: CompactionRequest) -> list[Message]:
            return list(messages)  # a copy, same length and tokens

    m2 = ContextManager(SameSize(), 10_000)
    assert m2.compact(history(9, 100), reason="threshold", reserved=0, instructions=None, extra_context=None, summarize=None) is None


def test_result_that_does_not_fit_raises_context_exceeded() -> None:
    m = ContextManager(TruncatingCompactor(), context_window=1000)
    msgs = history(10, 2000)  # each message 504 tokens; even one recent one + first > 1000
    with pytest.raises(ContextExceeded) as info:
        m.compact(msgs, reason="threshold", reserved=0, instructions=None, extra_context=None, summarize=None)
    assert info.value.limit == 1000 and info.value.used == 1008
    # reserved tokens count against the fit
    small = history(10, 100)  # 29 tokens each -> first + 1 recent = 58
    assert m.compact(small, reason="threshold", reserved=900, instructions=None, extra_context=None, summarize=None)
    with pytest.raises(ContextExceeded, match="limit 1000"):
        m.compact(small, reason="threshold", reserved=990, instructions=None, extra_context=None, summarize=None)


def test_compactor_failure_is_context_exceeded_chained() -> None:
    class Broken:
        def compact(self, messages: Any, request: CompactionRequest) -> list[Message]:
            raise RuntimeError("compactor bug")

    m = ContextManager(Broken(), 10_000)
    with pytest.raises(ContextExceeded) as info:
        m.compact(history(10, 10), reason="threshold", reserved=0, instructions=None, extra_context=None, summarize=None)
    assert isinstance(info.value.__cause__, RuntimeError)


def test_target_reserved_and_emergency_halving_reach_the_compactor() -> None:
    seen: list[CompactionRequest] = []

    class Spy:
        def compact(self, messages: Any, request: CompactionRequest) -> Any:
            seen.append(request)
            return messages

    m = ContextManager(Spy(), context_window=10_000, compact_threshold=80)
    msgs = history(10, 396)  # 10 x 103 = 1030 tokens
    m.compact(msgs, reason="threshold", reserved=600, instructions="i", extra_context="e", summarize=None)
    assert seen[-1].target == 5600 - 600
    assert (seen[-1].instructions, seen[-1].extra_context, seen[-1].reason) == ("i", "e", "threshold")
    m.compact(msgs, reason="emergency", reserved=600, instructions=None, extra_context=None, summarize=None)
    assert seen[-1].target == (1030 + 600) // 2 - 600


def test_calibration_scale_applies_to_fit_and_target() -> None:
    cal = UsageCalibration()
    cal.note_prediction(100)
    cal.observe(200)  # the provider counts twice what we estimate
    seen: list[Optional[int]] = []

    class Spy(TruncatingCompactor):
        def compact(self, messages: Any, request: Optional[CompactionRequest] = None) -> Any:
            assert request is not None
            seen.append(request.target)
            return super().compact(messages, request)

    m = ContextManager(Spy(), context_window=1000, compact_threshold=80)
    msgs = history(10, 400)  # 104 tokens raw each
    out = m.compact(msgs, reason="threshold", reserved=0, instructions=None, extra_context=None, summarize=None, scale=cal.scale)
    assert seen == [280]  # 1000*80%*70% = 560 calibrated = 280 raw
    assert out is not None and len(out) == 2  # first + 2 recent = 312 raw > 280: the tail shrinks to one
    # first + 1 recent = 208 raw = 416 calibrated: over a 400 window only once scaled
    with pytest.raises(ContextExceeded, match="416 tokens used, limit 400"):
        ContextManager(TruncatingCompactor(), 400).compact(
            history(10, 400), reason="threshold", reserved=0, instructions=None, extra_context=None, summarize=None, scale=cal.scale
        )


# -- through the loop: deferral -------------------------------------------------------


class Big:
    """A contributor whose message is ``chars`` long; counts its calls."""

    def __init__(self, chars: int) -> None:
        self.chars = chars
        self.turns: list[int] = []

    def contribute(self, ctx: ContributorContext) -> Message:
        self.turns.append(ctx.turn)
        return Message.user("EXTRA" + "y" * (self.chars - 5))


def test_contributor_pushing_over_the_line_defers_the_turn_and_compacts_first() -> None:
    cfg = SessionConfig(context_window=10_000, compact_threshold=80)
    hist = history(20, 1200)  # 20 x 304 = 6080 tokens: under the 8000 line on its own
    client = ScriptedClient([reply("done")])
    big = Big(8000)  # 2004 tokens: together over the line
    loop = BareLoop(client, config=cfg, history=hist).with_contributor(big)
    events = observed(loop)
    assert loop.run("go").output == "done"

    kinds = [type(e).__name__ for e in events]
    assert kinds.count("TurnStart") == 1 and kinds.count("TurnEnd") == 1  # nothing for the deferred attempt
    assert kinds.index("Compaction") < kinds.index("TurnStart")
    (comp,) = [e for e in events if isinstance(e, Compaction)]
    assert comp.reason == "threshold" and comp.tokens_after < comp.tokens_before
    assert big.turns == [0, 0]  # consulted for the deferred attempt and again for the retry
    (req,) = client.requests
    assert req.messages[0].text.startswith("EXTRA")  # fresh extras on the retry
    assert request_tokens(req) <= 8000  # the retried request fits under the line
    assert req.messages[1] == hist[0]  # the first message survived
    assert all(not m.text.startswith("EXTRA") for m in loop.conversation())


def test_deferral_reserves_room_for_the_extras() -> None:
    # Conversation alone fits the window after any truncation, but only a
    # compaction that leaves room for the 2004-token extras keeps the retry under.
    cfg = SessionConfig(context_window=10_000, compact_threshold=80)
    hist = history(30, 1200)  # 9120 tokens: already over the line
    seen: list[int] = []

    class Spy(ContextManager):
        def compact(self, messages: Any, **kw: Any) -> Any:
            seen.append(kw["reserved"])
            return super().compact(messages, **kw)

    client = ScriptedClient([reply("ok")])
    loop = (
        BareLoop(client, config=cfg, history=hist)
        .with_contributor(Big(8000))
        .with_context_manager(Spy(TruncatingCompactor(), 10_000, 80))
    )
    loop.run("go")
    assert seen == [2004]  # the extras' cost, reserved once
    assert request_tokens(client.requests[0]) <= 8000


def test_overflow_rejection_compacts_and_retries_once() -> None:
    cfg = SessionConfig(context_window=100_000)
    hist = history(12, 400)
    client = ScriptedClient([ContextOverflow("prompt is too long: 250000 tokens > 200000 maximum"), reply("ok")])
    loop = BareLoop(client, config=cfg, history=hist)
    events = observed(loop)
    assert loop.run("go").output == "ok"
    names = [type(e).__name__ for e in events if not type(e).__name__.endswith("Delta")]
    i = names.index("StreamFailure")
    assert names[i : i + 4] == ["StreamFailure", "TurnEnd", "Compaction", "TurnStart"]
    (comp,) = [e for e in events if isinstance(e, Compaction)]
    assert comp.reason == "emergency"
    assert len(client.requests[1].messages) < len(client.requests[0].messages)
    failed = [e for e in events if isinstance(e, TurnEnd) and not e.success]
    assert len(failed) == 1


def test_second_overflow_on_the_same_turn_is_context_exceeded() -> None:
    cfg = SessionConfig(context_window=100_000)
    client = ScriptedClient([ContextOverflow("maximum context length exceeded")] * 2)
    loop = BareLoop(client, config=cfg, history=history(12, 400))
    with pytest.raises(ContextExceeded) as info:
        loop.run("go")
    assert info.value.limit == 100_000  # the real window
    assert isinstance(info.value.__cause__, ContextOverflow)


def test_overflow_text_in_a_plain_model_error_is_not_an_overflow() -> None:
    """The driver recognises a ContextOverflow by type only, never by its text."""
    cfg = SessionConfig(context_window=100_000)
    client = ScriptedClient([ModelError("maximum context length exceeded"), reply("never")])
    loop = BareLoop(client, config=cfg, history=history(12, 400))
    with pytest.raises(ModelError, match="maximum context length"):
        loop.run("go")
    assert len(client.requests) == 1


# -- hooks --------------------------------------------------------------------------


class Recorder(Hook):
    def __init__(self, decision: Optional[PreCompactDecision] = None) -> None:
        self.decision = decision
        self.pre: list[CompactHookContext] = []
        self.post: list[int] = []

    def on_pre_compact(self, ctx: CompactHookContext) -> Optional[PreCompactDecision]:
        self.pre.append(ctx)
        return self.decision

    def on_post_compact(self, ctx: CompactHookContext, tokens_after: int) -> None:
        self.post.append(tokens_after)


def _over_line_loop(client: ScriptedClient, hook: Recorder, **kw: Any) -> BareLoop:
    cfg = SessionConfig(context_window=10_000, compact_threshold=80)
    return BareLoop(client, config=cfg, history=history(30, 1200)).with_hook_executor(HookExecutor([hook]))


def test_pre_compact_veto_ends_the_run_without_compaction_events() -> None:
    hook = Recorder(PreCompactDecision(abort=True))
    client = ScriptedClient([reply("never")])
    loop = _over_line_loop(client, hook)
    events = observed(loop)
    hist_before = loop.conversation()
    with pytest.raises(ContextExceeded):
        loop.run("go")
    assert len(hook.pre) == 1 and hook.pre[0].reason == "threshold" and hook.post == []
    assert not any(isinstance(e, Compaction) for e in events)
    assert client.requests == []
    assert loop.conversation() == hist_before


def test_hook_instructions_and_extra_context_reach_the_compactor() -> None:
    hook = Recorder(PreCompactDecision(instructions="keep the file names", extra_context="branch=main"))
    summaries: list[ModelRequest] = []

    def summarize(req: ModelRequest) -> ModelResponse:
        summaries.append(req)
        return reply("earlier: edited a.py")

    client = ScriptedClient([summarize, reply("done")])
    loop = _over_line_loop(client, hook)
    loop.set_context_manager(ContextManager(SummarizingCompactor(), 10_000, 80))
    events = observed(loop)
    loop.run("go")
    assert "keep the file names" in summaries[0].messages[0].text
    conv = loop.conversation()
    assert conv[1].text == f"{SUMMARY_PREFIX}\nearlier: edited a.py\n\n{EXTRA_CONTEXT_PREFIX}\nbranch=main"
    (comp,) = [e for e in events if isinstance(e, Compaction)]
    assert hook.post == [comp.tokens_after]
    assert client.requests[1].messages[1].text.startswith(SUMMARY_PREFIX)


# -- commit point and audit trail ------------------------------------------------------


class BigOutput(Tool):
    name = "dump"
    description = "returns a lot"

    def call(self, input: Mapping[str, Any], ctx: ToolContext) -> Any:
        return "z" * 30_000


def test_audit_trail_untouched_by_compaction() -> None:
    cfg = SessionConfig(context_window=10_000, compact_threshold=80)
    client = ScriptedClient([reply("first answer"), call("dump"), reply("second answer")])
    hist = history(10, 400)
    loop = BareLoop(client, [BigOutput()], config=cfg, history=hist)
    events = observed(loop)
    run1 = loop.run("first")
    snapshot = (run1.id, run1.input, run1.output, [t.to_dict() for t in run1.turns])
    run2 = loop.run("second")  # the 7504-token tool output crosses the line
    assert any(isinstance(e, Compaction) for e in events)
    conv = loop.conversation()
    assert not any(m.text == "first answer" for m in conv)  # compacted away from the conversation...
    assert (run1.id, run1.input, run1.output, [t.to_dict() for t in run1.turns]) == snapshot  # ...not from the audit trail
    assert loop.session.runs == [run1, run2]
    assert [t.output for t in run2.turns] == ["", "second answer"]


def test_commit_point_on_a_later_failure() -> None:
    cfg = SessionConfig(context_window=20_000, compact_threshold=40)
    client = ScriptedClient([call("dump"), ModelError("server exploded")])
    hist = history(10, 400)
    loop = BareLoop(client, [BigOutput()], config=cfg, history=hist)
    events = observed(loop)
    with pytest.raises(ModelError, match="server exploded"):
        loop.run("second")
    (comp,) = [e for e in events if isinstance(e, Compaction)]
    conv = loop.conversation()
    # the compacted conversation (with this run's tool exchange) survived the failure
    assert conv[0] == hist[0]
    assert conv[-1].tool_results and conv[-1].tool_results[0].output == "z" * 30_000
    assert conv[-2].tool_calls[0].name == "dump"
    assert len(conv) < len(hist) + 3
    run = loop.session.current_run
    assert run is not None and run.turns[0].tool_calls[0].name == "dump"  # audit trail kept


def test_no_compaction_without_crossing_and_none_manager_disables() -> None:
    client = ScriptedClient([reply("a")])
    loop = BareLoop(client, config=SessionConfig(context_window=10_000), history=history(10, 100))
    events = observed(loop)
    loop.run("go")
    assert not any(isinstance(e, Compaction) for e in events)
    client2 = ScriptedClient([reply("never")])
    loop2 = BareLoop(client2, config=SessionConfig(context_window=10_000), history=history(30, 1200))
    loop2.set_context_manager(None)
    with pytest.raises(ContextExceeded):
        loop2.run("go")


# -- cancel during a summarizing compaction ---------------------------------------------


def test_cancel_while_summarizing_keeps_the_uncompacted_history() -> None:
    entered = threading.Event()
    release = threading.Event()

    def slow_summary(req: ModelRequest) -> ModelResponse:
        entered.set()
        assert release.wait(WAIT)
        return reply("too late")

    cfg = SessionConfig(context_window=10_000, compact_threshold=80)
    hist = history(30, 1200)
    client = ScriptedClient([slow_summary, reply("never")])
    loop = BareLoop(client, config=cfg, history=hist)
    loop.set_context_manager(ContextManager(SummarizingCompactor(), 10_000, 80))
    events = observed(loop)
    handle = loop.start("go")
    try:
        assert entered.wait(WAIT)
        handle.cancel("user stop")
        with pytest.raises(Cancelled):
            handle.result(WAIT)
    finally:
        release.set()
    assert loop.conversation() == hist
    assert not any(isinstance(e, Compaction) for e in events)
    loop.close()


def test_a_result_too_big_to_compact_names_the_real_window() -> None:
    """A 5 MB tool result: no compaction makes progress; the error's limit is the window."""
    from loopctl import Tool
    from loopctl.testing import call

    class Huge(Tool):
        name = "huge"
        description = "Returns megabytes."

        def call(self, input: Any, ctx: Any) -> str:
            return "x" * 5_000_000

    cfg = SessionConfig(context_window=100_000)
    client = ScriptedClient([call("huge"), reply("never")])
    with BareLoop(client, [Huge()], cfg) as loop:
        with pytest.raises(ContextExceeded) as info:
            loop.run("go")
    assert info.value.limit == 100_000
    assert info.value.used > 1_000_000
    assert "limit 100000" in str(info.value)
