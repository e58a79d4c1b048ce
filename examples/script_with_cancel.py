"""A plain script: the run works on a worker thread, the main thread is the boss.

The main thread starts a run with ``loop.start()``, sends it a line of
guidance while it works, and waits at most ``--timeout`` seconds. If the run
has not finished by then it cancels it: ``run``/``result`` end within
milliseconds even while a tool is running (the demo tools wait on the run's
cancel signal), the conversation is left as it was before the run, and the
guidance the run never reached comes back as leftovers.

    python examples/script_with_cancel.py                # cancelled after 1 s, in the first tool
    python examples/script_with_cancel.py --timeout 10   # guidance noted, finishes: 20

Each demo tool call takes ``--tool-delay`` seconds (2 by default), so the
default run cannot finish within the default timeout of 1 s. Tool calls
print as the ``loopctl`` command prints them: ``> add(a=2, b=3)``.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path
from typing import Optional, Sequence

try:
    import loopctl  # noqa: F401
except ImportError:  # run from a checkout without ``pip install -e .``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loopctl import BareLoop, Cancelled, Observer
from loopctl.demo.model import OfflineModel
from loopctl.demo.tools import demo_tools
from loopctl.observers import ToolCallReceived, ToolPost


class ShowTools(Observer):
    """Prints each tool call and its result on their own lines."""

    def on_tool_call_received(self, event: ToolCallReceived) -> None:
        args = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in event.input.items())
        print(f"\n  > {event.tool}({args})")

    def on_tool_post(self, event: ToolPost) -> None:
        print(f"  < {event.tool}: {event.output}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run once; exit code 0 if the run finished, 130 if it was cancelled."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--timeout", type=float, default=1.0, help="seconds before cancelling (default 1)")
    parser.add_argument("--tool-delay", type=float, default=2.0, help="seconds each tool takes (default 2)")
    parser.add_argument("--question", default="What is (2 + 3) * 4?")
    args = parser.parse_args(argv)

    speaking = threading.Event()

    def show(delta: str) -> None:
        speaking.set()
        print(delta, end="", flush=True)

    with BareLoop(OfflineModel(), demo_tools(args.tool_delay)) as loop:
        loop.with_text_streamer(show)
        loop.with_observer(ShowTools())
        handle = loop.start(args.question)  # returns at once; the run has its own thread
        speaking.wait(args.timeout)  # the run is under way once the model speaks
        accepted = loop.steering().push("show each step")  # lands at the next turn boundary
        print(f"  [guidance {'accepted' if accepted else 'refused: no run in flight'}]")
        if handle.wait(args.timeout):
            run = handle.result()
            print(f"\nfinished in {run.turn_count} turns: {run.output}")
            return 0
        handle.cancel("took longer than the timeout")
        try:
            handle.result()
        except Cancelled as exc:
            print(f"\n{exc}")
        for msg in loop.steering().take_leftovers():
            print(f"never delivered: {msg.text}")
        print(f"conversation after the cancel: {len(loop.conversation())} messages")
        return 130


if __name__ == "__main__":
    sys.exit(main())
