"""Observer methods for model calls: each call becomes a ``chat {model}`` span when it ends.

A call's span opens on ``on_turn_start`` (its start time, provider and the
model it asks for, which names the span) and gathers what the stream events
say (the model that served it, retries and attempt resets as span events,
the reply's text with ``record_content``); ``on_turn_end`` writes it. A failed call is held until the run goes on or
ends, so that a failure which ends the run carries the run's error class.
State lives on the subclass (``OTelObserver``): the per-run objects and the
span writer.
"""

from __future__ import annotations

import time
from typing import Optional

from loopctl.events import (
    AttemptReset,
    Response,
    RetryScheduled,
    StreamFailure,
    StreamSuccess,
    TurnEnd,
    TurnStart,
)

from . import conventions as cv
from .happenings import RunSpanEvents
from .spans import ChatCall, RunState, SpanWriter, run_key


class ChatSpanEvents(RunSpanEvents):
    """The model-call handlers of ``OTelObserver`` (state lives on the subclass)."""

    _spans: SpanWriter
    provider_name: Optional[str]

    def on_turn_start(self, event: TurnStart) -> None:
        """A model call begins: remember when (its span is made when it ends)."""
        st = self._runs.get(run_key(event))
        if st is not None:
            self._flush_failed_chat(st)
            provider = self.provider_name or event.provider or st.provider
            if provider and not st.provider:
                st.provider = provider  # the run span names it too, however the observer was attached
                st.span.set_attribute(cv.PROVIDER_NAME, provider)
            st.chat = ChatCall(event.turn, time.time_ns(), provider, event.model)

    def on_attempt_reset(self, event: AttemptReset) -> None:
        """A stream attempt failed and another starts: an event on the call's span."""
        chat = self._chat(run_key(event), event.turn)
        if chat is not None:
            chat.events.append((cv.EV_ATTEMPT_RESET, {cv.ATTEMPT: event.attempt}, time.time_ns()))

    def on_retry_scheduled(self, event: RetryScheduled) -> None:
        """A failed call will be retried: an event with the cause and the wait."""
        chat = self._chat(run_key(event), event.turn)
        if chat is None:
            return
        chat.request_model = chat.request_model or event.model or None  # names the model asked for
        chat.provider = chat.provider or event.provider
        chat.events.append(
            (
                cv.EV_RETRY,
                {
                    cv.ATTEMPT: event.attempt,
                    "loopctl.retry.max_attempts": event.max_attempts,
                    "loopctl.retry.wait_s": float(event.wait_s),
                    "loopctl.retry.cause": cv.redact(event.cause),
                },
                time.time_ns(),
            )
        )

    def on_stream_success(self, event: StreamSuccess) -> None:
        """The call succeeded: note the model that served it."""
        chat = self._chat(run_key(event), event.turn)
        if chat is not None:
            chat.response_model = event.model or None
            chat.provider = chat.provider or event.provider
            chat.usage_known = event.usage is not None

    def on_stream_failure(self, event: StreamFailure) -> None:
        """The call failed: note the model it asked for (the error arrives with the turn's end)."""
        chat = self._chat(run_key(event), event.turn)
        if chat is not None:
            chat.request_model = chat.request_model or event.model or None
            chat.provider = chat.provider or event.provider

    def on_response(self, event: Response) -> None:
        """The reply's text (subscribed only with ``record_content``)."""
        chat = self._chat(run_key(event), event.turn)
        if chat is not None:
            chat.text = event.text
        st = self._runs.get(run_key(event))
        if st is not None:
            st.text = event.text

    def on_turn_end(self, event: TurnEnd) -> None:
        """End the model call's span (``phase="llm"``) or close tools a phase cut short."""
        st = self._runs.get(run_key(event))
        if st is None:
            return
        now = time.time_ns()
        if event.phase == "llm":
            chat = st.chat
            if chat is not None and chat.turn == event.turn:
                if event.success:
                    self._spans.chat(st, chat, now, True, None, event)
                else:
                    # Written when the run goes on or ends: the event names its
                    # class (else, if this failure ends the run, the run's does).
                    st.chat = None
                    self._flush_failed_chat(st)
                    st.failed_chat = (chat, now, event)
        elif st.tools:
            if event.success:
                self._spans.open_tools(st, now, None)
            else:
                self._spans.open_tools(st, now, event.error, event.error_type)

    def _flush_failed_chat(
        self, st: RunState, run_error_class: Optional[str] = None, run_error: Optional[str] = None
    ) -> None:
        """Write the held failed model call; it takes the run's error class if it is the run's error."""
        held = st.failed_chat
        if held is None:
            return
        st.failed_chat = None
        chat, ended_ns, end = held
        error_class = end.error_type
        if error_class is None and run_error_class is not None and run_error == end.error:
            error_class = run_error_class
        self._spans.chat(st, chat, ended_ns, False, end.error, end, error_class)

    def _chat(self, run_id: str, turn: int) -> Optional[ChatCall]:
        st = self._runs.get(run_id)
        if st is None:
            return None
        chat = st.chat
        return chat if chat is not None and chat.turn == turn else None


__all__ = ["ChatSpanEvents"]
