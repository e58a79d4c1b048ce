"""A Flask app that runs agents on worker threads and streams them to a browser.

The request that starts a run is not the one that steers it, stops it or
streams it, so every route talks to one ``RunRegistry`` by run id:

    POST /runs                 {"input": "...", "conversation": key?} -> 201 {"run_id", "conversation"}
    GET  /runs                 -> {"conversation", "runs"}: this session's current conversation
                                  and the status of each of its runs the registry still keeps
    POST /conversations        -> 201 {"conversation"}: start a new conversation (the page's
                                  "New conversation"); the next run without a key goes to it
    POST /runs/<id>/steer      {"text": "..."} -> {"accepted": bool}
    POST /runs/<id>/cancel     {"reason": "..."?} -> {"cancelled": bool}
    POST /runs/<id>/approvals/<call_id>
                               {"approve": bool, "reason": "..."?, "arguments": {...}?}
                               -> {"answered": bool}; 400 for arguments the tool refuses
    GET  /runs/<id>            -> the run's status and its undelivered guidance
    GET  /runs/<id>/events     -> server-sent events, one per observer event;
                                  resumes after the Last-Event-ID header
    GET  /                     -> a page with a block per run (and its summary), a guidance
                                  box, a Stop button, Approve / Deny buttons for calls that
                                  wait for a person and "New conversation"; a reload shows
                                  the conversation again and reattaches to a run in flight

Safe to copy, with the protections a real app needs:

- Sessions: a signed session cookie (HttpOnly, SameSite=Lax) holds a random
  owner id. Set ``LOOPCTL_EXAMPLE_SECRET_KEY`` (or pass ``secret_key=``);
  without it each process makes a random key, so sessions end on restart.
- CSRF: every POST must carry the session's token in ``X-CSRFToken``; the
  page gets it in a hidden input. Without it: 403, and nothing happens.
- Runs are owned: a run belongs to the session that started it (the
  registry's ``owner=``). Another session asking for it by id, for status,
  events, guidance or cancel, gets the same 404 as an unknown id: a run id
  is a name, not an authorisation. Conversations are per owner too.

A conversation key maps to one ``BareLoop`` (``registry.loop_for``), so a
follow-up continues the history; a new run on a conversation whose run is
still going gets 409. What the server keeps per browser session (its owner
id, its current conversation, the runs started in it) lives in one small
class, ``BrowserSession``, over the signed session cookie. The model is the embedded offline demo model, slowed
a little so the page visibly streams. Needs ``pip install -e '.[examples]'``.

    python examples/flask_app.py        # then open http://127.0.0.1:5000/
"""

from __future__ import annotations

import functools
import hmac
import html
import json
import os
import secrets
import sys
import uuid
from collections.abc import Hashable, Iterator, MutableMapping
from pathlib import Path
from typing import Any, Callable, Optional

try:
    import loopctl  # noqa: F401
except ImportError:  # run from a checkout without ``pip install -e .``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flask import Flask, Response, jsonify, request, session

from loopctl import BareLoop, LoopBusy
from loopctl.demo import OfflineModel, demo_tools
from loopctl.hosting.registry import RunRegistry

PAGE = Path(__file__).resolve().parent / "static" / "live.html"
KEEPALIVE_S = 15.0
CSRF_HEADER = "X-CSRFToken"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def default_loop() -> BareLoop:
    """A loop on the offline demo model, slowed so streaming is visible; ``multiply`` needs approval."""
    loop = BareLoop(OfflineModel(delay=0.02), demo_tools(delay=0.5))
    return loop.with_approval(lambda ctx: ctx.tool == "multiply")


def sse_lines(
    registry: RunRegistry, run_id: str, owner: Hashable, after: int, keepalive: float = KEEPALIVE_S
) -> Iterator[str]:
    """The run's events as SSE frames (``id`` = sequence number), until ``run_end``.

    While the run is quiet a comment line goes out every ``keepalive``
    seconds, so proxies keep the connection open.
    """
    last = after
    while True:
        ended = False
        for seq, event in registry.events(run_id, after=last, timeout=keepalive, owner=owner):
            last = seq
            ended = event["type"] == "run_end"
            yield f"id: {seq}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
        if ended:
            return
        if registry.status(run_id, owner=owner).state != "running":
            # Ended while we were between waits (or a resume after the end):
            # whatever is left comes at once, then the stream closes.
            for seq, event in registry.events(run_id, after=last, timeout=0, owner=owner):
                yield f"id: {seq}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
            return
        yield ": keep-alive\n\n"


