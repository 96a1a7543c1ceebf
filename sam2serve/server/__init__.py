"""The HTTP service: ``create_app(settings, predictor=None)`` and its parts.

app.py (the app factory), routes/ (the endpoints, one router per concern),
dependencies.py (the app's shared resources as FastAPI dependencies), service.py (the request flow: caches, shared
encodes, model jobs), request_body.py (JSON or multipart bodies), request_guard.py
(disconnects and timeouts after the body), uploads.py (base64 and image decoding with
their limits), video_uploads.py (a video session's upload), live_protocol.py (the live
frames' WebSocket protocol), video_answers.py (what the video routes answer),
prompts.py (prompt checks and decoding), auth.py (the API key),
body_limit.py (the body's size and time limits), http_server.py (uvicorn: header timeout,
connection cap), memory.py (returning freed memory), api_docs.py (offline /docs),
schemas.py (the API contract), settings.py (model and limits, handed on group by
group), cache.py (embedding and mask caches), batching.py (the model worker), metrics.py
(Prometheus), errors.py (one error shape), loadtest.py (the load generator). The ``serve`` and ``loadtest`` commands
are in :mod:`sam2serve.commands`.

``create_app`` and ``ServerSettings`` are importable from here; FastAPI is only imported
when ``create_app`` is first used, so the CLI can register its commands cheaply.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ServerSettings", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from sam2serve.server.app import create_app

        return create_app
    if name == "ServerSettings":
        from sam2serve.server.settings import ServerSettings

        return ServerSettings
    raise AttributeError(f"module 'sam2serve.server' has no attribute {name!r}")
