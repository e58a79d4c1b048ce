"""The ``loopctl`` command's approvals: ask inline, answer from a typed or piped line, or ``--yes``.

``--ask TOOL`` (repeatable; ``--ask all`` for every tool) makes those calls
wait for a person. Each waiting call is announced as
``add(a=1, b=2) needs approval [y/n/reason]``; the next line answers the
oldest waiting call: ``y``/``yes`` approves, ``n``/``no`` or an empty line
denies, any other text denies with that text as the reason (the model reads
it). On a terminal a line typed while nothing waits is guidance as usual;
from a pipe (which cannot know when a question comes) every line is an
answer, used in order as calls come to wait, and lines left over are
reported when the run ends; once stdin ends, calls that still wait (or
come to wait) are denied "no answer (input ended)", so a run never hangs
on a question nobody can answer. ``--yes`` approves every call without
asking.

``ApprovalPrompt`` is an observer (it learns of waiting calls from
``on_approval_requested`` / ``on_approval_resolved``) and answers through
the run's handle from whatever thread gives it the line; it never blocks.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Optional

from loopctl.demo.console import printable
from loopctl.driver.subagent import SubagentTool
from loopctl.events import ApprovalRequested, ApprovalResolved, Observer
from loopctl.tools.registry import ToolRegistry

#: Who the record says answered, for each way of answering.
BY_TERMINAL = "terminal"
BY_YES = "--yes"
#: The reason given to a call that waits after stdin ended.
NO_ANSWER = "no answer (input ended)"


def call_label(tool: str, arguments: Mapping[str, Any]) -> str:
    """``add(a=1, b=2)``: a call as the live view shows it."""
    args = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in arguments.items())
    return printable(f"{tool}({args})")


def unknown_asks(asked: Sequence[str], tools: ToolRegistry) -> Optional[str]:
    """What is wrong with ``--ask``: the names no tool of the agent or its sub-agents has; None if none.

    A misspelt name would otherwise be accepted and never ask.
    """
    known = _tool_names(tools)
    unknown = [name for name in dict.fromkeys(asked) if name != "all" and name not in known]
    if not unknown:
        return None
    names = ", ".join(repr(printable(name)) for name in unknown)
    return (f"--ask: no tool named {names} (the tools are {', '.join(sorted(known)) or 'none'}; "
            "'all' asks before every tool)")


def _tool_names(tools: ToolRegistry) -> set[str]:
    names = set(tools.names())
    for name in tools.names():
        tool = tools.get(name)
        if isinstance(tool, SubagentTool):  # --ask reaches its calls too
            names |= _tool_names(tool.loop.tools)
    return names


def ask_policy(tools: list[str]) -> Callable[[Any], bool]:
    """The loop's approval policy for ``--ask`` (``all`` asks before every tool)."""
    names = frozenset(tools)
    if "all" in names:
        return lambda ctx: True
    return lambda ctx: ctx.tool in names


class ApprovalPrompt(Observer):
    """Waiting calls of the run in flight, and the lines that answer them.

    Args:
        say: prints one status line (stdout, or stderr in ``--json`` mode).
        auto_yes: approve every call at once (``--yes``).
        piped: stdin is not a terminal: every line is an answer (never
            with ``auto_yes``: then lines stay guidance).
    """

    def __init__(self, say: Callable[[str], None], auto_yes: bool, piped: bool) -> None:
        self._say = say
        self._auto_yes = auto_yes
        self.piped = piped
        self._lock = threading.Lock()
        self._handle: Any = None
        self._waiting: deque[tuple[str, str, str]] = deque()  # (call_id, label, sub-agent path), oldest first
        self._labels: dict[str, str] = {}
        self._answers: deque[str] = deque()  # piped lines read before a call waited
        self._eof = False  # stdin ended: nobody is left to answer

    # -- the run ---------------------------------------------------------------------

    def attach(self, handle: object) -> None:
        """The run in flight; answers that came before it are applied now."""
        with self._lock:
            self._handle = handle
        self._apply()

    def detach(self) -> list[str]:
        """The run ended: forget it; say (and return) the piped answers nobody used."""
        with self._lock:
            self._handle = None
            self._waiting.clear()
            self._labels.clear()
            unused, self._answers = list(self._answers), deque()
        if unused:
            self._say("answers not used (no call was waiting):")
            for text in unused:
                self._say(f"  - {printable(text)}")
        return unused

    # -- events ------------------------------------------------------------------------

    def on_approval_requested(self, event: ApprovalRequested) -> None:
        """Announce the call; ``--yes`` approves it, else it waits for a line."""
        label = call_label(event.tool, event.arguments)
        if event.subagent:  # a sub-agent's call: say whose
            label = f"[{printable(event.subagent)}] {label}"
        with self._lock:
            self._labels[event.call_id] = label
            self._waiting.append((event.call_id, label, event.subagent))
            if self._auto_yes:
                self._answers.append("y")
        self._say(f"  {label} needs approval" + (": yes (--yes)" if self._auto_yes else " [y/n/reason]"))
        self._apply()

    def on_approval_resolved(self, event: ApprovalResolved) -> None:
        """Say how the call was answered (here, elsewhere, by a timeout or the run's end)."""
        with self._lock:
            label = self._labels.pop(event.call_id, event.tool)
            self._waiting = deque(w for w in self._waiting if w[0] != event.call_id)
        if event.by == BY_YES:
            return  # already said
        who = f" by {event.by}" if event.by and event.by != BY_TERMINAL else ""
        if event.approved:
            self._say(f"  [approved{who}: {label}]")
        else:
            self._say(f"  [denied{who}: {label}: {printable(event.reason)}]")

    # -- lines ----------------------------------------------------------------------------

    def take_line(self, line: str) -> bool:
        """Use ``line`` as an answer when one is wanted; False: it is not an answer."""
        with self._lock:
            if self._auto_yes or (not self._waiting and not self.piped):
                return False
            self._answers.append(line)
        self._apply()
        return True

    def end_of_input(self) -> None:
        """Stdin ended: calls waiting now or later are denied, since no answer can come."""
        with self._lock:
            self._eof = True
        self._apply()

    def _apply(self) -> None:
        """Pair waiting calls with answers, oldest first (outside the lock to answer)."""
        while True:
            with self._lock:
                handle = self._handle
                if handle is None or not self._waiting or not (self._answers or self._eof):
                    return
                call_id, _, subagent = self._waiting.popleft()
                text = self._answers.popleft() if self._answers else None
            approve, reason = parse_answer(text) if text is not None else (False, NO_ANSWER)
            by = BY_YES if self._auto_yes else BY_TERMINAL
            if approve:
                handle.approve(call_id, by=by, subagent=subagent)
            else:
                handle.deny(call_id, reason, by=by, subagent=subagent)


def parse_answer(text: str) -> tuple[bool, str]:
    """``(approve, reason)`` for a typed answer: y/yes, n/no/empty, or a reason to deny."""
    word = text.strip()
    if word.lower() in ("y", "yes"):
        return True, ""
    if word.lower() in ("", "n", "no"):
        return False, "denied at the terminal"
    return False, word


__all__ = ["ApprovalPrompt", "ask_policy", "call_label", "parse_answer"]
