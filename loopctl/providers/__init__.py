"""The wire: model clients over ``requests``; knows messages, never the loop."""

from __future__ import annotations

from loopctl.providers.base import ModelClient, ModelStream
from loopctl.providers.stream_handler import StreamHandler

__all__ = ["ModelClient", "ModelStream", "StreamHandler"]
