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
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import select
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any, Callable, Optional

from loopctl.config import RunConfig, SessionConfig
from loopctl.demo_tools import demo_tools
from loopctl.driver.loop import BareLoop
from loopctl.errors import Cancelled, ConfigError, LoopError
from loopctl.observers import (
    AttemptReset,
    CallbackObserver,
    LoopDetectedEvent,
    Observer,
    Response,
    SteeringDelivered,
    ToolCallReceived,
    ToolPost,
    ToolPre,
    TurnStart,
)
from loopctl.providers.offline import OfflineModel

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_CANCELLED = 0, 1, 2, 130
_STYLES = {"dim": "2", "bold": "1", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}
_FRAMES = "|/-\\"
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


class Console:
    """Serialized terminal output: streamed text, notes, the tool spinner."""

    def __init__(self, out: IO[str], err: IO[str], *, color: bool, tty: bool) -> None:
        self.out, self.err = out, err
        self.color, self.tty = color, tty
        self.lock = threading.RLock()
        self._at_bol = {id(out): True, id(err): True}
        self._spinner_shown = False
        self._running: dict[str, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def style(self, text: str, *names: str) -> str:
        """``text`` wrapped in ANSI styles when colour is on."""
        if not self.color or not names:
            return text
        return f"\x1b[{';'.join(_STYLES[n] for n in names)}m{text}\x1b[0m"

    def _write(self, stream: IO[str], text: str) -> None:
        if not text:
            return
        if self._spinner_shown:
            self._raw(self.out, "\r\x1b[K")
            self._spinner_shown = False
        self._raw(stream, text)
        self._at_bol[id(stream)] = text.endswith("\n")

    def _raw(self, stream: IO[str], text: str) -> None:
        try:
            try:
                stream.write(text)
            except UnicodeEncodeError:
                enc = getattr(stream, "encoding", None) or "ascii"
                stream.write(text.encode(enc, "replace").decode(enc))
            stream.flush()
        except (OSError, ValueError):  # a closed pipe must not break the run
            pass

    def text(self, delta: str) -> None:
        """Streamed reply text, as it arrives."""
        with self.lock:
            self._write(self.out, delta)

    def line(self, text: str, *styles: str, err: bool = False) -> None:
        """One full line (a newline first if the cursor is mid-line)."""
        stream = self.err if err else self.out
        with self.lock:
            if not self._at_bol[id(stream)]:
                self._write(stream, "\n")
            self._write(stream, self.style(text, *styles) + "\n")

    def end_text(self) -> None:
        """Finish a line of streamed text."""
        with self.lock:
            if not self._at_bol[id(self.out)]:
                self._write(self.out, "\n")

    # -- the spinner (terminal only) --------------------------------------------

    def tool_started(self, call_id: str, label: str) -> None:
        """A tool call began running; the spinner shows it until it ends."""
        with self.lock:
            self._running[call_id] = (label, time.monotonic())
        if self.tty and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._spin, name="loopctl-cli-spinner", daemon=True)
            self._thread.start()

    def tool_finished(self, call_id: str) -> None:
        """A tool call ended."""
        with self.lock:
            self._running.pop(call_id, None)

    def _spin(self) -> None:
        frame = 0
        while not self._stop.wait(0.1):
            with self.lock:
                if not self._running or not self._at_bol[id(self.out)]:
                    continue
                labels = ", ".join(label for label, _ in self._running.values())
                started = min(t for _, t in self._running.values())
                text = f"{_FRAMES[frame % 4]} {labels} {time.monotonic() - started:.1f}s"
                self._raw(self.out, "\r\x1b[K" + self.style(text, "dim"))
                self._spinner_shown = True
                frame += 1

    def close(self) -> None:
        """Stop the spinner thread and clear its line."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self.lock:
            self._running.clear()
            if self._spinner_shown:
                self._raw(self.out, "\r\x1b[K")
                self._spinner_shown = False


def _args_text(input: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in input.items())


def _one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class LiveView(Observer):
    """Shows a run as it happens: tool calls, results, guidance, retries."""

    def __init__(self, console: Console, *, streaming: bool) -> None:
        self.console = console
        self.streaming = streaming
        self.started = threading.Event()
        self._labels: dict[str, str] = {}

    def on_turn_start(self, event: TurnStart) -> None:
        """The slot is open by now: typed guidance may be pushed."""
        self.started.set()

    def on_response(self, event: Response) -> None:
        """Without streaming, a turn's text is shown whole."""
        if self.streaming:
            self.console.end_text()
        elif event.text:
            self.console.line(event.text)

    def on_tool_call_received(self, event: ToolCallReceived) -> None:
        """The call and its arguments, as soon as the model asks."""
        c = self.console
        label = f"{event.tool}({_args_text(event.input)})"
        self._labels[event.call_id] = label
        c.line(f"  {c.style('>', 'cyan')} {c.style(event.tool, 'cyan', 'bold')}({_args_text(event.input)})")

    def on_tool_pre(self, event: ToolPre) -> None:
        """The spinner starts for this call."""
        self.console.tool_started(event.call_id, self._labels.get(event.call_id, event.tool))

    def on_tool_post(self, event: ToolPost) -> None:
        """The result (or soft error) and how long it took."""
        c = self.console
        c.tool_finished(event.call_id)
        mark = c.style("!", "red") if event.is_error else c.style("<", "green")
        body = c.style(_one_line(event.output), "red") if event.is_error else _one_line(event.output)
        c.line(f"  {mark} {event.tool}: {body} {c.style(f'({event.duration_ms:.0f} ms)', 'dim')}")

    def on_steering(self, event: SteeringDelivered) -> None:
        """Guidance landed in the conversation."""
        for msg in event.messages:
            self.console.line(f"  [guidance delivered: {msg.text}]", "yellow")

    def on_attempt_reset(self, event: AttemptReset) -> None:
        """A stream attempt failed; the reply starts again."""
        self.console.line(f"  [stream interrupted; retry {event.attempt}]", "yellow")

    def on_loop_detected(self, event: LoopDetectedEvent) -> None:
        """A repeating tool pattern."""
        self.console.line(f"  [repeating tool calls: {event.pattern} x{event.repetitions}]", "yellow")


