"""The Flask example's pattern in Django: runs on worker threads, driven by id.

One file: settings, views and URLs. Every view talks to one module-level
``RunRegistry``; a conversation key maps to one ``BareLoop`` so follow-ups
continue its history.

    POST /runs                 {"input": "...", "conversation": key?} -> 201 {"run_id", "conversation"}
    POST /runs/<id>/steer      {"text": "..."} -> {"accepted": bool}
    POST /runs/<id>/cancel     {"reason": "..."?} -> {"cancelled": bool}
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
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import Any, Callable

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
    """A loop on the offline demo model, slowed so streaming is visible."""
    return BareLoop(OfflineModel(delay=0.02), demo_tools(delay=0.5))


#: The process's runs. Tests swap these two for their own.
REGISTRY = RunRegistry()
LOOP_FACTORY: Callable[[], BareLoop] = default_loop


def _body(request: HttpRequest) -> dict[str, Any]:
    try:
        data = json.loads(request.body or b"{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _owner(request: HttpRequest) -> str:
    """The session's owner id (a random value, made on first use)."""
    owner = request.session.get("owner")
    if not isinstance(owner, str):
        owner = request.session["owner"] = secrets.token_urlsafe(32)
    return owner


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


@require_POST
def start_run(request: HttpRequest) -> HttpResponse:
    """Start a run on the conversation's loop, owned by this session; 409 while that loop is busy."""
    data = _body(request)
    text = data.get("input")
    if not isinstance(text, str) or not text.strip():
        return JsonResponse({"error": "'input' must be a non-empty string"}, status=400)
    owner = _owner(request)
    key = str(data.get("conversation") or uuid.uuid4().hex)
    # Conversations are per owner: another session naming the same key gets
    # a loop of its own, never this one's history.
    loop = REGISTRY.loop_for((owner, key), LOOP_FACTORY)
    try:
        run_id = REGISTRY.start(loop, text, owner=owner)
    except LoopBusy as exc:
        return JsonResponse({"error": str(exc)}, status=409)
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
    path("runs", start_run),
    path("runs/<str:run_id>", status),
    path("runs/<str:run_id>/steer", steer),
    path("runs/<str:run_id>/cancel", cancel),
    path("runs/<str:run_id>/events", events),
]


if __name__ == "__main__":
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
