"""Steering demo: one thread runs an agent, another steers it and collects leftovers.

The "agent" thread runs a loop whose tool is slow (it edits files). The main
thread plays the UI a person watches: when it sees the agent start editing,
it says "src/generated.py is generated, do not edit it"; the guidance lands
at the next turn boundary and the model changes course. While the model
writes its final answer the person adds "also run the tests" — too late
for this run: it is sealed as a leftover. After the run a push is refused
(check the return value), and the UI takes the leftover and resubmits it
itself, as the next run's input.

The model is a ``ScriptedClient`` whose replies read the request, so no key
or network is needed. Run: ``python examples/steering_demo.py``.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

try:
    import loopctl  # noqa: F401
except ImportError:  # run from a checkout without ``pip install -e .``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loopctl import BareLoop, Message, ModelRequest, ModelResponse, Observer, Tool, ToolContext
from loopctl.observers import SteeringDelivered, ToolPre, TurnStart
from loopctl.testing import ScriptedClient, call, reply

GUIDANCE = "src/generated.py is generated. Do not edit it."
LATE = "Also run the tests."


class EditFile(Tool):
    """A slow tool: editing takes a while.

    Stand-in for the slow part: the first edit lasts until the person has
    spoken (at most 5 s), so the demo prints the same thing every run; a real
    tool just takes its time. It waits on the run's cancel signal too, as
    real tools should, so a cancel would end the wait at once.
    """

    name = "edit_file"
    description = "Fix the lint errors in one file."

    def __init__(self, person_spoke: threading.Event) -> None:
        self.person_spoke = person_spoke

    def call(self, input: Any, ctx: ToolContext) -> str:
        if not ctx.cancel.is_cancelled():
            ctx.cancel.add_listener(self.person_spoke.set)
            try:
                self.person_spoke.wait(5.0)
            finally:
                ctx.cancel.remove_listener(self.person_spoke.set)
        return f"fixed {input['path']}"


def guidance_in(request: ModelRequest) -> list[str]:
    """What the person said during this run (user messages after the input)."""
    users = [m for m in request.messages if m.role == "user" and not m.tool_results and m.text]
    return [m.text for m in users[1:]]


def second_step(request: ModelRequest) -> ModelResponse:
    """The model's second turn: it reads the conversation, guidance included."""
    if any("generated" in text for text in guidance_in(request)):
        return call("edit_file", path="src/util.py")
    return call("edit_file", path="src/generated.py")


class Screen(Observer):
    """What the UI thread watches: the transcript, as events."""

    def __init__(self) -> None:
        self.editing = threading.Event()
        self.final_turn = threading.Event()
        self.spoke_early = threading.Event()  # the person said something during the edit
        self.spoke_late = threading.Event()  # ... and during the final answer

    def on_tool_pre(self, event: ToolPre) -> None:
        print(f"[agent] turn {event.turn}: calling {event.tool}")
        self.editing.set()

    def on_steering(self, event: SteeringDelivered) -> None:
        for m in event.messages:
            print(f"[agent] turn {event.turn}: guidance arrived: {m.text!r}")

    def on_turn_start(self, event: TurnStart) -> None:
        if event.turn == 2:
            self.final_turn.set()


def main() -> int:
    screen = Screen()

    def final_answer(request: ModelRequest) -> ModelResponse:
        # A slow model: this stand-in waits until the person has typed, so the demo
        # prints the same thing every run. A real model just takes its time.
        screen.spoke_late.wait(5.0)
        edited = [p.output for m in request.messages for p in m.tool_results]
        return reply("Done: " + "; ".join(edited) + ". Left src/generated.py alone.")

    client = ScriptedClient(
        [
            call("edit_file", path="src/app.py"),
            second_step,
            final_answer,
            reply("Ran the tests: 12 passed."),  # the resubmitted leftover's run
        ]
    )
    with BareLoop(client, [EditFile(screen.spoke_early)]) as loop:
        loop.with_observer(screen)
        steering = loop.steering()  # one shared handle; safe from any thread
        result: dict[str, Any] = {}

        def agent() -> None:
            result["run"] = loop.run("Fix the lint errors in src/.")

        worker = threading.Thread(target=agent, name="agent")
        worker.start()

        # The UI thread. The agent starts editing: say what it does not know.
        screen.editing.wait(5.0)
        accepted = steering.push(GUIDANCE)
        print(f"[ui] pushed {GUIDANCE!r}: accepted={accepted}")
        screen.spoke_early.set()

        # While the model writes its final answer: too late for this run.
        screen.final_turn.wait(5.0)
        accepted = steering.push(LATE)
        print(f"[ui] pushed {LATE!r}: accepted={accepted}")
        screen.spoke_late.set()
        worker.join()
        print(f"[agent] output: {result['run'].output}")

        # The run is over: a push is refused and stores nothing. Check the return value.
        accepted = steering.push("Thanks!")
        print(f"[ui] pushed 'Thanks!' after the run: accepted={accepted}")

        # Leftovers are yours: the next run would not deliver them. Decide, then resubmit.
        leftovers = steering.take_leftovers()
        print(f"[ui] leftovers: {[m.text for m in leftovers]}")
        for message in leftovers:
            run = loop.run(message.text)
            print(f"[agent] output: {run.output}")

        history: list[Message] = list(loop.machine.history)
        assert Message.user(GUIDANCE) in history, "delivered guidance persists in history"
    return 0


if __name__ == "__main__":
    sys.exit(main())