class StdinLines:
    """Reads lines from a stream on a daemon thread and hands each to ``on_line``.

    On POSIX it waits on the file descriptor together with a wake-up pipe, so
    ``stop()`` ends the thread at once; elsewhere (or for a stream without a
    descriptor) it reads lines until EOF. ``on_line(None)`` marks EOF.
    """

    def __init__(self, stream: Optional[IO[str]], on_line: Callable[[Optional[str]], None]) -> None:
        self._stream = stream
        self._on_line = on_line
        self._stopped = False
        self._wake: Optional[tuple[int, int]] = None
        self._thread = threading.Thread(target=self._main, name="loopctl-cli-stdin", daemon=True)

    def start(self) -> StdinLines:
        """Start reading (a missing stream reads as EOF at once)."""
        fd = self._fd()
        if fd is not None:
            self._wake = os.pipe()
        self._thread.start()
        return self

    def _fd(self) -> Optional[int]:
        if self._stream is None or os.name != "posix":
            return None
        try:
            return self._stream.fileno()
        except (AttributeError, OSError, ValueError):
            return None

    def _main(self) -> None:
        try:
            if self._stream is not None:
                fd = self._fd()
                if fd is not None and self._wake is not None:
                    self._read_fd(fd, self._wake[0])
                else:
                    for line in iter(self._stream.readline, ""):
                        if self._stopped:
                            return
                        self._emit(line)
        except (OSError, ValueError):
            pass  # a closed or unreadable stdin is just EOF
        finally:
            if self._wake is not None:
                os.close(self._wake[0])
            if not self._stopped:
                self._on_line(None)

    def _read_fd(self, fd: int, wake: int) -> None:
        buf = b""
        while not self._stopped:
            ready, _, _ = select.select([fd, wake], [], [])
            if wake in ready:
                return
            try:
                chunk = os.read(fd, 4096)
            except BlockingIOError:
                continue
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf and not self._stopped:
                raw, buf = buf.split(b"\n", 1)
                self._emit(raw.decode("utf-8", "replace"))
        if buf.strip() and not self._stopped:
            self._emit(buf.decode("utf-8", "replace"))

    def _emit(self, line: str) -> None:
        line = line.strip()
        if line:
            self._on_line(line)

    def stop(self) -> None:
        """End the thread (at once on POSIX) and wait for it."""
        self._stopped = True
        if self._wake is not None:
            try:
                os.write(self._wake[1], b"x")
                os.close(self._wake[1])
            except OSError:
                pass
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(1.0 if self._wake is not None else 0.05)


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
        loop = BareLoop(client, demo_tools(tool_delay), SessionConfig(system_prompt=a.system))
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
        """Close the loop (tool threads, temp dir)."""
        self.console.close()
        self.loop.close()


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
            with c.lock:
                c._write(c.err if session.args.json else c.out, c.style("> ", "bold"))
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
