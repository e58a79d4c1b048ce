"""A Flask app that runs agents on worker threads and streams them to a browser.

The request that starts a run is not the one that steers it, stops it or
streams it, so every route talks to one ``RunRegistry`` by run id:

    POST /runs                 {"input": "...", "conversation": id?} -> 201 {"run_id", "conversation"};
                               404 for a conversation of another session, 409 while one of
                               its runs is in flight
    GET  /runs                 -> {"conversation", "messages", "running"}: this session's current
                                  conversation as stored (completed runs only) and the id of
                                  its run in flight, if any
    POST /conversations        -> 201 {"conversation"}: start a new conversation (the page's
                                  "New conversation"); the next run without an id goes to it
    POST /runs/<id>/steer      {"text": "..."} -> {"accepted": bool}
    POST /runs/<id>/cancel     {"reason": "..."?} -> {"cancelled": bool}
    POST /runs/<id>/approvals/<call_id>
                               {"approve": bool, "reason": "..."?, "arguments": {...}?}
                               -> {"answered": bool}; 400 for arguments the tool refuses
    GET  /runs/<id>            -> the run's status and its undelivered guidance: "queued" (to be
                                  delivered, after event "queued_after") and "leftovers" (never)
    GET  /runs/<id>/events     -> server-sent events, one per observer event;
                                  resumes after the Last-Event-ID header
    GET  /                     -> a page with a block per run (and its summary), a guidance
                                  box, a Stop button, Approve / Deny buttons for calls that
                                  wait for a person and "New conversation"; a reload, or a
                                  restarted server, shows the conversation again and
                                  reattaches to a run in flight

Conversations are kept in a SQLite session store (``loopctl.sessions``):
the file named by ``LOOPCTL_SESSION_DB``, else ``web-sessions.db`` in the
user's data folder (``~/.local/share/loopctl`` on Linux, as the loopctl
command uses). Every completed run is written there as it ends, so a
restarted server shows each conversation and continues it: the model sees
the earlier turns. A cancelled or failed run writes nothing.

Safe to copy, with the protections a real app needs:

- Sessions: a signed session cookie (HttpOnly, SameSite=Lax) holds two
  values only: a random owner id and the current conversation's id; the
  store holds the rest. Set ``LOOPCTL_EXAMPLE_SECRET_KEY`` (or pass
  ``secret_key=``); without it each process makes a random key, so browser
  sessions end on restart (their stored conversations stay, unreachable).
- CSRF: every POST must carry the session's token in ``X-CSRFToken``; the
  page gets it in a hidden input. Without it: 403, and nothing happens.
  The token is an HMAC of the owner id under the secret key, so the cookie
  need not carry it. Two tabs opened at once on a first visit each make a
  session, and the browser keeps one cookie: the page answers a refused
  POST by taking the token of a fresh copy of itself and sending it once more.
- Runs are owned: a run belongs to the session that started it (the
  registry's ``owner=``). Another session asking for it by id, for status,
  events, guidance or cancel, gets the same 404 as an unknown id: a run id
  is a name, not an authorisation. Conversations are owned the same way in
  the store: another session's conversation id is an unknown id.

A conversation id maps to one stored session (``registry.start(...,
session_id=, owner=)``) and, in this process, to one ``BareLoop``
(``registry.loop_for``). What the server keeps per browser session lives in
one small class, ``BrowserSession``, over the signed session cookie. The
model is the embedded offline demo model, slowed a little so the page
visibly streams. Needs ``pip install -e '.[examples]'``.

    python examples/flask_app.py        # then open http://127.0.0.1:5000/
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import html
import json
import os
import re
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

from loopctl import BareLoop, ConfigError, LoopBusy, SessionCorrupt
from loopctl.demo import OfflineModel, demo_tools
from loopctl.demo.chat_sessions import data_dir
from loopctl.hosting.registry import RunRegistry
from loopctl.messages import Message
from loopctl.sessions import SQLiteSessionStore

PAGE = Path(__file__).resolve().parent / "static" / "live.html"
KEEPALIVE_S = 15.0
CSRF_HEADER = "X-CSRFToken"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
DB_NAME = "web-sessions.db"


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
    """What the server keeps for one browser session: an owner id and the current conversation.

    The session cookie holds these two values and nothing else; each
    conversation (its completed runs' messages) is in the session store,
    owned by the owner id. So the cookie never grows, two tabs of one
    browser never overwrite each other's runs, and a restarted server finds
    every conversation again. It is the one place that reads or writes
    per-session state.
    """

    def __init__(self, data: MutableMapping[str, Any], store: Any) -> None:
        self._data = data
        self._store = store

    @property
    def owner(self) -> str:
        """Who the session's runs and conversations belong to (random, made on first use)."""
        value = self._data.get("owner")
        if not isinstance(value, str):
            value = self._data["owner"] = secrets.token_urlsafe(32)
        return value

    def csrf_token(self, key: str) -> str:
        """The session's CSRF token: an HMAC of its owner id under the app's ``key``."""
        return hmac.new(key.encode(), b"csrf:" + self.owner.encode(), hashlib.sha256).hexdigest()

    @property
    def conversation(self) -> Optional[str]:
        """The conversation the page shows (None before the first one)."""
        value = self._data.get("conversation")
        return value if isinstance(value, str) and CONVERSATION_ID.fullmatch(value) else None

    def new_conversation(self) -> str:
        """Make a fresh conversation the current one; its id.

        It is claimed in the store at once, so it is this owner's from the
        start: to anyone else it is an unknown id, even while its first run
        works (a run writes only as it ends).
        """
        key = uuid.uuid4().hex
        lease = self.stored(key).acquire()
        try:
            lease.append([])
        finally:
            lease.release()
        self._data["conversation"] = key
        return key

    def use(self, conversation: str) -> None:
        """Make ``conversation`` the current one (a run was started in it)."""
        self._data["conversation"] = conversation

    def stored(self, conversation: str) -> Any:
        """The conversation's stored session, as this owner sees it."""
        return self._store.session(conversation, owner=self.owner)


CONVERSATION_ID = re.compile(r"[0-9a-f]{32}")  # what new_conversation makes


def conversation_view(registry: RunRegistry, browser: BrowserSession) -> dict[str, Any]:
    """``GET /runs``: the current conversation as stored, and its run in flight.

    The stored conversation is what the model sees next: every completed
    run, none of a cancelled or failed one. The run in flight has not been
    written yet; the page follows it from its events.
    """
    key, owner = browser.conversation, browser.owner
    if key is None:
        return {"conversation": None, "messages": [], "running": None}
    # A run that ends between the two lookups has written its messages by
    # then: the read is taken again, so the page neither misses it nor draws
    # it twice. (In the instant between a run's write and its run_end event a
    # reload can still draw it twice, stored and followed; the next one is right.)
    for _ in range(3):
        running = registry.run_on_session(key, owner=owner)
        try:
            messages = browser.stored(key).messages()
        except KeyError:  # not this owner's: nothing to show
            return {"conversation": None, "messages": [], "running": None}
        if registry.run_on_session(key, owner=owner) == running:
            break
    return {"conversation": key, "messages": [shown(m) for m in messages], "running": running}


def shown(message: Message) -> dict[str, Any]:
    """A stored message as the page renders it (the model's private reasoning left out)."""
    data = message.to_dict()
    data["parts"] = [p for p in data["parts"] if p["type"] != "thinking"]
    return data


def open_store() -> SQLiteSessionStore:
    """The SQLite store: ``$LOOPCTL_SESSION_DB``, else ``web-sessions.db`` in the user's data folder."""
    configured = os.environ.get("LOOPCTL_SESSION_DB")
    if configured:
        return SQLiteSessionStore(Path(configured).expanduser())
    folder = data_dir(os.environ)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return SQLiteSessionStore(folder / DB_NAME)


def create_app(
    registry: Optional[RunRegistry] = None,
    loop_factory: Callable[[], BareLoop] = default_loop,
    secret_key: Optional[str] = None,
) -> Flask:
    """The app; ``registry``, ``loop_factory`` and ``secret_key`` are injectable (tests use their own).

    ``registry`` must keep conversations in a session store
    (``RunRegistry(session_store=...)``); default: one on ``open_store()``.
    ``secret_key`` signs the session cookie; default: ``LOOPCTL_EXAMPLE_SECRET_KEY``
    from the environment, else a random key for this process.
    """
    registry = registry if registry is not None else RunRegistry(session_store=open_store())
    store = registry.session_store
    if store is None:
        raise ConfigError("the example keeps conversations in a store: pass RunRegistry(session_store=...)")
    app = Flask(__name__)
    app.config.update(
        SECRET_KEY=secret_key or os.environ.get("LOOPCTL_EXAMPLE_SECRET_KEY") or secrets.token_hex(32),
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
    )
    app.extensions["loopctl_registry"] = registry
    key = str(app.config["SECRET_KEY"])

    def body() -> dict[str, Any]:
        data = request.get_json(silent=True)
        return data if isinstance(data, dict) else {}

    def browser() -> BrowserSession:
        return BrowserSession(session, store)

    @app.before_request
    def check_csrf() -> Any:
        # Every state-changing request must prove it came from our page: the
        # token is in the page, never in a cookie another site's form could
        # send along on its own.
        if request.method in SAFE_METHODS:
            return None
        if not isinstance(session.get("owner"), str):
            return jsonify(error="CSRF token missing or incorrect"), 403  # no page was ever loaded
        expected = browser().csrf_token(key)
        sent = request.headers.get(CSRF_HEADER, "")
        if not hmac.compare_digest(expected.encode(), sent.encode()):
            return jsonify(error="CSRF token missing or incorrect"), 403
        return None

    @app.after_request
    def harden(response: Response) -> Response:
        response.headers.setdefault("X-Frame-Options", "DENY")  # no Stop button under a clickjack
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        return response

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
        token = html.escape(browser().csrf_token(key), quote=True)
        text = PAGE.read_text(encoding="utf-8").replace("__CSRF_TOKEN__", token)
        return Response(text, mimetype="text/html", headers={"Cache-Control": "no-store"})

    @app.post("/runs")
    def start_run() -> Any:
        data = body()
        text = data.get("input")
        if not isinstance(text, str) or not text.strip():
            return jsonify(error="'input' must be a non-empty string"), 400
        you = browser()
        asked = data.get("conversation")
        if asked is not None and not (isinstance(asked, str) and CONVERSATION_ID.fullmatch(asked)):
            return jsonify(error="'conversation' must be an id this server gave"), 400
        conversation = asked or you.conversation or you.new_conversation()
        owner = you.owner
        loop = registry.loop_for((owner, conversation), loop_factory)
        try:
            run_id = registry.start(loop, text, owner=owner, session_id=conversation)
        except KeyError:  # another session's conversation: to this one, an unknown id
            return jsonify(error="unknown conversation"), 404
        except LoopBusy as exc:  # SessionBusy too: a run on it is in flight, here or elsewhere
            return jsonify(error=str(exc)), 409
        # A corrupt conversation is no refusal: the run fails at once, and its
        # run_end names the session and the row (never the row's text).
        you.use(conversation)
        return jsonify(run_id=run_id, conversation=conversation), 201

    @app.get("/runs")
    def show_conversation() -> Any:
        try:
            return jsonify(conversation_view(registry, browser()))
        except SessionCorrupt as exc:  # the page says so; "New conversation" starts afresh
            return jsonify(error=str(exc)), 500

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
            subagent = data.get("subagent")  # which run of the tree the call waits in ("" the run itself)
            if subagent is not None and not isinstance(subagent, str):
                return jsonify(error="'subagent' must be a string"), 400
            if data.get("approve") is True:
                arguments = data.get("arguments")
                if arguments is not None and not isinstance(arguments, dict):
                    return jsonify(error="'arguments' must be an object"), 400
                answered = registry.approve(
                    run_id, call_id, by="web", arguments=arguments, owner=owner, subagent=subagent
                )
            else:
                reason = str(data.get("reason") or "denied from the web")
                answered = registry.deny(run_id, call_id, reason, by="web", owner=owner, subagent=subagent)
        except KeyError:
            return jsonify(error="unknown run"), 404
        except ValueError as exc:  # edited arguments the schema refuses, or an id waiting twice; still pending
            return jsonify(error=str(exc)), 400
        return jsonify(answered=answered)

    @app.get("/runs/<run_id>")
    @by_id
    def status(run_id: str, owner: str) -> Any:
        info = registry.status(run_id, owner=owner).to_dict()
        info["leftovers"] = [m.text for m in registry.leftovers(run_id, owner=owner)]
        info["queued_after"], queued = registry.queued(run_id, owner=owner)
        info["queued"] = [m.text for m in queued]
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
