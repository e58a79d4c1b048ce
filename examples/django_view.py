"""The Flask example's pattern in Django: runs on worker threads, driven by id.

One file: settings, views and URLs. Every view talks to one module-level
``RunRegistry`` that keeps conversations in a SQLite session store; a
conversation id maps to one stored session, so follow-ups continue its
history, a reload shows it and a restarted server continues it. What the
server keeps per browser session (its owner id and its current
conversation's id, nothing else) lives in one small class,
``BrowserSession``, over ``request.session``.

    POST /runs                 {"input": "...", "conversation": id?} -> 201 {"run_id", "conversation"};
                               404 for a conversation of another session, 409 while one of
                               its runs is in flight
    GET  /runs                 -> {"conversation", "messages", "running"}: the current conversation
                                  as stored (completed runs only) and its run in flight, if any
    POST /conversations        -> 201 {"conversation"}: start a new conversation
    POST /runs/<id>/steer      {"text": "..."} -> {"accepted": bool}
    POST /runs/<id>/cancel     {"reason": "..."?} -> {"cancelled": bool}
    POST /runs/<id>/approvals/<call_id>
                               {"approve": bool, "reason": "..."?, "arguments": {...}?}
                               -> {"answered": bool}; 400 for arguments the tool refuses
    GET  /runs/<id>            -> status and undelivered guidance: "queued" (to be delivered,
                                  after event "queued_after") and "leftovers" (never)
    GET  /runs/<id>/events     -> server-sent events (resumes after Last-Event-ID)
    GET  /                     -> the live page (examples/static/live.html)

The store is the file named by ``LOOPCTL_SESSION_DB``, else
``web-sessions.db`` in the user's data folder (``~/.local/share/loopctl``
on Linux, as the loopctl command uses), opened at the first request.

Django's normal protections are on, so the views drop into a real project
unchanged (never reach for ``@csrf_exempt``):

- ``SessionMiddleware`` (signed-cookie sessions here, so no database for
  them) keeps a random owner id and the current conversation's id per
  browser session. Set ``DJANGO_SECRET_KEY``; without it each process makes
  a random key, so browser sessions end on restart (their stored
  conversations stay, unreachable).
- ``CsrfViewMiddleware``: the page reads the token from the DOM (the hidden
  input ``{% csrf_token %}`` would render) and sends it in ``X-CSRFToken``
  with every POST, as Django documents. A POST without it gets 403. Two
  tabs opened at once on a first visit each get a CSRF cookie, and the
  browser keeps one: the page answers a refused POST by taking the token of
  a fresh copy of itself and sending it once more.
- Runs are owned: a run belongs to the session that started it (the
  registry's ``owner=``). Another session asking for it by id, for status,
  events, guidance or cancel, gets the same 404 as an unknown id: a run id
  is a name, not an authorisation. Conversations are owned the same way in
  the store: another session's conversation id is an unknown id.

Run it with Django's threaded development server (``pip install -e '.[examples]'``):

    python examples/django_view.py runserver    # then open http://127.0.0.1:8000/

In a real project, put the views in an app, the registry in a module that
is imported once per process, and serve under a threaded WSGI server
(gunicorn ``--threads``); the SSE view holds one thread per open stream.
"""

from __future__ import annotations

import functools
import html
import json
import os
import re
import secrets
import sys
import threading
import uuid
from collections.abc import Hashable, Iterator, MutableMapping
from pathlib import Path
from typing import Any, Callable, Optional

try:
    import loopctl  # noqa: F401
except ImportError:  # run from a checkout without ``pip install -e .``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import django
from django.conf import settings

