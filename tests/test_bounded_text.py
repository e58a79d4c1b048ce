"""Untrusted text is quoted in bounded excerpts, masked even when split, and JSON stays JSON.

A typed answer with a megabyte-long unknown key must not make a megabyte
error message or event; a key the model streams in pieces is masked whole
however the pieces fall; a value the model sends as ``NaN``/``Infinity``
(Python's ``json`` reads both) never reaches an outlet's JSON as such.
"""

from __future__ import annotations

import json
import random

import attrs
import pytest
from support import Echo, Recorder

from loopctl import BareLoop, LoopDetected, OutputValidationError, RunConfig
from loopctl.hosting.registry import RunRegistry
from loopctl.hosting.serialization import error_to_dict
from loopctl.observers import OutputValidationFailed, RunEnd, ToolCallReceived
from loopctl.testing import ScriptedClient, calls, reply
from loopctl.text import StreamMask

EXCERPT_LIMIT = 2048  # loopctl.text.EXCERPT_LIMIT, the bound the issue asks for
MESSAGE_LIMIT = 2 * EXCERPT_LIMIT
SLACK = 64  # the "... (N more characters)" note
HUGE = "k" * 1_000_000


@attrs.frozen
class Answer:
    """A typed answer."""

    value: int


def test_a_megabyte_unknown_key_gives_bounded_error_and_events() -> None:
    bad = json.dumps({"value": 1, HUGE: 2})
    recorder = Recorder()
    with BareLoop(ScriptedClient([reply(bad)])) as loop:
        loop.register_observer(recorder)
        with pytest.raises(OutputValidationError) as info:
            loop.run("hi", RunConfig(output_retries=0), output_type=Answer)
    err = info.value
    assert "unknown field" in str(err)
    assert len(str(err)) <= MESSAGE_LIMIT + SLACK
    assert err.errors and all(len(e) <= EXCERPT_LIMIT + SLACK for e in err.errors)
    assert len(json.dumps(error_to_dict(err)["message"])) <= MESSAGE_LIMIT + SLACK
    failed = recorder.of(OutputValidationFailed)
    assert failed and all(len(e) <= EXCERPT_LIMIT + SLACK for ev in failed for e in ev.errors)
    assert all(len(json.dumps(ev.to_dict())) <= 4 * EXCERPT_LIMIT for ev in failed)
    (end,) = recorder.of(RunEnd)
    assert end.error is not None and len(end.error) <= EXCERPT_LIMIT + SLACK


def test_an_error_quoting_a_megabyte_is_bounded_wherever_it_is_made() -> None:
    err = LoopDetected(f"tool input {HUGE}")
    assert len(str(err)) <= MESSAGE_LIMIT + SLACK
    assert len(err.detail) <= EXCERPT_LIMIT + SLACK
    assert str(err).endswith(" more characters)")  # says how much was left out


def test_names_that_merely_look_like_keys_are_left_alone() -> None:
    from loopctl.text import redact

    text = "called key-value-store-lookup, risk-free task-list, sklearn"
    assert redact(text) == text
    assert redact("key-3ax6xnjp29jd6fds4gc373sgvjxteol0") == "<redacted>"


@pytest.mark.parametrize("seed", range(5))
def test_the_quick_check_before_the_key_pattern_never_skips_a_key(seed: int) -> None:
    # redact() runs the key pattern only on texts holding "k-", "key-" or
    # "earer": on texts built from key fragments and near misses it must
    # mask exactly what the bare pattern masks, and mask every key it meets.
    from loopctl.text import _KEY_SHAPES, REDACTED, redact, redact_key_shapes

    rng = random.Random(seed)
    bits = ["sk-", "sk-ant-", "pk-", "rk-", "key-", "Bearer ", "bearer\t", "earer ", "k-", "ey-", "-", "_", " ",
            "a", "Z", "7", "ABCDEFGHIJ", "0123456789", "risk-free", "task", ".", "~", "*", "\n", "Key-", "BEARER "]
    masked = 0
    for _ in range(3000):
        text = "".join(rng.choice(bits) for _ in range(rng.randint(1, 14)))
        expected = _KEY_SHAPES.sub(REDACTED, text)
        assert redact(text) == expected, text
        assert redact_key_shapes(text) == expected, text
        masked += expected != text
    assert masked > 100  # the corpus does hold keys: the check is not vacuous


def test_a_registered_key_inside_a_longer_key_shaped_token_leaves_no_tail() -> None:
    from loopctl.providers.secrets import Secret
    from loopctl.text import redact

    secret = Secret("sk-REGISTERED-123")
    assert redact("echo sk-REGISTERED-1234567-0 done") == "echo <redacted> done"
    assert secret.redact("echo sk-REGISTERED-1234567-0 done") == "echo <redacted> done"


def test_quote_masks_a_key_cut_by_the_excerpt() -> None:
    from loopctl.text import excerpt, quote

    text = "x" * (EXCERPT_LIMIT - 5) + " sk-abcdefghijklmnop " + "y" * 5000
    shown = quote(text)
    assert "sk-abc" not in shown and "<redacted>" in shown
    assert len(shown) <= EXCERPT_LIMIT + SLACK
    assert excerpt("short") == "short"


class _Owner:
    """Holds a registered secret for as long as a test keeps it."""


