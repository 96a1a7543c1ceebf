"""The ASGI app a replica serves: the service's own FastAPI app (``create_app``) behind a
thin wrapper that adds what only a cluster needs.

- It tells Ray Serve which image embeddings and which video sessions this replica holds:
  a request carrying the multiplexing header with an image id or a session id "loads"
  that id through ``@serve.multiplexed``, and so does the answer that creates a session
  (its ``x-sam2serve-session`` header), so Ray routes later requests with the same id
  here. A session lives in one replica's memory: this is what pins it there.
- It stamps every answer with the replica's id, its time in the replica and its cold
  start (see :mod:`sam2serve.cluster.protocol`).
- ``GET /metrics`` gets the replica's readiness metrics appended to the app's own;
  ``GET /cluster/replica`` describes the replica.

Everything else is the app's: paths, errors, limits, metrics.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sam2serve.cluster.protocol import (
    READY_S_HEADER,
    REPLICA_HEADER,
    REPLICA_MS_HEADER,
    REPLICA_PATH,
    SESSION_HEADER,
    is_image_id,
    is_session_id,
)
from sam2serve.cluster.readiness import ReadinessMetrics, ReplicaReport


class ReplicaIngress:
    """Wraps the service app; ``hold(image_id)`` registers an image with Ray's router."""

    def __init__(
        self,
        app: ASGIApp,
        report: ReplicaReport,
        metrics: ReadinessMetrics,
        hold: Callable[[str], Awaitable[Any]] | None = None,
        multiplexed_id: Callable[[], str] | None = None,
    ) -> None:
        self.app = app
        self.report = report
        self.metrics = metrics
        self.hold = hold
        self.multiplexed_id = multiplexed_id
        self._stamp = [
            (REPLICA_HEADER.encode(), report.replica.encode()),
            (READY_S_HEADER.encode(), f"{report.start_to_ready_s:.3f}".encode()),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan: the app starts and stops its worker
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        path = _local_path(scope)
        if self.hold is not None and self.multiplexed_id is not None:
            wanted = self.multiplexed_id()
            if wanted and (is_image_id(wanted) or is_session_id(wanted)):
                await self.hold(wanted)

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                await self._hold_new_session(message)
                elapsed_ms = (time.perf_counter() - started) * 1000
                headers = list(message.get("headers", []))
                headers += [
                    *self._stamp,
                    (REPLICA_MS_HEADER.encode(), f"{elapsed_ms:.3f}".encode()),
                ]
                message = {**message, "headers": headers}
            await send(message)

        if path == REPLICA_PATH and scope["method"] == "GET":
            await _send_json(stamped, self.report.as_dict())
        elif path == "/metrics" and scope["method"] == "GET":
            await self._metrics(scope, receive, stamped)
        else:
            await self.app(scope, receive, stamped)

    async def _hold_new_session(self, start: Message) -> None:
        """Register the session a response has just created, before the client hears of it."""
        if self.hold is None:
            return
        for key, value in start.get("headers", []):
            if key.lower() == SESSION_HEADER.encode():
                session_id = value.decode("latin-1")
                if is_session_id(session_id):
                    await self.hold(session_id)

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app's /metrics with the replica's readiness metrics appended."""
        start: Message | None = None
        body = bytearray()

        async def collect(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body":
                body.extend(message.get("body", b""))

        await self.app(scope, receive, collect)
        assert start is not None
        if start["status"] == 200:
            body.extend(self.metrics.render())
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": bytes(body)})


def _local_path(scope: Scope) -> str:
    """The request path below the application's route prefix."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :] or "/"
    return path


async def _send_json(send: Send, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
