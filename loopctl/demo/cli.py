"""The ``loopctl`` command: ``loopctl run "..."`` and ``loopctl chat``.

It drives a ``BareLoop`` the way an app would: the run goes on its worker
thread (``start()``) so the main thread keeps SIGINT; text streams through
the text streamer; tool calls, their results and delivered guidance come
from an observer. Lines typed on stdin while a run works are pushed as
steering by a daemon reader thread (``loopctl-cli-stdin``) that ends at EOF
or when the command is done. Ctrl-C cancels the run (a second one exits at
once) and prints what guidance was never delivered. Exit codes: 0 success,
130 cancelled or interrupted, 1 a ``LoopError``, 2 a usage error. Colours
and the spinner appear only on a terminal, colours never with ``NO_COLOR``.
The terminal view itself (``Console``, ``LiveView``, ``StdinLines``) lives
in ``loopctl.demo.view`` and is re-exported here.
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

from loopctl.config import RunConfig, SessionConfig
from loopctl.demo.mcp_servers import close_mcp_servers, open_mcp_servers
from loopctl.demo.model import OfflineModel
from loopctl.demo.tools import demo_tools
from loopctl.demo.view import Console, LiveView, StdinLines
from loopctl.driver.loop import BareLoop
from loopctl.errors import Cancelled, ConfigError, LoopError
from loopctl.observers import CallbackObserver, Observer, TurnStart

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_CANCELLED = 0, 1, 2, 130
_DEFAULT_MODELS = {"openai": ("OPENAI_MODEL", "gpt-4o-mini"),
                   "anthropic": ("ANTHROPIC_MODEL", "claude-sonnet-4-20250514")}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``loopctl`` command."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--provider", choices=("offline", "openai", "anthropic"), default="offline",
                        help="model provider (default: the embedded offline demo model)")
    common.add_argument("--model", help="model name (provider default when omitted)")
    common.add_argument("--base-url", help="API base URL (openai: include /v1; anthropic: host root)")
    common.add_argument("--system", help="system prompt")
    common.add_argument("--max-turns", type=int, default=None, help="model calls allowed per run")
    common.add_argument("--json", action="store_true",
                        help="print one JSON object per observer event on stdout")
    common.add_argument("--no-stream", action="store_true", help="ask for whole replies, not streams")
    common.add_argument("--mcp", action="append", default=[], metavar='"COMMAND ARGS"',
                        help="run an MCP server (stdio) and give its tools to the agent (repeatable)")
    # Hidden: slow the demo down so a person (or a terminal test) can type in time.
    common.add_argument("--delay", type=float, default=None, help=argparse.SUPPRESS)
    common.add_argument("--tool-delay", type=float, default=None, help=argparse.SUPPRESS)
    parser = argparse.ArgumentParser(
        prog="loopctl",
        description="Run an LLM agent: streaming, live tool calls, typed guidance, Ctrl-C to stop.",
    )
    sub = parser.add_subparsers(dest="command", metavar="{run,chat}")
    run = sub.add_parser("run", parents=[common], help="run the agent once on a task")
    run.add_argument("input", help='the task, e.g. "What is 12 + 30?"')
    sub.add_parser("chat", parents=[common], help="several runs in one session (history kept)")
    return parser


class Command:
    """One ``loopctl`` invocation: the loop, the console, the run in flight."""

    def __init__(self, args: argparse.Namespace, stdin: Optional[IO[str]], out: IO[str],
                 err: IO[str], env: Mapping[str, str]) -> None:
        self.args = args
        tty = _isatty(out)
        self.console = Console(out, err, color=tty and not env.get("NO_COLOR"), tty=tty)
        self.stdin = stdin
        self.streaming = not args.no_stream
        self.view = LiveView(self.console, streaming=self.streaming)
        self.config = RunConfig() if args.max_turns is None else RunConfig(max_turns=args.max_turns)
        self.loop = self._make_loop(env, tty)
        self.prompts: queue.Queue[Optional[str]] = queue.Queue()
        self._lock = threading.Lock()
        self._running: Optional[LiveView] = None
        # Piped input to ``chat`` is a script of prompts; typed lines steer.
        self.steer_from_stdin = args.command == "run" or _isatty(stdin)

    def _make_loop(self, env: Mapping[str, str], tty: bool) -> BareLoop:
        a = self.args
        tool_delay = a.tool_delay if a.tool_delay is not None else float(env.get("LOOPCTL_DEMO_TOOL_DELAY") or 0)
        client = make_client(a, env, visible=tty and self.streaming and not a.json)
        self.mcp_servers, mcp_tools = open_mcp_servers(a.mcp)
        loop = BareLoop(client, [*demo_tools(tool_delay), *mcp_tools], SessionConfig(system_prompt=a.system))
        if not self.streaming:
            loop.set_turn_mode("non_streaming")
        if a.json:
            out = self.console
            loop.register_observer(CallbackObserver(
                lambda e: out.line(json.dumps(e.to_dict(), ensure_ascii=False))))
            loop.register_observer(_Started(self.view.started))
        else:
            loop.set_text_streamer(self.console.text)
            loop.register_observer(self.view)
        return loop

    def note(self, text: str, *styles: str) -> None:
        """A status line: stdout for people, stderr in ``--json`` mode."""
        self.console.line(text, *styles, err=self.args.json)

    # -- stdin ------------------------------------------------------------------

    def on_line(self, line: Optional[str]) -> None:
        """A typed line: guidance for the run in flight, else the next prompt."""
        with self._lock:
            view = self._running if self.steer_from_stdin else None
        if line is None or view is None:
            self.prompts.put(line)
            return
        view.started.wait()  # set at the first turn or when the run ends
        if self.loop.steering().push(line):
            self.note(f"  [guidance queued: {line}]", "yellow")
        else:
            self.note(f"  [run finished; guidance not sent: {line}]", "dim")

    # -- one run ----------------------------------------------------------------

    def run_once(self, text: str) -> int:
        """Run the agent on ``text`` and report; the exit code for this run."""
        self.view.started.clear()
        with self._lock:
            self._running = self.view  # lines typed from now on are guidance
        error: Optional[LoopError] = None
        run: Any = None
        try:
            with Interrupts() as interrupts:
                handle = self.loop.start(text, self.config)
                run = handle.record
                interrupts.attach(handle)
                try:
                    # Bounded waits: a signal handler only runs when the main
                    # thread wakes, and some platforms deliver it elsewhere.
                    while not handle.wait(0.2):
                        pass
                    run = handle.result()
                except LoopError as exc:
                    error = exc
        finally:
            with self._lock:
                self._running = None
            self.view.started.set()
            self.console.close()
        self.console.end_text()
        leftovers = self.loop.steering().take_leftovers()
        if isinstance(error, Cancelled):
            self.note("cancelled", "yellow", "bold")
        elif error is not None:
            self.console.line(f"error: {error}", "red", err=True)
        if leftovers:
            self.note("guidance not delivered:" if error is not None
                      else "guidance not delivered (the run finished first):", "yellow")
            for msg in leftovers:
                self.note(f"  - {msg.text}", "yellow")
        self.note(_summary(run), "dim")
        if error is None:
            return EXIT_OK
        return EXIT_CANCELLED if isinstance(error, Cancelled) else EXIT_ERROR

    def close(self) -> None:
        """Close the loop (tool threads, temp dir) and stop the MCP servers."""
        self.console.close()
        self.loop.close()
        close_mcp_servers(self.mcp_servers)


class _Started(Observer):
    def __init__(self, started: threading.Event) -> None:
        self._started = started

    def on_turn_start(self, event: TurnStart) -> None:
        self._started.set()


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


def _summary(run: Any) -> str:
    def n(count: int, word: str) -> str:
        return f"{count} {word}{'' if count == 1 else 's'}"

    return (f"-- {n(run.turn_count, 'turn')}, {n(run.tool_call_count, 'tool call')}, "
            f"{n(run.input_tokens + run.output_tokens, 'token')}, {run.duration:.2f}s")


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
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(stdout or sys.stdout)
        return EXIT_USAGE
    if args.provider == "offline" and args.base_url:
        parser.error("--base-url applies to --provider openai or anthropic")
    for name in ("delay", "tool_delay"):
        if (getattr(args, name) or 0) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0")
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    try:
        session = Command(args, stdin if stdin is not None else sys.stdin, out, err,
                          os.environ if env is None else env)
    except LoopError as exc:
        err.write(f"error: {exc}\n")
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_CANCELLED
    reader = StdinLines(session.stdin, session.on_line)
    try:
        if args.command == "run":
            reader.start()
            return session.run_once(args.input)
        return _chat(session, reader)
    except KeyboardInterrupt:
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
