"""Names and small pure helpers for the OpenTelemetry GenAI conventions.

Attribute, span and metric names follow the OpenTelemetry semantic
conventions for generative AI (``gen_ai.*``); what those conventions do
not cover (compaction, steering, cancel, the run's outcome) is named under
``loopctl.*``. Nothing here imports ``opentelemetry``: the names are plain
strings so the observer needs only ``opentelemetry-api`` at run time.

Error text from the loop may quote a provider's message, the model's reply
or a tool's input: without ``record_content`` only the messages of the
error classes in ``OWN_WORDS`` (loopctl's own words: counts, limits, model
names, a cancel's reason) are recorded, every other error says only its
class (``error_message``). Any text recorded is redacted (the loop's one
mask, ``loopctl.text.redact``, plus credential assignments) and cut short,
and the class is reduced to a low-cardinality ``error.type``.
"""

from __future__ import annotations

import re
from typing import Optional

from loopctl.messages import StopReason
from loopctl.text import redact as _redact_everywhere

# -- GenAI attributes ------------------------------------------------------------------------

OPERATION_NAME = "gen_ai.operation.name"
PROVIDER_NAME = "gen_ai.provider.name"
AGENT_NAME = "gen_ai.agent.name"
CONVERSATION_ID = "gen_ai.conversation.id"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
FINISH_REASONS = "gen_ai.response.finish_reasons"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_RESULT = "gen_ai.tool.call.result"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
TOKEN_TYPE = "gen_ai.token.type"
ERROR_TYPE = "error.type"

# -- loopctl attributes ----------------------------------------------------------------------

RUN_ID = "loopctl.run.id"
#: A sub-agent run's path under the run that called it ("research", "research/search").
SUBAGENT = "loopctl.subagent"
RUN_OUTCOME = "loopctl.run.outcome"
RUN_TURNS = "loopctl.run.turns"
TURN = "loopctl.turn"
ATTEMPT = "loopctl.attempt"
CANCELLED = "loopctl.cancelled"
TOOL_DURATION = "loopctl.tool.duration_ms"

# -- operations and span names ---------------------------------------------------------------

OP_AGENT = "invoke_agent"
OP_CHAT = "chat"
OP_TOOL = "execute_tool"

# -- span events (loopctl's own; the GenAI conventions define none of these) ------------------

EV_ATTEMPT_RESET = "loopctl.attempt_reset"
EV_HANDED_BACK = "loopctl.handed_back"
EV_RETRY = "loopctl.retry_scheduled"
EV_COMPACTION = "loopctl.compaction"
EV_STEERING = "loopctl.steering"
EV_CANCEL = "loopctl.cancel"
EV_FALLBACK = "loopctl.fallback"
EV_MODEL_SWITCHED = "loopctl.model_switched"
EV_LOOP_DETECTED = "loopctl.loop_detected"
EV_CONVERGENCE = "loopctl.convergence_detected"
EV_APPROVAL_REQUESTED = "loopctl.approval_requested"
EV_APPROVAL_RESOLVED = "loopctl.approval_resolved"
EV_EXCEPTION = "exception"  # the OpenTelemetry exception event

# -- metrics ------------------------------------------------------------------------------

METRIC_TOKEN_USAGE = "gen_ai.client.token.usage"
METRIC_DURATION = "gen_ai.client.operation.duration"
METRIC_RUNS_STARTED = "loopctl.runs.started"
METRIC_RUNS_ENDED = "loopctl.runs.ended"
METRIC_CANCEL_LATENCY = "loopctl.cancel.latency"

#: The bucket boundaries the GenAI conventions advise for token counts.
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
#: The bucket boundaries the GenAI conventions advise for durations (seconds).
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
#: Cancel latency buckets (seconds): the contract is 100 ms, so resolve below it.
CANCEL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

#: ``StopReason`` as the conventions' finish reasons.
FINISH_REASON_OF = {
    StopReason.END_TURN: "stop",
    StopReason.TOOL_CALL: "tool_call",
    StopReason.MAX_TOKENS: "length",
    StopReason.STOP_SEQUENCE: "stop",
}

# -- errors ---------------------------------------------------------------------------------

#: Recorded error text is cut to this many characters.
MAX_ERROR_CHARS = 300
#: Recorded content (opt-in) is cut to this many characters per attribute.
MAX_CONTENT_CHARS = 16384

