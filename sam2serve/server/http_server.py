"""The HTTP server around the app: uvicorn, with the connection limits of the settings.

uvicorn times out idle keep-alive connections but not a request whose headers trickle in
(one byte a second holds a connection forever: "slowloris"). :class:`HeaderTimeoutH11`
closes a connection whose request line and headers have not arrived whole within
``header_timeout_s`` of the connection opening (or of the previous response on a kept-
alive connection). The body's own deadline is the app's (``body_timeout_s``, 408), and
``max_connections`` caps open connections (uvicorn answers 503 past it).

The pure-Python h11 protocol is used on purpose: its state machine says exactly when a
request's headers are complete, and parsing is never the bottleneck next to the model.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from sam2serve.server.allowed_hosts import AllowedHosts, HostGuard
from sam2serve.server.settings import ServerSettings

log = logging.getLogger("sam2serve.server")


class HeaderTimeoutH11(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's line and headers."""

    header_timeout_s: float = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the request's headers are complete
            self._disarm_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_header_timer()  # the next request on this connection

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm_header_timer(self) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            log.info("closing a connection whose headers took over %g s", self.header_timeout_s)
            self.transport.close()


_WS_FRAMING_SLACK = 1024


def uvicorn_config(
    app: Any, settings: ServerSettings, host: str, port: int, **options: Any
) -> uvicorn.Config:
    """The uvicorn config that serves ``app`` on ``host`` with ``settings``' connection
    limits, answering only to the hosts it may be reached by (``allowed_hosts``)."""
    app = HostGuard(app, AllowedHosts.for_server(host, settings.access.allowed_hosts))
    protocol = type(
        "HeaderTimeoutH11",
        (HeaderTimeoutH11,),
        {"header_timeout_s": settings.connections.header_timeout_s},
    )
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol,
        limit_concurrency=settings.connections.max_connections,
        timeout_keep_alive=5,
        # Live video connections: a message past the frame limit closes the connection
        # (1009) before it is buffered; at most two messages wait unread.
        ws_max_size=settings.live.max_live_frame_bytes + _WS_FRAMING_SLACK,
        ws_max_queue=2,
        **options,
    )
