"""The Flask example's pattern in Django: runs on worker threads, driven by id.

One file: settings, views and URLs. Every view talks to one module-level
``RunRegistry``; a conversation key maps to one ``BareLoop`` so follow-ups
continue its history. What the server keeps per browser session (its owner
id, its current conversation, the runs started in it) lives in one small
class, ``BrowserSession``, over ``request.session``.

    POST /runs                 {"input": "...", "conversation": key?} -> 201 {"run_id", "conversation"}
    GET  /runs                 -> {"conversation", "runs"}: this session's current conversation
                                  and the status of each of its runs the registry still keeps
    POST /conversations        -> 201 {"conversation"}: start a new conversation
    POST /runs/<id>/steer      {"text": "..."} -> {"accepted": bool}
    POST /runs/<id>/cancel     {"reason": "..."?} -> {"cancelled": bool}
    POST /runs/<id>/approvals/<call_id>
                               {"approve": bool, "reason": "..."?, "arguments": {...}?}
                               -> {"answered": bool}; 400 for arguments the tool refuses
    GET  /runs/<id>            -> status and undelivered guidance
    GET  /runs/<id>/events     -> server-sent events (resumes after Last-Event-ID)
    GET  /                     -> the live page (examples/static/live.html)

Django's normal protections are on, so the views drop into a real project
unchanged (never reach for ``@csrf_exempt``):

- ``SessionMiddleware`` (signed-cookie sessions here, so no database) keeps
  a random owner id per browser session. Set ``DJANGO_SECRET_KEY``; without
  it each process makes a random key, so sessions end on restart.
- ``CsrfViewMiddleware``: the page reads the token from the DOM (the hidden
  input ``{% csrf_token %}`` would render) and sends it in ``X-CSRFToken``
  with every POST, as Django documents. A POST without it gets 403.
- Runs are owned: a run belongs to the session that started it (the
  registry's ``owner=``). Another session asking for it by id, for status,
  events, guidance or cancel, gets the same 404 as an unknown id: a run id
  is a name, not an authorisation. Conversations are per owner too.

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

from loopctl import BareLoop, LoopBusy
from loopctl.demo import OfflineModel, demo_tools
from loopctl.hosting.registry import RunRegistry

PAGE = Path(__file__).resolve().parent / "static" / "live.html"
KEEPALIVE_S = 15.0


def default_loop() -> BareLoop:
    """A loop on the offline demo model, slowed so streaming is visible; ``multiply`` needs approval."""
    loop = BareLoop(OfflineModel(delay=0.02), demo_tools(delay=0.5))
    return loop.with_approval(lambda ctx: ctx.tool == "multiply")


#: The process's runs. Tests swap these two for their own.
REGISTRY = RunRegistry()
LOOP_FACTORY: Callable[[], BareLoop] = default_loop


def _body(request: HttpRequest) -> dict[str, Any]:
    try:
        data = json.loads(request.body or b"{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


class BrowserSession:
    """What the server keeps for one browser session, over a session mapping.

    The owner id (random, made on first use), the current conversation key
    and the runs started in each conversation (the newest ``RUNS_KEPT``);
    Django keeps the CSRF token itself. It is the one place that reads or
    writes per-session state: to keep conversations in a store instead of
    the signed cookie, change this class. Lists are replaced, never mutated in place, so the
    framework sees every change.
    """

    RUNS_KEPT = 20  # the signed-cookie session stays well under 4 KB

    def __init__(self, data: MutableMapping[str, Any]) -> None:
        self._data = data

    def secret(self, name: str) -> str:
        """The session's random value ``name`` (made on first use)."""
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
    """The current conversation and its runs' status, owner-checked (pruned runs left out)."""
    you = BrowserSession(request.session)
    owner, found = you.owner, []
    for run_id in you.run_ids():
        try:
            info = REGISTRY.status(run_id, owner=owner).to_dict()
            info["leftovers"] = [m.text for m in REGISTRY.leftovers(run_id, owner=owner)]
        except KeyError:
            continue
        found.append(info)
    return JsonResponse({"conversation": you.conversation, "runs": found})


