"""The ``loopctl`` command's arguments: the parser, its value checks, the schema file.

A bad value is a usage error caught before anything runs, and its message
names the value (never a credential written into a URL).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import IO, Any, NoReturn, Optional
from urllib.parse import urlsplit

from loopctl import __version__
from loopctl.errors import ConfigError
from loopctl.output.spec import OutputSpec
from loopctl.sessions.base import check_session_id


class UsageExit(Exception):
    """A usage error, ``--help`` or ``--version`` ended the command: ``code`` is its exit code."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class UsageError(Exception):
    """A bad argument found only once the command's parts exist (an ``--ask`` no tool answers to)."""


class CommandParser(argparse.ArgumentParser):
    """An argument parser that writes to the command's streams and never exits the process.

    ``main()`` runs in-process: help, version and usage errors go to the
    streams it was given, and end it with ``UsageExit`` (its exit code).
    """

    commands: dict[str, CommandParser]
    out: Optional[IO[str]] = None
    err: Optional[IO[str]] = None

    def bind(self, out: IO[str], err: IO[str]) -> None:
        """Write to ``out`` (help, version) and ``err`` (usage errors), subcommands included."""
        for parser in (self, *getattr(self, "commands", {}).values()):
            parser.out, parser.err = out, err

    def _print_message(self, message: str, file: Any = None) -> None:
        if message:
            stream = self.err if file is sys.stderr else self.out if file is sys.stdout else file
            (stream or file or sys.stderr).write(message)

    def exit(self, status: int = 0, message: Optional[str] = None) -> NoReturn:
        if message:
            self._print_message(message, sys.stderr)
        raise UsageExit(status)


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
        value = -1.0
    if not 0 <= value < float("inf"):  # NaN, an infinity and 1e400 (read as one) included
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text!r}")
    return value


def _session_name(text: str) -> str:
    try:
        return check_session_id(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError("must be a non-empty name" if not text else str(exc)) from None


def build_parser() -> CommandParser:
    """The argument parser of the ``loopctl`` command."""
    common = CommandParser(add_help=False)
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
    common.add_argument("--subagent", action="store_true",
                        help="hand arithmetic to a 'calculator' sub-agent with its own add/multiply tools")
    # Hidden: the offline model's pause between streamed text deltas.
    common.add_argument("--delay", type=_seconds, default=None, help=argparse.SUPPRESS)
    parser = CommandParser(
        prog="loopctl",
        description="Run an LLM agent: streaming, live tool calls, typed guidance, Ctrl-C to stop.",
    )
    version = f"loopctl {__version__}"
    parser.add_argument("--version", action="version", version=version)
    common.add_argument("--version", action="version", version=version, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="{run,chat}", parser_class=CommandParser)
    run = sub.add_parser("run", parents=[common], help="run the agent once on a task")
    run.add_argument("input", help='the task, e.g. "What is 12 + 30?"')
    run.add_argument("--output-schema", metavar="SCHEMA.json",
                     help="ask for an answer that fits this JSON Schema; print the validated object as JSON")
    chat = sub.add_parser("chat", parents=[common], help="several runs in one session (history kept)")
    chat.add_argument("--session", metavar="NAME", type=_session_name,
                      help="continue the named conversation across invocations (kept in the user's data folder)")
    chat.add_argument("--session-db", metavar="PATH", help="the SQLite file --session keeps conversations in")
    parser.commands = {"run": run, "chat": chat}
    return parser


def load_schema(parser: argparse.ArgumentParser, path: str) -> object:
    """The JSON Schema in ``path`` (a usage error through ``parser`` if it is not one).

    It is compiled as the run will compile it, so a schema the run would
    refuse is a usage error before any model call.
    """
    try:
        with open(path, encoding="utf-8") as f:
            schema = json.load(f)
    except (OSError, ValueError) as exc:
        parser.error(f"--output-schema {path}: {exc}")
    if not isinstance(schema, dict):
        parser.error(f"--output-schema {path}: a JSON Schema must be an object")
    try:
        OutputSpec.of(schema)
    except ConfigError as exc:
        parser.error(f"--output-schema {path}: {exc}")
    return schema


__all__ = ["CommandParser", "UsageError", "UsageExit", "build_parser", "load_schema"]
