"""The metric instruments ``OTelObserver`` records into, made once per observer.

Two histograms of the GenAI conventions (``gen_ai.client.token.usage``,
``gen_ai.client.operation.duration``) with the bucket boundaries the
conventions advise, and loopctl's own: runs started, runs ended by outcome,
and cancel latency (from the cancel request to the run's end).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.metrics import Meter

from . import conventions as cv


def _histogram(meter: Meter, name: str, unit: str, description: str, buckets: Sequence[float]) -> Any:
    try:
        return meter.create_histogram(
            name, unit=unit, description=description, explicit_bucket_boundaries_advisory=buckets
        )
    except TypeError:  # an opentelemetry-api older than 1.23: no bucket advice
        return meter.create_histogram(name, unit=unit, description=description)


class Instruments:
    """The observer's counters and histograms."""

    def __init__(self, meter: Meter) -> None:
        self.token_usage = _histogram(
            meter, cv.METRIC_TOKEN_USAGE, "{token}", "Number of input and output tokens used.", cv.TOKEN_BUCKETS
        )
        self.duration = _histogram(
            meter, cv.METRIC_DURATION, "s", "GenAI operation duration.", cv.DURATION_BUCKETS
        )
        self.cancel_latency = _histogram(
            meter,
            cv.METRIC_CANCEL_LATENCY,
            "s",
            "Time from a run's cancel request to the end of the run.",
            cv.CANCEL_BUCKETS,
        )
        self.runs_started = meter.create_counter(
            cv.METRIC_RUNS_STARTED, unit="{run}", description="Agent runs started."
        )
        self.runs_ended = meter.create_counter(
            cv.METRIC_RUNS_ENDED, unit="{run}", description="Agent runs ended, by outcome."
        )


__all__ = ["Instruments"]
