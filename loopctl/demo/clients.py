"""The model client the command's options ask for.

``--provider offline`` is the scripted demo model; ``openai`` and
``anthropic`` import their clients lazily, check that a key is set (or a
``--base-url`` points elsewhere) and take the model from ``--model``, then
the provider's environment variable, then a default.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

from loopctl.demo.model import OfflineModel
from loopctl.demo.wording import check_key
from loopctl.errors import ConfigError

_DEFAULT_MODELS = {"openai": ("OPENAI_MODEL", "gpt-4o-mini"),
                   "anthropic": ("ANTHROPIC_MODEL", "claude-sonnet-4-20250514")}


def make_client(args: argparse.Namespace, env: Mapping[str, str], *, visible: bool = False) -> Any:
    """The model client the options ask for (remote providers import lazily).

    Raises:
        ConfigError: the provider is not available or refuses its settings.
    """
    if args.provider == "offline":
        delay = args.delay if args.delay is not None else (0.01 if visible else 0.0)
        return OfflineModel(args.model or "loopctl-offline", delay=delay)
    try:
        import loopctl.providers as providers

        cls = getattr(providers, "OpenAIClient" if args.provider == "openai" else "AnthropicClient")
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"provider {args.provider!r} is not available: {exc}") from exc
    check_key(args.provider, args.base_url, env, os.environ)
    var, default = _DEFAULT_MODELS[args.provider]
    kwargs: dict[str, Any] = {"model": args.model or env.get(var) or default}
    if args.base_url:
        kwargs["base_url"] = args.base_url
    return cls(**kwargs)


__all__ = ["make_client"]