if not settings.configured:
    settings.configure(
        DEBUG=False,
        # Signs the session cookie: a known key would let anyone forge an
        # owner id, so there is no default one.
        SECRET_KEY=os.environ.get("DJANGO_SECRET_KEY") or secrets.token_hex(32),
        ROOT_URLCONF=__name__,
        # Settings made here rather than read from a module: name this file,
        # so runserver's banner says where they are (it would say None).
        SETTINGS_MODULE=Path(__file__).stem if __name__ == "__main__" else __name__,
        ALLOWED_HOSTS=["127.0.0.1", "localhost", "testserver"],
        MIDDLEWARE=[
            "django.middleware.security.SecurityMiddleware",
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.middleware.clickjacking.XFrameOptionsMiddleware",
        ],
        INSTALLED_APPS=[],
        SESSION_ENGINE="django.contrib.sessions.backends.signed_cookies",
        CSRF_COOKIE_HTTPONLY=True,  # the page reads the token from the DOM
        CSRF_FAILURE_VIEW=f"{__name__}.csrf_failure",
    )
    django.setup()

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.middleware.csrf import get_token
from django.urls import path
from django.views.decorators.http import require_POST, require_safe

from loopctl import BareLoop, LoopBusy, SessionCorrupt
from loopctl.demo import OfflineModel, demo_tools
from loopctl.demo.chat_sessions import data_dir
from loopctl.hosting.registry import RunRegistry
from loopctl.messages import Message
from loopctl.sessions import SQLiteSessionStore

PAGE = Path(__file__).resolve().parent / "static" / "live.html"
KEEPALIVE_S = 15.0
DB_NAME = "web-sessions.db"


def default_loop() -> BareLoop:
    """A loop on the offline demo model, slowed so streaming is visible; ``multiply`` needs approval."""
    loop = BareLoop(OfflineModel(delay=0.02), demo_tools(delay=0.5))
    return loop.with_approval(lambda ctx: ctx.tool == "multiply")


def open_store() -> SQLiteSessionStore:
    """The SQLite store: ``$LOOPCTL_SESSION_DB``, else ``web-sessions.db`` in the user's data folder."""
    configured = os.environ.get("LOOPCTL_SESSION_DB")
    if configured:
        return SQLiteSessionStore(Path(configured).expanduser())
    folder = data_dir(os.environ)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return SQLiteSessionStore(folder / DB_NAME)


#: The process's runs, made at the first request (``registry()``), so
#: importing this module opens no file. Tests swap these two for their own.
REGISTRY: Optional[RunRegistry] = None
LOOP_FACTORY: Callable[[], BareLoop] = default_loop
_MAKING = threading.Lock()


def registry() -> RunRegistry:
    """The process's registry, with its session store (made once, on first use)."""
    global REGISTRY
    with _MAKING:
        if REGISTRY is None:
            REGISTRY = RunRegistry(session_store=open_store())
        return REGISTRY