def test_a_registered_key_cut_by_an_excerpt_is_never_half_shown() -> None:
    from loopctl.text import REDACTED, masked_head, register_secrets, whole_cut

    owner = _Owner()
    key = "cutKEYvalue-9f8e7d6c"  # not key-shaped: only its registration masks it
    long_key = "L" + "0123456789" * 40  # longer than the 256 characters masked past a cut
    register_secrets(owner, [key, long_key])
    text = "a" * 30 + key + "b" * 5000
    for limit in range(31, 30 + len(key)):  # every cut that splits the key
        head = masked_head(text, limit)
        assert key[:4] not in head and head.startswith("a" * 30 + REDACTED)
        assert len(head) < limit + len(REDACTED)  # a mask at the cut is kept whole, never "<reda"
        assert text[: whole_cut(text, limit)] == "a" * 30
    assert masked_head("c" * 100 + long_key, 110) == "c" * 100 + REDACTED
    assert whole_cut("c" * 100 + long_key + "d", 110) == 100
    assert masked_head("a" * 30 + key, 12) == "a" * 12  # a cut before the key keeps what it keeps
    del owner


def test_validation_and_limit_messages_mask_before_they_cut() -> None:
    from loopctl.text import register_secrets
    from loopctl.tools.jsonvalues import show
    from loopctl.tools.middleware import truncate

    owner = _Owner()
    key = "showKEYvalue-1a2b3c4d"
    register_secrets(owner, [key])
    value = "x" * 20 + key + "y" * 100
    for shown in (show(value), show({"k": value}), show([1, {"k": [value]}]), show(("t", value))):
        assert key[:6] not in shown, shown
    assert show("short") == "'short'" and len(show("z" * 500)) == 40
    out = truncate("w" * 40 + key + "v" * 200, 60)
    assert key[:6] not in out and out == "w" * 40 + "\n[truncated]"
    del owner


@pytest.mark.parametrize("seed", range(200))
def test_a_key_split_across_stream_pieces_is_masked_whole(seed: int) -> None:
    from loopctl.text import StreamMask, redact

    rng = random.Random(seed)
    text = (
        f"first {'word ' * rng.randint(0, 5)}sk-ant-api03-{'Q' * rng.randint(6, 40)} then "
        f"Authorization: Bearer {'t' * rng.randint(8, 30)}.x and key-{'z' * 14}7! end"
    )
    mask = StreamMask()
    out: list[str] = []
    i = 0
    while i < len(text):
        n = rng.randint(1, 7)
        out.append(mask.feed(text[i : i + n]))
        i += n
    out.append(mask.flush())
    joined = "".join(out)
    assert joined == redact(text)
    assert "api03" not in joined and "Bearer t" not in joined and "key-zz" not in joined


def test_non_finite_numbers_never_reach_json_outlets() -> None:
    recorder = Recorder()
    client = ScriptedClient([calls(("echo", {"x": float("nan"), "y": float("inf")})), reply("done")])
    # Non-streaming: the scripted client hands the values over as they are (a streamed
    # reply's argument text with NaN is refused as invalid JSON before any outlet).
    with BareLoop(client, [Echo()]).with_turn_mode("non_streaming") as loop:
        loop.register_observer(recorder)
        run = loop.run("hi")
    (received,) = recorder.of(ToolCallReceived)
    assert received.to_dict()["input"] == {"x": None, "y": None}
    for ev in recorder.snapshot():
        json.dumps(ev.to_dict(), allow_nan=False)
    json.dumps(run.to_dict(), allow_nan=False)

    # A typed answer of Infinity is not a JSON number: it is asked again, never kept.
    registry = RunRegistry()
    loop = BareLoop(ScriptedClient([reply('Infinity'), reply('{"result": 2.5}')]))
    try:
        rid = registry.start(loop, "hi", output_type=float)
        assert registry.result(rid, timeout=20).output_value == 2.5
        status = registry.status(rid).to_dict()
        assert status["output_value"] == 2.5
        json.dumps(status, allow_nan=False)
        events = [ev for _, ev in registry.events(rid, timeout=5)]
        assert [ev["type"] for ev in events].count("output_validation_failed") == 1
        json.dumps(events, allow_nan=False)
    finally:
        registry.close()
        loop.close()


@pytest.mark.parametrize("seed", range(50))
def test_a_registered_secret_with_spaces_split_across_pieces_is_masked_whole(seed: int) -> None:
    from loopctl.providers.secrets import Secret
    from loopctl.text import StreamMask, redact

    secret = Secret("open sesame 4242 please")
    rng = random.Random(seed)
    text = f"{'w ' * rng.randint(0, 9)}the phrase is open sesame 4242 please, ok"
    mask = StreamMask()
    out = []
    i = 0
    while i < len(text):
        n = rng.randint(1, 6)
        out.append(mask.feed(text[i : i + n]))
        i += n
    out.append(mask.flush())
    assert "".join(out) == redact(text) and "sesame" not in "".join(out)
    assert secret  # alive while masking: its forms stay registered


def test_a_stream_holds_back_only_what_could_still_become_a_key() -> None:
    # An ordinary word at the end of a piece goes out at once: a reply paused
    # mid-sentence shows its last word; a possible key start waits for more.
    mask = StreamMask()
    assert mask.feed("this first line is still being") == "this first line is still being"
    assert mask.feed(" written. The key is sk") == " written. The key is "
    assert mask.feed("-SECRETSECRET123 ok") == "<redacted> ok"
    assert mask.feed(" Bearer") == " "
    assert mask.feed(" abcdefghijkl") == ""
    assert mask.flush() == "<redacted>"


@pytest.mark.parametrize("piece", [1, 7, 50, 300, 1000])
def test_a_token_longer_than_the_held_limit_is_masked_to_its_end(piece: int) -> None:
    # A bearer token (a JWT) longer than what the mask holds back: no tail of it leaks.
    text = "Authorization: Bearer eyJ" + "A" * 600 + ".sig-" + "B" * 300 + " done"
    mask = StreamMask()
    out = "".join(mask.feed(text[i : i + piece]) for i in range(0, len(text), piece)) + mask.flush()
    assert out == "Authorization: <redacted> done"