@require_POST
def new_conversation(request: HttpRequest) -> HttpResponse:
    """Make a fresh conversation this session's current one."""
    return JsonResponse({"conversation": BrowserSession(request.session).new_conversation()}, status=201)


@require_POST
def start_run(request: HttpRequest) -> HttpResponse:
    """Start a run on the conversation's loop, owned by this session; 409 while that loop is busy."""
    data = _body(request)
    text = data.get("input")
    if not isinstance(text, str) or not text.strip():
        return JsonResponse({"error": "'input' must be a non-empty string"}, status=400)
    you = BrowserSession(request.session)
    owner = you.owner
    key = str(data.get("conversation") or uuid.uuid4().hex)
    # Conversations are per owner: another session naming the same key gets
    # a loop of its own, never this one's history.
    loop = REGISTRY.loop_for((owner, key), LOOP_FACTORY)
    try:
        run_id = REGISTRY.start(loop, text, owner=owner)
    except LoopBusy as exc:
        return JsonResponse({"error": str(exc)}, status=409)
    you.started(run_id, key)
    return JsonResponse({"run_id": run_id, "conversation": key}, status=201)


@require_POST
@_by_id
def steer(request: HttpRequest, run_id: str, owner: str) -> HttpResponse:
    """Guidance for the run: accepted (delivered or a leftover) or refused."""
    text = _body(request).get("text")
    if not isinstance(text, str) or not text.strip():
        REGISTRY.status(run_id, owner=owner)  # an unknown run is a 404 first
        return JsonResponse({"error": "'text' must be a non-empty string"}, status=400)
    return JsonResponse({"accepted": REGISTRY.steer(run_id, text, owner=owner)})


@require_POST
@_by_id
def cancel(request: HttpRequest, run_id: str, owner: str) -> HttpResponse:
    """Stop the run; False once it has ended."""
    reason = str(_body(request).get("reason") or "cancelled from the web")
    return JsonResponse({"cancelled": REGISTRY.cancel(run_id, reason, owner=owner)})


@require_POST
def answer(request: HttpRequest, run_id: str, call_id: str) -> HttpResponse:
    """A person's answer to a call the run waits on (from any page of the session); first answer wins."""
    data = _body(request)
    owner = _owner(request)
    try:
        if data.get("approve") is True:
            arguments = data.get("arguments")
            if arguments is not None and not isinstance(arguments, dict):
                return JsonResponse({"error": "'arguments' must be an object"}, status=400)
            answered = REGISTRY.approve(run_id, call_id, by="web", arguments=arguments, owner=owner)
        else:
            reason = str(data.get("reason") or "denied from the web")
            answered = REGISTRY.deny(run_id, call_id, reason, by="web", owner=owner)
    except KeyError:
        return JsonResponse({"error": "unknown run"}, status=404)
    except ValueError as exc:  # edited arguments the tool's schema refuses; still pending
        return JsonResponse({"error": str(exc)}, status=400)
    return JsonResponse({"answered": answered})


@require_safe
@_by_id
def status(request: HttpRequest, run_id: str, owner: str) -> HttpResponse:
    """The run's status and its undelivered guidance."""
    info = REGISTRY.status(run_id, owner=owner).to_dict()
    info["leftovers"] = [m.text for m in REGISTRY.leftovers(run_id, owner=owner)]
    return JsonResponse(info)


def _frames(run_id: str, owner: Hashable, after: int) -> Iterator[str]:
    last = after
    while True:
        ended = False
        for seq, event in REGISTRY.events(run_id, after=last, timeout=KEEPALIVE_S, owner=owner):
            last = seq
            ended = event["type"] == "run_end"
            yield f"id: {seq}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
        if ended:
            return
        if REGISTRY.status(run_id, owner=owner).state != "running":
            for seq, event in REGISTRY.events(run_id, after=last, timeout=0, owner=owner):
                yield f"id: {seq}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
            return
        yield ": keep-alive\n\n"


@require_safe
@_by_id
def events(request: HttpRequest, run_id: str, owner: str) -> HttpResponse:
    """Server-sent events until ``run_end``; resumes after ``Last-Event-ID``."""
    REGISTRY.status(run_id, owner=owner)  # 404 now, not inside the stream
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
