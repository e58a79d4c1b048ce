"""A Flask app that runs agents on worker threads and streams them to a browser.

The request that starts a run is not the one that steers it, stops it or
streams it, so every route talks to one ``RunRegistry`` by run id:

    POST /runs                 {"input": "...", "conversation": key?} -> 201 {"run_id", "conversation"}
    POST /runs/<id>/steer      {"text": "..."} -> {"accepted": bool}
    POST /runs/<id>/cancel     {"reason": "..."?} -> {"cancelled": bool}
    GET  /runs/<id>            -> the run's status and its undelivered guidance
    GET  /runs/<id>/events     -> server-sent events, one per observer event;
                                  resumes after the Last-Event-ID header
    GET  /                     -> a page with the live run, a guidance box, a Stop button

A conversation key maps to one ``BareLoop`` (``registry.loop_for``), so a
follow-up continues the history; a new run on a conversation whose run is
still going gets 409. The model is the embedded offline demo model, slowed
a little so the page visibly streams. Needs ``pip install -e '.[examples]'``.

    python examples/flask_app.py        # then open http://127.0.0.1:5000/
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional

try:
    import loopctl  # noqa: F401
except ImportError:  # run from a checkout without ``pip install -e .``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flask import Flask, Response, jsonify, request

from loopctl import BareLoop, LoopBusy
from loopctl.demo.model import OfflineModel
from loopctl.demo.tools import demo_tools
from loopctl.hosting.registry import RunRegistry

PAGE = Path(__file__).resolve().parent / "static" / "live.html"
KEEPALIVE_S = 15.0


def default_loop() -> BareLoop:
    """A loop on the offline demo model, slowed so streaming is visible."""
    return BareLoop(OfflineModel(delay=0.02), demo_tools(delay=0.5))


def sse_lines(registry: RunRegistry, run_id: str, after: int, keepalive: float = KEEPALIVE_S) -> Iterator[str]:
    """The run's events as SSE frames (``id`` = sequence number), until ``run_end``.

    While the run is quiet a comment line goes out every ``keepalive``
    seconds, so proxies keep the connection open.
    """
    last = after
    while True:
        ended = False
        for seq, event in registry.events(run_id, after=last, timeout=keepalive):
            last = seq
            ended = event["type"] == "run_end"
            yield f"id: {seq}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
        if ended:
            return
        if registry.status(run_id).state != "running":
            # Ended while we were between waits (or a resume after the end):
            # whatever is left comes at once, then the stream closes.
            for seq, event in registry.events(run_id, after=last, timeout=0):
                yield f"id: {seq}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
            return
        yield ": keep-alive\n\n"


def create_app(
    registry: Optional[RunRegistry] = None, loop_factory: Callable[[], BareLoop] = default_loop
) -> Flask:
    """The app; ``registry`` and ``loop_factory`` are injectable (tests use their own)."""
    registry = registry if registry is not None else RunRegistry()
    app = Flask(__name__)
    app.extensions["loopctl_registry"] = registry

    def body() -> dict[str, Any]:
        data = request.get_json(silent=True)
        return data if isinstance(data, dict) else {}

    @app.errorhandler(KeyError)
    def unknown_run(exc: KeyError) -> Any:
        return jsonify(error=f"unknown run: {exc.args[0] if exc.args else ''}"), 404

    @app.get("/")
    def page() -> Any:
        return Response(PAGE.read_text(encoding="utf-8"), mimetype="text/html")

    @app.post("/runs")
    def start_run() -> Any:
        data = body()
        text = data.get("input")
        if not isinstance(text, str) or not text.strip():
            return jsonify(error="'input' must be a non-empty string"), 400
        key = data.get("conversation") or uuid.uuid4().hex
        loop = registry.loop_for(str(key), loop_factory)
        try:
            run_id = registry.start(loop, text)
        except LoopBusy as exc:
            return jsonify(error=str(exc)), 409
        return jsonify(run_id=run_id, conversation=key), 201

    @app.post("/runs/<run_id>/steer")
    def steer(run_id: str) -> Any:
        text = body().get("text")
        if not isinstance(text, str) or not text.strip():
            return jsonify(error="'text' must be a non-empty string"), 400
        return jsonify(accepted=registry.steer(run_id, text))

    @app.post("/runs/<run_id>/cancel")
    def cancel(run_id: str) -> Any:
        reason = body().get("reason") or "cancelled from the web"
        return jsonify(cancelled=registry.cancel(run_id, str(reason)))

    @app.get("/runs/<run_id>")
    def status(run_id: str) -> Any:
        info = registry.status(run_id).to_dict()
        info["leftovers"] = [m.text for m in registry.leftovers(run_id)]
        return jsonify(info)

    @app.get("/runs/<run_id>/events")
    def events(run_id: str) -> Any:
        registry.status(run_id)  # 404 now, not inside the stream
        header = request.headers.get("Last-Event-ID") or request.args.get("after") or "0"
        after = int(header) if header.isdigit() else 0
        return Response(
            sse_lines(registry, run_id, after),
            mimetype="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return app


if __name__ == "__main__":
    create_app().run(threaded=True)
