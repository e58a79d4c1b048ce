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
``loopctl.demo.terminal``; they are re-exported here.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import IO, Any, Optional
from urllib.parse import urlsplit

import attrs

from loopctl import __version__
from loopctl.config import RunConfig, SessionConfig
from loopctl.demo.approval_prompt import ApprovalPrompt, ask_policy
from loopctl.demo.console import printable
from loopctl.demo.mcp_servers import close_mcp_servers, open_mcp_servers
from loopctl.demo.model import OfflineModel
from loopctl.demo.terminal import KeysMode, StdinLines, restore_terminal
from loopctl.demo.tools import demo_tools
from loopctl.demo.view import Console, LiveView, RunFacts
from loopctl.driver.loop import BareLoop
from loopctl.errors import Cancelled, ConfigError, LoopError
from loopctl.observers import CallbackObserver
from loopctl.records import json_form
from loopctl.text import json_safe, redact_value

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_CANCELLED = 0, 1, 2, 130
_DEFAULT_MODELS = {"openai": ("OPENAI_MODEL", "gpt-4o-mini"),
                   "anthropic": ("ANTHROPIC_MODEL", "claude-sonnet-4-20250514")}


class _Parser(argparse.ArgumentParser):
    """An argument parser that knows its subcommands' parsers."""

    commands: dict[str, argparse.ArgumentParser]


