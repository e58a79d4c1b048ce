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

Run it with Django's threaded development server (``pip install -e '.[examples]'``):

    python examples/django_view.py runserver    # then open http://127.0.0.1:8000/

In a real project, put the views in an app, the registry in a module that
is imported once per process, and serve under a threaded WSGI server
(gunicorn ``--threads``); the SSE view holds one thread per open stream.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
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
        SECRET_KEY="example-only-not-a-secret",
        ROOT_URLCONF=__name__,
        ALLOWED_HOSTS=["127.0.0.1", "localhost", "testserver"],
        MIDDLEWARE=[],
        INSTALLED_APPS=[],
    )
    django.setup()

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.urls import path
from django.views.decorators.http import require_GET, require_POST

from loopctl import BareLoop, LoopBusy
from loopctl.demo.model import OfflineModel
from loopctl.demo.tools import demo_tools
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


def _by_id(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    def wrapped(request: HttpRequest, run_id: str) -> HttpResponse:
        try:
            return view(request, run_id)
        except KeyError:
            return JsonResponse({"error": f"unknown run: {run_id}"}, status=404)

    wrapped.__name__ = view.__name__
    return wrapped


@require_GET
def page(request: HttpRequest) -> HttpResponse:
    """The live page."""
    return HttpResponse(PAGE.read_text(encoding="utf-8"), content_type="text/html")


@require_POST
def start_run(request: HttpRequest) -> HttpResponse:
    """Start a run on the conversation's loop; 409 while that loop is busy."""
    data = _body(request)
    text = data.get("input")
    if not isinstance(text, str) or not text.strip():
        return JsonResponse({"error": "'input' must be a non-empty string"}, status=400)
    key = str(data.get("conversation") or uuid.uuid4().hex)
    loop = REGISTRY.loop_for(key, LOOP_FACTORY)
    try:
        run_id = REGISTRY.start(loop, text)
    except LoopBusy as exc:
        return JsonResponse({"error": str(exc)}, status=409)
    return JsonResponse({"run_id": run_id, "conversation": key}, status=201)


@require_POST
@_by_id
def steer(request: HttpRequest, run_id: str) -> HttpResponse:
    """Guidance for the run: accepted (delivered or a leftover) or refused."""
    text = _body(request).get("text")
    if not isinstance(text, str) or not text.strip():
        return JsonResponse({"error": "'text' must be a non-empty string"}, status=400)
    return JsonResponse({"accepted": REGISTRY.steer(run_id, text)})


@require_POST
@_by_id
def cancel(request: HttpRequest, run_id: str) -> HttpResponse:
    """Stop the run; False once it has ended."""
    reason = str(_body(request).get("reason") or "cancelled from the web")
    return JsonResponse({"cancelled": REGISTRY.cancel(run_id, reason)})


@require_GET
@_by_id
def status(request: HttpRequest, run_id: str) -> HttpResponse:
    """The run's status and its undelivered guidance."""
    info = REGISTRY.status(run_id).to_dict()
    info["leftovers"] = [m.text for m in REGISTRY.leftovers(run_id)]
    return JsonResponse(info)


def _frames(run_id: str, after: int) -> Iterator[str]:
    last = after
    while True:
        ended = False
        for seq, event in REGISTRY.events(run_id, after=last, timeout=KEEPALIVE_S):
            last = seq
            ended = event["type"] == "run_end"
            yield f"id: {seq}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
        if ended:
            return
        if REGISTRY.status(run_id).state != "running":
            for seq, event in REGISTRY.events(run_id, after=last, timeout=0):
                yield f"id: {seq}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
            return
        yield ": keep-alive\n\n"


@require_GET
@_by_id
def events(request: HttpRequest, run_id: str) -> HttpResponse:
    """Server-sent events until ``run_end``; resumes after ``Last-Event-ID``."""
    REGISTRY.status(run_id)  # 404 now, not inside the stream
    header = request.headers.get("Last-Event-ID") or request.GET.get("after") or "0"
    after = int(header) if header.isdigit() else 0
    response = StreamingHttpResponse(_frames(run_id, after), content_type="text/event-stream")
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