_SECRET_SHAPES = re.compile(
    r"(?i)(\b(?:sk|pk|rk)-[A-Za-z0-9_\-*]{6,}"  # OpenAI-style keys
    r"|\bkey-[A-Za-z0-9_\-*]{12,}"
    r"|\bBearer\s+[A-Za-z0-9._~+/\-=]{8,}"  # an Authorization header value
    r"|\b(?:api[_-]?key|x-api-key|token|secret|password)\s*[=:]\s*[^\s,;&'\"]{4,})"
)

#: The LoopError classes whose messages have a fixed opening (errors.py), by that opening.
#: Each opening runs up to its first variable part, so that a server's or a
#: tool's free text ("run cancelled by the proxy") is not taken for one.
_ERROR_PREFIXES = (
    ("max turns exceeded: the run used all ", "MaxTurnsExceeded"),
    ("fallback exhausted: every model is down (", "FallbackExhausted"),
    ("context exceeded: ", "ContextExceeded"),
    ("loop detected: ", "LoopDetected"),
    ("user input required: ", "UserInputRequired"),
    ("output validation failed: ", "OutputValidationError"),
    ("rate limited after ", "RateLimitEscalation"),
)
_TOOL_EXHAUSTED = re.compile(r"^tool '.*' failed after \d+ attempts$", re.S)


#: ``loopctl.run.outcome`` of a run handed back to its queue (it goes on on another worker).
OUTCOME_HANDED_BACK = "handed_back"
#: On a resumed run's span: how many times it resumed, and why it last moved.
RUN_RESUMES = "loopctl.run.resumes"
RESUME_CAUSE = "loopctl.run.resume_cause"

#: Error classes whose messages are loopctl's own words, never content: their
#: text is recorded even without ``record_content``.
OWN_WORDS = frozenset((
    "Cancelled", "MaxTurnsExceeded", "FallbackExhausted", "ContextExceeded", "RateLimitEscalation",
    "ToolRecoveryExhausted", "LoopBusy", "ConfigError",
))


def error_message(kind: str, error: Optional[str], record_content: bool) -> str:
    """What a span may say of a failure of class ``kind`` whose text is ``error``.

    Without ``record_content`` an error that may quote content (a reply that
    did not fit, a repeated tool input, a server's or a tool's text) says
    only its class; else the text, redacted and cut short.
    """
    if record_content or kind in OWN_WORDS:
        return redact(error) or kind
    return f"{kind} (the message is recorded only with record_content=True)"


def redact(text: Optional[str]) -> str:
    """``text`` with anything credential-shaped masked, cut to ``MAX_ERROR_CHARS``."""
    if not text:
        return ""
    if len(text) > 4 * MAX_ERROR_CHARS:
        text = text[: 4 * MAX_ERROR_CHARS]  # bound the regex's work on a megabyte message
    return clean(text, MAX_ERROR_CHARS)


def clean(text: str, limit: int = MAX_CONTENT_CHARS) -> str:
    """Content made safe to export: cut to ``limit``, lone surrogates replaced, secrets masked.

    An exporter that encodes UTF-8 (OTLP) would fail on a lone surrogate, and
    a tool may return one.
    """
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    if not text.isascii():
        text = text.encode("utf-8", "replace").decode("utf-8")
    return _SECRET_SHAPES.sub("<redacted>", _redact_everywhere(text))


def error_type(text: Optional[str], default: str = "_OTHER") -> str:
    """A low-cardinality ``error.type`` for a loop error's message (its class name when known)."""
    if not text:
        return default
    if is_cancel_text(text):
        return "Cancelled"
    for prefix, name in _ERROR_PREFIXES:
        if text.startswith(prefix):
            return name
    if _TOOL_EXHAUSTED.match(text):
        return "ToolRecoveryExhausted"
    return default


def is_cancel_text(text: Optional[str]) -> bool:
    """True for a ``Cancelled`` error's message: ``"run cancelled"`` or ``"run cancelled: <reason>"``."""
    return text is not None and (text == "run cancelled" or text.startswith("run cancelled: "))


def cancel_reason(text: Optional[str]) -> Optional[str]:
    """The reason of a ``Cancelled`` message (``"run cancelled: <reason>"``), redacted."""
    if not text or not text.startswith("run cancelled: "):
        return None
    return redact(text[len("run cancelled: ") :])