def _turns(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        # Credentials in a URL are a secret: the message never repeats them.
        shown = "<credentials>@" + text.rsplit("@", 1)[1] if "@" in text else text
        raise argparse.ArgumentTypeError(
            f"must start with http:// or https:// and name a host, got {shown!r}")
    return text


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def build_parser() -> _Parser:
    """The argument parser of the ``loopctl`` command."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--provider", choices=("offline", "openai", "anthropic"), default="offline",
                        help="model provider (default: the embedded offline demo model)")
    common.add_argument("--model", help="model name (provider default when omitted)")
    common.add_argument("--base-url", type=_url,
                        help="API base URL (openai: include /v1; anthropic: host root)")
    common.add_argument("--system", help="system prompt")
    common.add_argument("--max-turns", type=_turns, default=None, metavar="N",
                        help="model calls allowed per run (>= 1)")
    common.add_argument("--json", action="store_true",
                        help="print one JSON object per observer event on stdout")
    common.add_argument("--no-stream", action="store_true", help="ask for whole replies, not streams")
    common.add_argument("--tool-delay", type=_seconds, default=None, metavar="SECONDS",
                        help="slow each demo tool call down (time to type guidance or press Ctrl-C)")
    common.add_argument("--mcp", action="append", default=[], metavar='"COMMAND ARGS"',
                        help="run an MCP server (stdio) and give its tools to the agent (repeatable)")
    common.add_argument("--ask", action="append", default=[], metavar="TOOL",
                        help="ask before each call of TOOL (repeatable; 'all' for every tool): "
                             "answer y, n or a reason")
    common.add_argument("--yes", action="store_true", help="approve every call that needs approval")
    # Hidden: the offline model's pause between streamed text deltas.
    common.add_argument("--delay", type=_seconds, default=None, help=argparse.SUPPRESS)
    parser = _Parser(
        prog="loopctl",
        description="Run an LLM agent: streaming, live tool calls, typed guidance, Ctrl-C to stop.",
    )
    parser.add_argument("--version", action="version", version=f"loopctl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{run,chat}", parser_class=argparse.ArgumentParser)
    run = sub.add_parser("run", parents=[common], help="run the agent once on a task")
    run.add_argument("input", help='the task, e.g. "What is 12 + 30?"')
    run.add_argument("--output-schema", metavar="SCHEMA.json",
                     help="ask for an answer that fits this JSON Schema; print the validated object as JSON")
    chat = sub.add_parser("chat", parents=[common], help="several runs in one session (history kept)")
    parser.commands = {"run": run, "chat": chat}
    return parser


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
        self.stdin = stdin
        self.streaming = not args.no_stream
        self.config = RunConfig() if args.max_turns is None else RunConfig(max_turns=args.max_turns)
        self.facts = RunFacts(on_first_turn=self._first_turn)
        schema = getattr(args, "output_schema_loaded", None)
        if schema is not None:
            self.config = attrs.evolve(self.config, output_type=schema)
        self.approvals = ApprovalPrompt(lambda text: self.note(text, "yellow"), args.yes, piped=False)
        self.loop = self._make_loop(env, tty)
        self.prompts: queue.Queue[Optional[str]] = queue.Queue()
        self._cond = threading.Condition()
        self._armed = False
        self._pushing = 0  # on_line calls between taking a line as guidance and reporting it
        self._not_sent: list[str] = []
        self._early: list[str] = []
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
        loop = BareLoop(client, [*demo_tools(tool_delay), *mcp_tools], SessionConfig(system_prompt=a.system))
        if not self.streaming:
            loop.set_turn_mode("non_streaming")
        loop.register_observer(self.facts)
        loop.register_observer(self.approvals)
        if a.ask:
            loop.with_approval(ask_policy(a.ask))
        if a.json:
            out = self.console
            loop.register_observer(CallbackObserver(
                lambda e: out.line(json.dumps(e.to_dict(), ensure_ascii=False, allow_nan=False))))
        else:
            if not typed:
                loop.set_text_streamer(self.console.text)
            loop.register_observer(self.view)
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
        elif self._armed and self.approvals.take_line(line):
            return  # it answered a call waiting for approval
        with self._cond:
            is_guidance = line is not None and self._armed and self.steer_from_stdin
            if line is not None and is_guidance and not self.facts.started.is_set():
                self._early.append(line)
                return
            if is_guidance:
                self._pushing += 1
            elif line is not None and self.args.command == "run":
                self._not_sent.append(line)  # the run is over: reported with the leftovers
                return
        if line is None or not is_guidance:
            if line is not None:
                self.console.submit(line)
            self.prompts.put(line)
            return
        try:
            self._push(line)
        finally:
            with self._cond:
                self._pushing -= 1
                self._cond.notify_all()

    def _push(self, line: str) -> None:
        if self.loop.steering().push(line):
            self.console.note(f"  [guidance queued: {printable(line)}]", "yellow", err=self.args.json)
        else:
            with self._cond:
                self._not_sent.append(line)

    def _first_turn(self) -> None:
        """The run's first turn starts (its thread): push the lines that came early."""
        with self._cond:
            early, self._early = self._early, []
            self.facts.started.set()  # under the lock: no line can land in the list after this
            self._pushing += 1  # the run's end waits for these reports too
        try:
            for line in early:
                self._push(line)
        finally:
            with self._cond:
                self._pushing -= 1
                self._cond.notify_all()

    def arm(self) -> None:
        """Lines typed from now on are guidance for the next run."""
        with self._cond:
            self.facts.started.clear()
            self._armed = True

    def _disarm(self) -> None:
        """No more guidance; wait until every line taken as guidance is reported."""
        with self._cond:
            self._armed = False
            self.facts.started.set()
            self._not_sent.extend(self._early)
            self._early = []
            while self._pushing:
                self._cond.wait()

    # -- one run ----------------------------------------------------------------

    def run_once(self, text: str, reader: Optional[StdinLines] = None) -> int:
        """Run the agent on ``text`` and report; the exit code for this run.

        Args:
            text: the task.
            reader: for ``run``, the stdin reader to stop when the run ends:
                lines still waiting in stdin are reported as not delivered.
        """
        if not self._armed:
            self.arm()
        error: Optional[LoopError] = None
        run: Any = None
        try:
            with Interrupts() as interrupts:
                handle = self.loop.start(text, self.config)
                run = handle.record
                interrupts.attach(handle)
                self.approvals.attach(handle)
                try:
                    # Bounded waits: a signal handler only runs when the main
                    # thread wakes, and some platforms deliver it elsewhere.
                    while not handle.wait(0.2):
                        pass
                    run = handle.result()
                except LoopError as exc:
                    error = exc
        finally:
            self._disarm()
            late = reader.stop() if reader is not None else []
            self.approvals.detach()  # says which piped answers no call used
            self.console.close()
        self.console.end_text()
        with self._cond:
            not_sent, self._not_sent = self._not_sent + late, []
        leftovers = [m.text for m in self.loop.steering().take_leftovers()] + not_sent
        if isinstance(error, Cancelled):
            self.note("cancelled", "yellow", "bold")
        elif error is not None:
            self.console.line(f"error: {error}", "red", err=True)
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
        self.note(_summary(run, self.facts), "dim")
        if error is None:
            return EXIT_OK
        return EXIT_CANCELLED if isinstance(error, Cancelled) else EXIT_ERROR

    def close(self) -> None:
        """Close the loop (tool threads, temp dir) and stop the MCP servers."""
        self.console.close()
        self.loop.close()
        close_mcp_servers(self.mcp_servers)


class Interrupts:
    """SIGINT while a run is in flight: the first cancels it, a second exits at once.

    The handler never raises, so no ``KeyboardInterrupt`` can land inside
    ``start()`` or a lock; a Ctrl-C that comes before the handle exists is
    applied as soon as it does. Off the main thread it installs nothing.
    """

    def __init__(self) -> None:
        self._handle: Any = None
        self.count = 0
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
            self._installed = True
        return self

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.count > 1:
            restore_terminal()
            os._exit(EXIT_CANCELLED)
        if self._handle is not None:
            self._handle.cancel("interrupted (Ctrl-C)")

    def attach(self, handle: Any) -> None:
        """The run to cancel on Ctrl-C (cancelled now if Ctrl-C came first)."""
        self._handle = handle
        if self.count:
            handle.cancel("interrupted (Ctrl-C)")

    def __exit__(self, *exc: Any) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)


