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
import ipaddress
import logging
import socket
from typing import Any, cast

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from sam2serve.server.allowed_hosts import AllowedHosts, HostGuard
from sam2serve.server.settings import ServerSettings

log = logging.getLogger("sam2serve.server")

# A wildcard address listens on every interface, but no client can connect *to* it: the
# log names the loopback address of its family, localhost, and this machine by the name or
# address the Host check (allowed_hosts) lets through.
WILDCARD_HOSTS = {"0.0.0.0": "127.0.0.1", "::": "::1"}
# Documentation addresses (RFC 5737, RFC 3849): connecting a UDP socket to one sends
# nothing, and tells which local address the default route would use.
_ROUTE_PROBES = {socket.AF_INET: "192.0.2.1", socket.AF_INET6: "2001:db8::1"}


def url_of(host: str, port: int) -> str:
    """``http://host:port``, an IPv6 literal in brackets."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def urls_to_open(host: str, port: int, allowed_hosts: tuple[str, ...] | None = None) -> list[str]:
    """The URLs a user can open to reach a server listening on ``host``: ``host`` itself,
    or for a wildcard (0.0.0.0, ::) loopback, localhost, and this machine's name where
    ``allowed_hosts`` lets it through the Host check, else its address on the default
    route (any address is let through)."""
    loopback = WILDCARD_HOSTS.get(host)
    if loopback is None:
        return [url_of(host, port)]
    names = [loopback, "localhost"]
    machine = socket.gethostname()
    if machine and AllowedHosts.for_server(host, allowed_hosts).allows(machine):
        names.append(machine)
    else:
        families = [socket.AF_INET6, socket.AF_INET] if ":" in host else [socket.AF_INET]
        names += [address for family in families if (address := _route_address(family))][:1]
    return list(dict.fromkeys(url_of(name, port) for name in names))


def where_to_connect(host: str, port: int, allowed_hosts: tuple[str, ...] | None = None) -> str:
    """Where the log says a server on ``host``:``port`` is: its URL, or for a wildcard the
    URLs to open, that it listens on all interfaces, and how to allow the machine's name
    when the Host check would refuse it."""
    urls = urls_to_open(host, port, allowed_hosts)
    if host not in WILDCARD_HOSTS:
        return urls[0]
    note = f"listening on all interfaces, {host}"
    machine = socket.gethostname()
    if machine and url_of(machine, port) not in urls:
        note += f"; to open it by this machine's name add --allowed-hosts {machine}"
    return f"{', '.join(urls)} ({note})"


class _NoWildcardStartLine(logging.Filter):
    """Drops uvicorn's "Uvicorn running on http://0.0.0.0:PORT" line: an address no client
    can open (the command's own line names the ones to open instead)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        started = isinstance(record.msg, str) and record.msg.startswith("Uvicorn running on ")
        return not (started and len(args) == 3 and args[1] in WILDCARD_HOSTS)


def _hide_wildcard_start_line() -> None:
    """Once per process, on uvicorn's logger (after uvicorn.Config has configured it)."""
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _NoWildcardStartLine) for f in logger.filters):
        logger.addFilter(_NoWildcardStartLine())


def _route_address(family: socket.AddressFamily) -> str | None:
    """This machine's address on the default route of ``family`` (None: no such route, or
    only loopback)."""
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((_ROUTE_PROBES[family], 9))
            address = str(probe.getsockname()[0])
    except OSError:
        return None
    return None if ipaddress.ip_address(address).is_loopback else address


class HeaderTimeoutH11(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's line and headers."""

    header_timeout_s: float = 10.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvicorn's h11 protocol narrows asyncio's BaseTransport to a Transport.
        super().connection_made(cast(asyncio.Transport, transport))
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
    limits, answering only to the hosts it may be reached by (``allowed_hosts``); uvicorn's
    start line is left out for a wildcard ``host`` (:func:`where_to_connect` says where)."""
    app = HostGuard(app, AllowedHosts.for_server(host, settings.access.allowed_hosts))
    protocol = type(
        "HeaderTimeoutH11",
        (HeaderTimeoutH11,),
        {"header_timeout_s": settings.connections.header_timeout_s},
    )
    config = uvicorn.Config(
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
    _hide_wildcard_start_line()
    return config
