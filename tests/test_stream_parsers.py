"""At the parser boundary, well-formed JSON of the wrong shape becomes a ModelError."""

from __future__ import annotations

import pytest

from loopctl.errors import ModelError
from loopctl.providers.anthropic import AnthropicStreamParser
from loopctl.providers.openai import OpenAIStreamParser
from loopctl.providers.reader import feed_checked
from loopctl.providers.sse import SSEEvent


@pytest.mark.parametrize(
    "data",
    ['{"choices": [{"delta": "x"}]}', '{"choices": {"a": 1}}', '{"choices": [7]}'],
)
def test_openai_chunk_of_the_wrong_shape_is_a_model_error(data: str) -> None:
    with pytest.raises(ModelError, match="unexpected stream chunk shape") as info:
        feed_checked(OpenAIStreamParser("openai"), SSEEvent(data), "openai")
    assert info.value.__cause__ is not None


@pytest.mark.parametrize(
    "data",
    [
        '{"type": "content_block_delta", "delta": "x"}',
        '{"type": "content_block_start", "index": 0, "content_block": 5}',
    ],
)
def test_anthropic_event_of_the_wrong_shape_is_a_model_error(data: str) -> None:
    parser = AnthropicStreamParser("anthropic")
    parser.feed(SSEEvent('{"type": "message_start", "message": {"model": "m"}}', "message_start"))
    with pytest.raises(ModelError, match="unexpected stream chunk shape"):
        feed_checked(parser, SSEEvent(data, "content_block_delta"), "anthropic")
