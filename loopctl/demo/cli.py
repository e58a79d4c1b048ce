"""The ``loopctl`` command: ``loopctl run "..."`` and ``loopctl chat``.

It drives a ``BareLoop`` the way an app would: the run goes on its worker
thread (``start()``) so the main thread keeps SIGINT; text streams through
the text streamer; tool calls, their results and delivered guidance come
from an observer. Lines typed on stdin while a run works are pushed as
steering by a daemon reader thread (``loopctl-cli-stdin``) that ends at EOF
or when the command is done; every such line ends reported (queued then
delivered, or listed as not delivered), even one read before the first
turn or left unread in a pipe when the run ends. When stdin and stdout are
both the terminal, keys are read unechoed (``KeysMode``) and the console
draws the half-typed line itself, apart from the live output. Ctrl-C
cancels the run (a second one exits at once, restoring the terminal) and
prints what guidance was never delivered. Exit codes: 0 success,
130 cancelled or interrupted, 1 a ``LoopError``, 2 a usage error. Colours
and the spinner appear only on a terminal, colours never with ``NO_COLOR``.
The terminal view itself (``Console``, ``LiveView``) lives in
``loopctl.demo.view``, stdin (``StdinLines``, ``KeysMode``) in
``loopctl.demo.terminal``, the arguments in ``loopctl.demo.arguments`` and
what a failure says in ``loopctl.demo.wording``; the first three are
re-exported here.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import textwrap
import threading
from collections.abc import Mapping, Sequence
from typing import IO, Any, Optional

import attrs

from loopctl.config import RunConfig, SessionConfig
from loopctl.demo.approval_prompt import ApprovalPrompt, ask_policy, unknown_asks
from loopctl.demo.arguments import CommandParser, UsageError, UsageExit, build_parser, load_schema
from loopctl.demo.chat_sessions import open_chat_session
from loopctl.demo.clients import make_client
from loopctl.demo.console import printable
from loopctl.demo.delegation import delegating_tools
from loopctl.demo.interrupts import EXIT_CANCELLED, Interrupts
from loopctl.demo.mcp_servers import close_mcp_servers, open_mcp_servers
from loopctl.demo.terminal import KeysMode, StdinLines
from loopctl.demo.tools import demo_tools
from loopctl.demo.view import Console, LiveView, RunFacts
from loopctl.demo.wording import error_lines
from loopctl.driver.loop import BareLoop
from loopctl.errors import Cancelled, LoopError
from loopctl.events import CallbackObserver
from loopctl.records import Run, json_form
from loopctl.sessions import SQLiteSessionStore
from loopctl.text import json_safe, redact_value

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


class _TypedLines:
    """Where typed guidance lines stand; ``cond`` guards every field.

    ``armed``: lines are guidance for the run; ``early``: lines that came
    before its first turn; ``pushing``: lines taken as guidance and not yet
    reported; ``not_sent``: lines to list as not delivered.
    """

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.armed = False
        self.pushing = 0
        self.not_sent: list[str] = []
        self.early: list[str] = []


class Command:
    """One ``loopctl`` invocation: the loop, the console, the run in flight.

    A line typed while a run is armed is guidance, and every such line ends
    reported: ``[guidance queued: ...]`` then delivered, or listed as not
    delivered when the run finished first.
    """

    def __init__(self, args: argparse.Namespace, stdin: Optional[IO[str]], out: IO[str],
                 err: IO[str], env: Mapping[str, str]) -> None:
        self.args = args
        tty = _isatty(out)
        self.console = Console(out, err, color=tty and not env.get("NO_COLOR"), tty=tty)
        self.console.wrap = tty and not args.json  # JSON lines stay whole, even on a terminal
        self.stdin = stdin
        self.streaming = not args.no_stream
        self.config = RunConfig() if args.max_turns is None else RunConfig(max_turns=args.max_turns)
        self.facts = RunFacts(on_first_turn=self._first_turn)
        schema = getattr(args, "output_schema_loaded", None)
        if schema is not None:
            self.config = attrs.evolve(self.config, output_type=schema)
        self.approvals = ApprovalPrompt(lambda text: self.note(text, "yellow"), args.yes, piped=False)
        self.store: Optional[SQLiteSessionStore] = None
        self.loop = self._make_loop(env, tty)
        # Checked once every tool is known (an MCP server's only once it started), before any model call.
        problem = unknown_asks(args.ask, self.loop.tools)
        if problem is not None:
            self.close()
            raise UsageError(problem)
        self.session_note: Optional[str] = None
        name = getattr(args, "session", None)
        if name is not None:
            try:
                self.store, stored = open_chat_session(name, args.session_db, env)
                self.loop.with_session(stored)
                earlier = len(stored.messages())  # a corrupt session is reported before any prompt
            except BaseException:
                self.close()
                raise
            self.session_note = (f"session {printable(name)!r}: " +
                                 (f"continuing ({earlier} earlier messages)" if earlier else "a new conversation"))
        self.prompts: queue.Queue[Optional[str]] = queue.Queue()
        self._lines = _TypedLines()
        # Piped input to ``chat`` is a script of prompts; typed lines steer.
        self.steer_from_stdin = args.command == "run" or _isatty(stdin)
        # Piped input with --ask answers the questions instead (approval_prompt).
        self.approvals.piped = bool(args.ask) and args.command == "run" and not _isatty(stdin)

    def _make_loop(self, env: Mapping[str, str], tty: bool) -> BareLoop:
        a = self.args
        tool_delay = a.tool_delay if a.tool_delay is not None else float(env.get("LOOPCTL_DEMO_TOOL_DELAY") or 0)
        client = make_client(a, env, visible=tty and self.streaming and not a.json)
        # A typed answer is printed once, validated, at the end: its raw text is not shown.
        typed = self.config.output_type is not None
        self.view = LiveView(self.console, streaming=self.streaming or typed,
                             model=str(getattr(client, "model", "") or "the model"))
        self.mcp_servers, mcp_tools = open_mcp_servers(a.mcp)
        own = (delegating_tools(lambda: make_client(a, env), tool_delay, ask_policy(a.ask) if a.ask else None)
               if a.subagent else demo_tools(tool_delay))
        loop = BareLoop(client, [*own, *mcp_tools], SessionConfig(system_prompt=a.system))
        if not self.streaming:
            loop.with_turn_mode("non_streaming")
        loop.with_observer(self.facts)
        loop.with_observer(self.approvals)
        if a.ask:
            loop.with_approval(ask_policy(a.ask))
        if a.json:
            out = self.console
            loop.with_observer(CallbackObserver(
                lambda e: out.line(json.dumps(e.to_dict(), ensure_ascii=False, allow_nan=False))))
        else:
            if not typed:
                loop.with_text_streamer(self.console.text)
            loop.with_observer(self.view)
        return loop

    def note(self, text: str, *styles: str) -> None:
        """A status line: stdout for people, stderr in ``--json`` mode."""
        self.console.line(text, *styles, err=self.args.json)

    # -- stdin ------------------------------------------------------------------

    def on_line(self, line: Optional[str]) -> None:
        """A typed line: guidance for the run in flight, else the next prompt.

        It never blocks: a line that comes before the run's first turn (the
        steering slot is not open yet) waits in a list that the first turn
        pushes.
        """
        if line is None:
            self.approvals.end_of_input()  # nobody is left to answer a waiting call
        elif self._lines.armed and self.approvals.take_line(line):
            return  # it answered a call waiting for approval
        with self._lines.cond:
            is_guidance = line is not None and self._lines.armed and self.steer_from_stdin
            if line is not None and is_guidance and not self.facts.started.is_set():
                self._lines.early.append(line)
                return
            if is_guidance:
                self._lines.pushing += 1
            elif line is not None and self.args.command == "run":
                self._lines.not_sent.append(line)  # the run is over: reported with the leftovers
                return
        if line is None or not is_guidance:
            if line is not None:
                self.console.submit(line)
            self.prompts.put(line)
            return
        try:
            self._push(line)
        finally:
            with self._lines.cond:
                self._lines.pushing -= 1
                self._lines.cond.notify_all()

    def _push(self, line: str) -> None:
        if self.loop.steering().push(line):
            self.console.note(f"  [guidance queued: {printable(line)}]", "yellow", err=self.args.json)
        else:
            with self._lines.cond:
                self._lines.not_sent.append(line)

    def _first_turn(self) -> None:
        """The run's first turn starts (its thread): push the lines that came early."""
        with self._lines.cond:
            early, self._lines.early = self._lines.early, []
            self.facts.started.set()  # under the lock: no line can land in the list after this
            self._lines.pushing += 1  # the run's end waits for these reports too
        try:
            for line in early:
                self._push(line)
        finally:
            with self._lines.cond:
                self._lines.pushing -= 1
                self._lines.cond.notify_all()

    def arm(self) -> None:
        """Lines typed from now on are guidance for the next run."""
        with self._lines.cond:
            self.facts.started.clear()
            self._lines.armed = True

    def _disarm(self) -> None:
        """No more guidance; wait until every line taken as guidance is reported."""
        with self._lines.cond:
            self._lines.armed = False
            self.facts.started.set()
            self._lines.not_sent.extend(self._lines.early)
            self._lines.early = []
            while self._lines.pushing:
                self._lines.cond.wait()

    # -- one run ----------------------------------------------------------------

    def run_once(self, text: str, reader: Optional[StdinLines] = None) -> int:
        """Run the agent on ``text`` and report; the exit code for this run.

        Args:
            text: the task.
            reader: for ``run``, the stdin reader to stop when the run ends:
                lines still waiting in stdin are reported as not delivered.
        """
        if not self._lines.armed:
            self.arm()
        error: Optional[LoopError] = None
        run: object = None
        try:
            with Interrupts() as interrupts:
                try:
                    handle = self.loop.start(text, self.config)
                except LoopError as exc:  # refused before it began (a session in use elsewhere)
                    self.console.line(f"error: {exc}", "red", err=True)
                    return EXIT_ERROR
                run = handle.record
                interrupts.attach(handle)
                self.approvals.attach(handle)
                try:
                    # Bounded waits: a signal handler only runs when the main
                    # thread wakes, and its Ctrl-C is applied here, outside it.
                    while not handle.wait(0.2):
                        interrupts.poll()
                    run = handle.result()
                except LoopError as exc:
                    error = exc
        finally:
            self._disarm()
            late = reader.stop() if reader is not None else []
            self.approvals.detach()  # says which piped answers no call used
            self.console.close()
        return self._report(run, error, late)

    def _report(self, run: Any, error: Optional[LoopError], late: list[str]) -> int:
        """What the run came to: its error or answer, undelivered guidance, the summary."""
        self.console.end_text()
        with self._lines.cond:
            not_sent, self._lines.not_sent = self._lines.not_sent + late, []
        leftovers = [m.text for m in self.loop.steering().take_leftovers()] + not_sent
        if isinstance(error, Cancelled):
            self.note("cancelled", "yellow", "bold")
        elif error is not None:
            v = self.view
            for line in error_lines(error, model=v.model, attempts=v.attempts, rescued=v.rescued,
                                    base_url=self.args.base_url, provider=self.args.provider):
                self.console.line(line, "red", err=True)
        elif run is not None and not (run.output or "").strip():
            self.note("(the model's final reply was empty)", "yellow")
        if leftovers:
            self.note("guidance not delivered:" if error is not None
                      else "guidance not delivered (the run finished first):", "yellow")
            for msg in leftovers:
                self.note(f"  - {printable(msg)}", "yellow")
        if error is None and self.config.output_type is not None:
            value = json_form(run.output_value)
            shown = {"type": "output_value", "value": value} if self.args.json else value
            self.console.line(json.dumps(json_safe(redact_value(shown)), ensure_ascii=False, allow_nan=False))
        if error is None or isinstance(error, Cancelled) or run is None or run.turn_count:
            self.note(_summary(run, self.facts), "dim")  # not "0 turns, ..." after a failure
        if error is None:
            return EXIT_OK
        return EXIT_CANCELLED if isinstance(error, Cancelled) else EXIT_ERROR

    def close(self) -> None:
        """Close the loop (tool threads, temp dir) and stop the MCP servers."""
        self.console.close()
        self.loop.close()
        if self.store is not None:
            self.store.close()
        close_mcp_servers(self.mcp_servers)