class BrowserSession:
    """What the server keeps for one browser session, over a session mapping.

    The owner id and CSRF token (random, made on first use), the current
    conversation key and the runs started in each conversation (the newest
    ``RUNS_KEPT``). It is the one place that reads or writes per-session
    state: to keep conversations in a store instead of the signed cookie,
    change this class. Lists are replaced, never mutated in place, so the
    framework sees every change.
    """

    RUNS_KEPT = 20  # the cookie stays well under the 4 KB browsers keep

    def __init__(self, data: MutableMapping[str, Any]) -> None:
        self._data = data

    def secret(self, name: str) -> str:
        """The session's random value ``name`` (made on first use): its owner id or CSRF token."""
        value = self._data.get(name)
        if not isinstance(value, str):
            value = self._data[name] = secrets.token_urlsafe(32)
        return value

    @property
    def owner(self) -> str:
        """Who the session's runs belong to (the registry's ``owner=``)."""
        return self.secret("owner")

    @property
    def conversation(self) -> Optional[str]:
        """The conversation the page shows (None before the first run)."""
        value = self._data.get("conversation")
        return value if isinstance(value, str) else None

    def new_conversation(self) -> str:
        """Make a fresh conversation the current one; its key."""
        key = self._data["conversation"] = uuid.uuid4().hex
        return key

    def started(self, run_id: str, conversation: str) -> None:
        """Record a run started in ``conversation``, which becomes the current one."""
        self._data["runs"] = [*self._runs(), [run_id, conversation]][-self.RUNS_KEPT :]
        self._data["conversation"] = conversation

    def run_ids(self) -> list[str]:
        """The current conversation's runs, oldest first."""
        key = self.conversation
        return [run_id for run_id, conversation in self._runs() if conversation == key]

    def _runs(self) -> list[list[str]]:
        runs = self._data.get("runs")
        return [r for r in runs if isinstance(r, list) and len(r) == 2] if isinstance(runs, list) else []


def session_runs(registry: RunRegistry, browser: BrowserSession) -> dict[str, Any]:
    """``GET /runs``: the current conversation and its runs' status, owner-checked.

    A run the registry no longer keeps (pruned ``keep_finished_s`` after it
    ended) is left out.
    """
    owner, runs = browser.owner, []
    for run_id in browser.run_ids():
        try:
            info = registry.status(run_id, owner=owner).to_dict()
            info["leftovers"] = [m.text for m in registry.leftovers(run_id, owner=owner)]
        except KeyError:
            continue
        runs.append(info)
    return {"conversation": browser.conversation, "runs": runs}


