"""What the ``loopctl`` command says when a run fails, in a person's words.

The library's errors are written for the programmer calling it ("pass
api_key=", "the non-streaming rescue"); the command says instead what
failed, what it did about it, and what the person can do next. Nothing
here touches a loop; the texts carry no secret (the errors they read are
already redacted, and a key's value is never shown).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

from loopctl.errors import ConfigError, LoopError, MaxTurnsExceeded, ModelError

#: The environment variables the remote providers read (key, base URL).
PROVIDER_ENV = {"openai": ("OpenAI", "OPENAI_API_KEY", "OPENAI_BASE_URL"),
                "anthropic": ("Anthropic", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")}


def check_key(provider: str, base_url: Optional[str], *envs: Mapping[str, str]) -> None:
    """Refuse to start a run that could only fail for want of an API key.

    A server of one's own (``--base-url`` or the provider's base-URL
    variable) may need no key, so it is let through.

    Raises:
        ConfigError: the provider's key variable is unset (the message says
            which variable, and that the offline demo needs none).
    """
    if provider not in PROVIDER_ENV:
        return
    name, key_var, url_var = PROVIDER_ENV[provider]
    if base_url or any(env.get(key_var) or env.get(url_var) for env in envs):
        return
    raise ConfigError(
        f"no {name} API key: {key_var} is not set. Set it (export {key_var}=...) and run the "
        f"command again, or leave out --provider to try the offline demo model, which needs no key"
    )


def _advice(error: ModelError, base_url: Optional[str], provider: str) -> str:
    kind = getattr(error, "kind", None)
    key_var = PROVIDER_ENV.get(provider, ("", "the API key variable", ""))[1]
    where = "the --base-url address" if base_url else "your network connection"
    if kind == "rate_limit":
        return "The provider is limiting requests: wait a minute, then run the command again."
    if kind == "timeout":
        return f"The model did not answer in time: check {where}, then run the command again."
    if kind == "transport":
        return f"Check that the server is running and {where} is right, then run the command again."
    if error.status in (401, 403):
        return f"The provider refused the key: check {key_var}, then run the command again."
    if error.status == 404:
        return "Check the model name (--model) and the --base-url address, then run the command again."
    return "Run the command again; with --json it shows every event of the run."


def error_lines(error: LoopError, *, model: str, attempts: int = 1, rescued: bool = False,
                base_url: Optional[str] = None, provider: str = "offline") -> list[str]:
    """The lines the command prints for a run that failed (never for a cancel).

    Args:
        error: the run's error.
        model: the model's name as the person knows it.
        attempts: how many times the failing model call was tried.
        rescued: after the last try, one more was made without streaming.
        base_url: the ``--base-url`` given, if any.
        provider: the ``--provider`` given.
    """
    if isinstance(error, ModelError):
        cause = str(getattr(error, "summary", None) or str(error).split("\n", 1)[0])
        tried = f"tried {attempts} time{'s' if attempts != 1 else ''}" if attempts > 1 or rescued else ""
        if rescued:
            tried += (", then once more without streaming" if tried else "tried once more without streaming")
        first = f"error: no reply from {model}: {cause}" + (f" ({tried})." if tried else ".")
        return [first, f"  {_advice(error, base_url, provider)}"]
    if isinstance(error, MaxTurnsExceeded):
        calls = f"{error.max_turns} model call{'s' if error.max_turns != 1 else ''}"
        return [f"error: the run stopped after {calls} without a final answer.",
                "  Give it more with --max-turns N, or ask for something smaller."]
    return [f"error: {error}"]


__all__ = ["PROVIDER_ENV", "check_key", "error_lines"]