def _body(request: HttpRequest) -> dict[str, Any]:
    try:
        data = json.loads(request.body or b"{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


class BrowserSession:
    """What the server keeps for one browser session: an owner id and the current conversation.

    The session holds these two values and nothing else (Django keeps the
    CSRF token itself); each conversation (its completed runs' messages) is
    in the session store, owned by the owner id. So the cookie never grows,
    two tabs of one browser never overwrite each other's runs, and a
    restarted server finds every conversation again. It is the one place
    that reads or writes per-session state.
    """

    def __init__(self, data: MutableMapping[str, Any]) -> None:
        self._data = data

    @property
    def owner(self) -> str:
        """Who the session's runs and conversations belong to (random, made on first use)."""
        value = self._data.get("owner")
        if not isinstance(value, str):
            value = self._data["owner"] = secrets.token_urlsafe(32)
        return value

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
        return registry().session_store.session(conversation, owner=self.owner)


CONVERSATION_ID = re.compile(r"[0-9a-f]{32}")  # what new_conversation makes


def _shown(message: Message) -> dict[str, Any]:
    """A stored message as the page renders it (the model's private reasoning left out)."""
    data = message.to_dict()
    data["parts"] = [p for p in data["parts"] if p["type"] != "thinking"]
    return data


def _owner(request: HttpRequest) -> str:
    return BrowserSession(request.session).owner


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """Django's CSRF refusal, as JSON like every other error of these views."""
    return JsonResponse({"error": "CSRF token missing or incorrect"}, status=403)


def _by_id(view: Callable[[HttpRequest, str, str], HttpResponse]) -> Callable[..., HttpResponse]:
    """Call ``view(request, run_id, owner)``; unknown and foreign runs get one and the same 404."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, run_id: str) -> HttpResponse:
        try:
            return view(request, run_id, _owner(request))
        except KeyError:
            return JsonResponse({"error": "unknown run"}, status=404)

    return wrapped


@require_safe
def page(request: HttpRequest) -> HttpResponse:
    """The live page, with this session's CSRF token in it."""
    token = html.escape(get_token(request), quote=True)
    text = PAGE.read_text(encoding="utf-8").replace("__CSRF_TOKEN__", token)
    response = HttpResponse(text, content_type="text/html")
    response["Cache-Control"] = "no-store"
    return response


def runs(request: HttpRequest) -> HttpResponse:
    """``/runs``: GET lists this session's conversation, POST starts a run."""
    if request.method == "POST":
        return start_run(request)
    return list_runs(request)


@require_safe
def list_runs(request: HttpRequest) -> HttpResponse:
    """The current conversation as stored (what the model sees next), and its run in flight.

    Cancelled and failed runs are not stored; the run in flight is not
    written yet, the page follows it from its events.
    """
    you = BrowserSession(request.session)
    key, owner, runs_ = you.conversation, you.owner, registry()
    empty: dict[str, Any] = {"conversation": None, "messages": [], "running": None}
    if key is None:
        return JsonResponse(empty)
    # A run that ends between the two lookups has written its messages by
    # then: the read is taken again, so the page neither misses it nor draws
    # it twice. (In the instant between a run's write and its run_end event a
    # reload can still draw it twice, stored and followed; the next one is right.)
    for _ in range(3):
        running = runs_.run_on_session(key, owner=owner)
        try:
            messages = you.stored(key).messages()
        except KeyError:  # not this owner's: nothing to show
            return JsonResponse(empty)
        except SessionCorrupt as exc:  # the page says so; "New conversation" starts afresh
            return JsonResponse({"error": str(exc)}, status=500)
        if runs_.run_on_session(key, owner=owner) == running:
            break
    return JsonResponse({"conversation": key, "messages": [_shown(m) for m in messages], "running": running})


@require_POST
def new_conversation(request: HttpRequest) -> HttpResponse:
    """Make a fresh conversation this session's current one."""
    return JsonResponse({"conversation": BrowserSession(request.session).new_conversation()}, status=201)


@require_POST
def start_run(request: HttpRequest) -> HttpResponse:
    """Start a run on the conversation, owned by this session; 404 for another's, 409 while one runs."""
    data = _body(request)
    text = data.get("input")
    if not isinstance(text, str) or not text.strip():
        return JsonResponse({"error": "'input' must be a non-empty string"}, status=400)
    you = BrowserSession(request.session)
    asked = data.get("conversation")
    if asked is not None and not (isinstance(asked, str) and CONVERSATION_ID.fullmatch(asked)):
        return JsonResponse({"error": "'conversation' must be an id this server gave"}, status=400)
    conversation = asked or you.conversation or you.new_conversation()
    owner, runs_ = you.owner, registry()
    loop = runs_.loop_for((owner, conversation), LOOP_FACTORY)
    try:
        run_id = runs_.start(loop, text, owner=owner, session_id=conversation)
    except KeyError:  # another session's conversation: to this one, an unknown id
        return JsonResponse({"error": "unknown conversation"}, status=404)
    except LoopBusy as exc:  # SessionBusy too: a run on it is in flight, here or elsewhere
        return JsonResponse({"error": str(exc)}, status=409)
    # A corrupt conversation is no refusal: the run fails at once, and its
    # run_end names the session and the row (never the row's text).
    you.use(conversation)
    return JsonResponse({"run_id": run_id, "conversation": conversation}, status=201)


@require_POST
@_by_id
def steer(request: HttpRequest, run_id: str, owner: str) -> HttpResponse:
    """Guidance for the run: accepted (delivered or a leftover) or refused."""
    text = _body(request).get("text")
    if not isinstance(text, str) or not text.strip():
        registry().status(run_id, owner=owner)  # an unknown run is a 404 first
        return JsonResponse({"error": "'text' must be a non-empty string"}, status=400)
    return JsonResponse({"accepted": registry().steer(run_id, text, owner=owner)})


@require_POST
@_by_id
def cancel(request: HttpRequest, run_id: str, owner: str) -> HttpResponse:
    """Stop the run; False once it has ended."""
    reason = str(_body(request).get("reason") or "cancelled from the web")
    return JsonResponse({"cancelled": registry().cancel(run_id, reason, owner=owner)})


@require_POST
def answer(request: HttpRequest, run_id: str, call_id: str) -> HttpResponse:
    """A person's answer to a call the run waits on (from any page of the session); first answer wins."""
    data = _body(request)
    owner = _owner(request)
    try:
        subagent = data.get("subagent")  # which run of the tree the call waits in ("" the run itself)
        if subagent is not None and not isinstance(subagent, str):
            return JsonResponse({"error": "'subagent' must be a string"}, status=400)
        if data.get("approve") is True:
            arguments = data.get("arguments")
            if arguments is not None and not isinstance(arguments, dict):
                return JsonResponse({"error": "'arguments' must be an object"}, status=400)
            answered = registry().approve(
                run_id, call_id, by="web", arguments=arguments, owner=owner, subagent=subagent
            )
        else:
            reason = str(data.get("reason") or "denied from the web")
            answered = registry().deny(run_id, call_id, reason, by="web", owner=owner, subagent=subagent)
    except KeyError:
        return JsonResponse({"error": "unknown run"}, status=404)
    except ValueError as exc:  # edited arguments the schema refuses, or an id waiting twice; still pending
        return JsonResponse({"error": str(exc)}, status=400)
    return JsonResponse({"answered": answered})


@require_safe
@_by_id
def status(request: HttpRequest, run_id: str, owner: str) -> HttpResponse:
    """The run's status and its undelivered guidance."""
    info = registry().status(run_id, owner=owner).to_dict()
    info["leftovers"] = [m.text for m in registry().leftovers(run_id, owner=owner)]
    info["queued_after"], queued = registry().queued(run_id, owner=owner)
    info["queued"] = [m.text for m in queued]
    return JsonResponse(info)


def _frames(run_id: str, owner: Hashable, after: int) -> Iterator[str]:
    last = after
    while True:
        ended = False
        for seq, event in registry().events(run_id, after=last, timeout=KEEPALIVE_S, owner=owner):
            last = seq
            ended = event["type"] == "run_end"
            yield f"id: {seq}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
        if ended:
            return
        if registry().status(run_id, owner=owner).state != "running":
            for seq, event in registry().events(run_id, after=last, timeout=0, owner=owner):
                yield f"id: {seq}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
            return
        yield ": keep-alive\n\n"


@require_safe
@_by_id
def events(request: HttpRequest, run_id: str, owner: str) -> HttpResponse:
    """Server-sent events until ``run_end``; resumes after ``Last-Event-ID``."""
    registry().status(run_id, owner=owner)  # 404 now, not inside the stream
    header = request.headers.get("Last-Event-ID") or request.GET.get("after") or "0"
    after = int(header) if header.isdigit() else 0
    response = StreamingHttpResponse(_frames(run_id, owner, after), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


urlpatterns = [
    path("", page),
    path("runs", runs),
    path("conversations", new_conversation),
    path("runs/<str:run_id>", status),
    path("runs/<str:run_id>/steer", steer),
    path("runs/<str:run_id>/cancel", cancel),
    path("runs/<str:run_id>/events", events),
    path("runs/<str:run_id>/approvals/<str:call_id>", answer),
]


if __name__ == "__main__":
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