def create_app(
    registry: Optional[RunRegistry] = None,
    loop_factory: Callable[[], BareLoop] = default_loop,
    secret_key: Optional[str] = None,
) -> Flask:
    """The app; ``registry``, ``loop_factory`` and ``secret_key`` are injectable (tests use their own).

    ``secret_key`` signs the session cookie; default: ``LOOPCTL_EXAMPLE_SECRET_KEY``
    from the environment, else a random key for this process.
    """
    registry = registry if registry is not None else RunRegistry()
    app = Flask(__name__)
    app.config.update(
        SECRET_KEY=secret_key or os.environ.get("LOOPCTL_EXAMPLE_SECRET_KEY") or secrets.token_hex(32),
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
    )
    app.extensions["loopctl_registry"] = registry

    def body() -> dict[str, Any]:
        data = request.get_json(silent=True)
        return data if isinstance(data, dict) else {}

    @app.before_request
    def check_csrf() -> Any:
        # Every state-changing request must prove it came from our page: the
        # token is in the page and the session, never in a cookie another
        # site's form could send along on its own.
        if request.method in SAFE_METHODS:
            return None
        expected = session.get("csrf_token")
        sent = request.headers.get(CSRF_HEADER, "")
        if not isinstance(expected, str) or not hmac.compare_digest(expected.encode(), sent.encode()):
            return jsonify(error="CSRF token missing or incorrect"), 403
        return None

    @app.after_request
    def harden(response: Response) -> Response:
        response.headers.setdefault("X-Frame-Options", "DENY")  # no Stop button under a clickjack
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        return response

    def browser() -> BrowserSession:
        return BrowserSession(session)

    def by_id(view: Callable[[str, str], Any]) -> Callable[[str], Any]:
        """Run ``view(run_id, owner)``; unknown and foreign runs get one and the same 404."""

        @functools.wraps(view)
        def wrapped(run_id: str) -> Any:
            try:
                return view(run_id, browser().owner)
            except KeyError:
                return jsonify(error="unknown run"), 404

        return wrapped

    @app.get("/")
    def page() -> Any:
        token = html.escape(browser().secret("csrf_token"), quote=True)
        text = PAGE.read_text(encoding="utf-8").replace("__CSRF_TOKEN__", token)
        return Response(text, mimetype="text/html", headers={"Cache-Control": "no-store"})

    @app.post("/runs")
    def start_run() -> Any:
        data = body()
        text = data.get("input")
        if not isinstance(text, str) or not text.strip():
            return jsonify(error="'input' must be a non-empty string"), 400
        you = browser()
        owner = you.owner
        key = str(data.get("conversation") or uuid.uuid4().hex)
        # Conversations are per owner: another session naming the same key
        # gets a loop of its own, never this one's history.
        loop = registry.loop_for((owner, key), loop_factory)
        try:
            run_id = registry.start(loop, text, owner=owner)
        except LoopBusy as exc:
            return jsonify(error=str(exc)), 409
        you.started(run_id, key)
        return jsonify(run_id=run_id, conversation=key), 201

    @app.get("/runs")
    def list_runs() -> Any:
        return jsonify(session_runs(registry, browser()))

    @app.post("/conversations")
    def new_conversation() -> Any:
        return jsonify(conversation=browser().new_conversation()), 201

    @app.post("/runs/<run_id>/steer")
    @by_id
    def steer(run_id: str, owner: str) -> Any:
        text = body().get("text")
        if not isinstance(text, str) or not text.strip():
            registry.status(run_id, owner=owner)  # an unknown run is a 404 first
            return jsonify(error="'text' must be a non-empty string"), 400
        return jsonify(accepted=registry.steer(run_id, text, owner=owner))

    @app.post("/runs/<run_id>/cancel")
    @by_id
    def cancel(run_id: str, owner: str) -> Any:
        reason = body().get("reason") or "cancelled from the web"
        return jsonify(cancelled=registry.cancel(run_id, str(reason), owner=owner))

    @app.post("/runs/<run_id>/approvals/<call_id>")
    def answer(run_id: str, call_id: str) -> Any:
        # A person answers a call the run is waiting on, from this page or any
        # other page of the same session; the registry takes the first answer.
        data = body()
        owner = browser().owner
        try:
            if data.get("approve") is True:
                arguments = data.get("arguments")
                if arguments is not None and not isinstance(arguments, dict):
                    return jsonify(error="'arguments' must be an object"), 400
                answered = registry.approve(run_id, call_id, by="web", arguments=arguments, owner=owner)
            else:
                reason = str(data.get("reason") or "denied from the web")
                answered = registry.deny(run_id, call_id, reason, by="web", owner=owner)
        except KeyError:
            return jsonify(error="unknown run"), 404
        except ValueError as exc:  # edited arguments the tool's schema refuses; still pending
            return jsonify(error=str(exc)), 400
        return jsonify(answered=answered)

    @app.get("/runs/<run_id>")
    @by_id
    def status(run_id: str, owner: str) -> Any:
        info = registry.status(run_id, owner=owner).to_dict()
        info["leftovers"] = [m.text for m in registry.leftovers(run_id, owner=owner)]
        return jsonify(info)

    @app.get("/runs/<run_id>/events")
    @by_id
    def events(run_id: str, owner: str) -> Any:
        registry.status(run_id, owner=owner)  # 404 now, not inside the stream
        header = request.headers.get("Last-Event-ID") or request.args.get("after") or "0"
        after = int(header) if header.isdigit() else 0
        return Response(
            sse_lines(registry, run_id, owner, after),
            mimetype="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return app


if __name__ == "__main__":
    create_app().run(threaded=True)