def _summary(run: Run, facts: RunFacts) -> str:
    def n(count: int, word: str) -> str:
        return f"{count} {word}{'' if count == 1 else 's'}"

    tokens = n(run.usage.total_tokens, "token")  # sub-agents' tokens included
    if facts.usage_unknown and not facts.usage_known:
        tokens = "tokens unknown (the server sent no usage)"
    elif facts.usage_unknown:
        tokens += f" (unknown for {n(facts.usage_unknown, 'turn')})"
    return (f"-- {n(run.turn_count, 'turn')}, {n(run.tool_call_count, 'tool call')}, "
            f"{tokens}, {run.duration:.2f}s")


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _arguments(parser: CommandParser, argv: Optional[Sequence[str]]) -> Optional[argparse.Namespace]:
    """The parsed arguments, None without a subcommand.

    Raises:
        UsageExit: a usage error (reported through the subcommand's parser,
            so its usage is shown), ``--help`` or ``--version``.
    """
    args, extra = parser.parse_known_args(argv)
    if extra:
        parser.commands.get(args.command or "", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        return None
    if getattr(args, "session_db", None) and not args.session:
        parser.commands["chat"].error("--session-db needs --session NAME")
    if args.provider == "offline" and args.base_url:
        parser.commands[args.command].error("--base-url applies to --provider openai or anthropic")
    if getattr(args, "output_schema", None):
        args.output_schema_loaded = load_schema(parser.commands[args.command], args.output_schema)
    return args


def main(argv: Optional[Sequence[str]] = None, *, stdin: Optional[IO[str]] = None,
         stdout: Optional[IO[str]] = None, stderr: Optional[IO[str]] = None,
         env: Optional[Mapping[str, str]] = None) -> int:
    """Run the ``loopctl`` command; returns the exit code.

    Args:
        argv: arguments (default ``sys.argv[1:]``).
        stdin, stdout, stderr: streams (default the process's).
        env: environment (default ``os.environ``).
    """
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    parser = build_parser()
    parser.bind(out, err)
    try:
        args = _arguments(parser, argv)
    except UsageExit as exc:  # usage, --help, --version: written to out/err already
        return exc.code
    if args is None:
        parser.print_help(out)
        return EXIT_USAGE
    if args.provider == "offline" and args.model:
        err.write(f"warning: --model {args.model!r} only renames the offline demo model; "
                  "use --provider openai or anthropic for a real one\n")
    try:
        session = Command(args, stdin if stdin is not None else sys.stdin, out, err,
                          os.environ if env is None else env)
    except UsageError as exc:
        try:
            parser.commands[args.command].error(str(exc))
        except UsageExit as usage:
            return usage.code
    except LoopError as exc:
        message = f"error: {exc}"
        err.write((textwrap.fill(message, 79, break_long_words=False) if _isatty(err) else message) + "\n")
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_CANCELLED
    # Typed keys are drawn by the console (apart from the live output) when
    # both ends are the terminal.
    keys = KeysMode(session.stdin if session.console.tty and session.steer_from_stdin else None)
    with keys:
        session.console.editing = keys.active
        reader = StdinLines(session.stdin, session.on_line,
                            on_edit=session.console.edit if keys.active else None)
        try:
            if args.command == "run":
                session.arm()  # before the reader starts: no line can slip past the run
                reader.start().wait_caught_up(0.5)  # lines already in a pipe come first
                return session.run_once(args.input, reader)
            return _chat(session, reader)
        except KeyboardInterrupt:
            session.console.end_lines()
            return EXIT_CANCELLED
        finally:
            reader.stop()
            session.close()


def _chat(session: Command, reader: StdinLines) -> int:
    c = session.console
    interactive = _isatty(session.stdin)
    if interactive:
        session.note("loopctl chat: ask something; while it works, type guidance; "
                     "Ctrl-C stops a run; Ctrl-D or /quit leaves.", "dim")
    if session.session_note is not None:
        session.note(session.session_note, "dim")
    reader.start()
    while True:
        if interactive:
            c.prompt("> ", "bold", err=session.args.json)
        text = _next_prompt(session.prompts)
        if text is None or text in ("/quit", "/exit"):
            session.console.end_text()
            return EXIT_OK
        session.run_once(text)


def _next_prompt(prompts: queue.Queue[Optional[str]]) -> Optional[str]:
    while True:
        try:
            return prompts.get(timeout=0.5)
        except queue.Empty:
            continue


__all__ = ["Command", "Console", "Interrupts", "LiveView", "StdinLines", "build_parser", "main", "make_client"]