def _summary(run: Any, facts: RunFacts) -> str:
    def n(count: int, word: str) -> str:
        return f"{count} {word}{'' if count == 1 else 's'}"

    tokens = n(run.input_tokens + run.output_tokens, "token")
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
    var, default = _DEFAULT_MODELS[args.provider]
    kwargs: dict[str, Any] = {"model": args.model or env.get(var) or default}
    if args.base_url:
        kwargs["base_url"] = args.base_url
    return cls(**kwargs)


def main(argv: Optional[Sequence[str]] = None, *, stdin: Optional[IO[str]] = None,
         stdout: Optional[IO[str]] = None, stderr: Optional[IO[str]] = None,
         env: Optional[Mapping[str, str]] = None) -> int:
    """Run the ``loopctl`` command; returns the exit code.

    Args:
        argv: arguments (default ``sys.argv[1:]``).
        stdin, stdout, stderr: streams (default the process's).
        env: environment (default ``os.environ``).
    """
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # reported by the subcommand's parser, so its usage is shown
        parser.commands.get(args.command or "", parser).error(
            f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        parser.print_help(stdout or sys.stdout)
        return EXIT_USAGE
    if args.provider == "offline" and args.base_url:
        parser.commands[args.command].error("--base-url applies to --provider openai or anthropic")
    if getattr(args, "output_schema", None):
        args.output_schema_loaded = _load_schema(parser.commands[args.command], args.output_schema)
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    if args.provider == "offline" and args.model:
        err.write(f"warning: --model {args.model!r} only renames the offline demo model; "
                  "use --provider openai or anthropic for a real one\n")
    try:
        session = Command(args, stdin if stdin is not None else sys.stdin, out, err,
                          os.environ if env is None else env)
    except LoopError as exc:
        err.write(f"error: {exc}\n")
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


def _load_schema(parser: argparse.ArgumentParser, path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            schema = json.load(f)
    except (OSError, ValueError) as exc:
        parser.error(f"--output-schema {path}: {exc}")
    if not isinstance(schema, dict):
        parser.error(f"--output-schema {path}: a JSON Schema must be an object")
    return schema


def _chat(session: Command, reader: StdinLines) -> int:
    c = session.console
    interactive = _isatty(session.stdin)
    if interactive:
        session.note("loopctl chat: ask something; while it works, type guidance; "
                     "Ctrl-C stops a run; Ctrl-D or /quit leaves.", "dim")
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
