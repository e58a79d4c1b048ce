"""The wire: model clients over ``requests``; knows messages, never the loop.

``OpenAIClient`` (chat completions and compatible servers) and
``AnthropicClient`` (messages) speak the real wire formats; ``StreamHandler``
adds timeouts, retries, rate limits and the rescue around every model call.
"""

from __future__ import annotations

from loopctl.fallback import FallbackManager
from loopctl.providers.anthropic import AnthropicClient
from loopctl.providers.base import ModelClient, ModelStream
from loopctl.providers.openai import OpenAIClient
from loopctl.providers.stream_handler import StreamHandler

__all__ = [
    "AnthropicClient",
    "FallbackManager",
    "ModelClient",
    "ModelStream",
    "OpenAIClient",
    "StreamHandler",
]
