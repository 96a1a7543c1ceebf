"""The hosts the server answers to (its Host header), and the origins a WebSocket may
come from: what stops a DNS-rebinding page.

A page on ``http://evil.example:8000`` whose name the attacker re-points at 127.0.0.1
reaches a loopback server from the victim's browser as a same-origin page: the
connection is local, the Origin matches the Host, and without an API key nothing else
is asked. What gives it away is the Host header: the browser sends the page's name
(``evil.example``), never one of the server's. So every HTTP request and every
WebSocket handshake is refused (403 ``host_not_allowed``) unless its Host names an
allowed host:

- always: the address the server listens on (``--host``) and the loopback names
  (``localhost``, ``127.0.0.1``, ``[::1]``): no page can make a browser send those for
  its own origin;
- when it listens on every interface (``0.0.0.0``, ``::``): any IP address too (an
  address literal is not a name a rebinding page can own);
- the names of ``allowed_hosts`` (``--allowed-hosts``: a reverse proxy's or a container
  network's name); ``*`` turns the check off.

A request without a Host header (HTTP/1.0) is let through: no browser sends one. The
check is applied where the app is served on a socket
(:func:`sam2serve.server.http_server.uvicorn_config`, used by ``serve`` and
``labelstudio``), since only there is the listening address known; an app driven in
process (tests' ``TestClient``) or behind Ray Serve's proxy is not checked here. The
WebSocket Origin check (:func:`origin_allowed`) compares the Origin's host with the
allowed hosts, not with the Host header.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

ANY_HOST = "*"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_BINDS = ("0.0.0.0", "::", "")
# Where the guard leaves the hosts it allowed, for the WebSocket Origin check.
SCOPE_KEY = "sam2serve.allowed_hosts"
HOST_NOT_ALLOWED = "host_not_allowed"
_SHOWN = 100

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def parse_allowed_hosts(text: str) -> tuple[str, ...]:
    """``--allowed-hosts``' value: host names separated by commas, or ``*``."""
    entries = tuple(entry.strip() for entry in text.split(",") if entry.strip())
    try:
        check_allowed_hosts(entries)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return entries


def check_allowed_hosts(entries: tuple[str, ...]) -> None:
    """ValueError naming the first entry that is no host name, address or ``*``."""
    for entry in entries:
        if entry == ANY_HOST:
            continue
        name = _bare(entry)
        if name is None or not name:
            raise ValueError(
                f"allowed_hosts: {entry[:_SHOWN]!r} is not a host; expected a name "
                "(ml.example.org), an address (10.0.0.5, [fd00::5]) or * for any host"
            )


def _bare(entry: str) -> str | None:
    """A host entry as compared: lowercase, an IPv6 address without brackets; None when
    it holds what no host name does (a port, a path, spaces)."""
    value = entry.strip().lower()
    if value.startswith("[") and value.endswith("]"):
        value = value[1:-1]
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    if not value or any(c in value for c in "/:@?#[] \t\\") or len(value) > 253:
        return None
    return value.rstrip(".")


@dataclass(frozen=True)
class AllowedHosts:
    """The hosts one server answers to."""

    names: frozenset[str]
    any_address: bool = False  # any IP address (the server listens on every interface)
    any_host: bool = False  # '*': no check

    @classmethod
    def for_server(cls, bound: str, extra: tuple[str, ...] | None) -> AllowedHosts:
        """The hosts a server listening on ``bound`` answers to, with ``extra`` ones."""
        entries = tuple(extra or ())
        names = {_bare(name) for name in (*LOOPBACK_NAMES, bound, *entries) if name != ANY_HOST}
        return cls(
            names=frozenset(name for name in names if name),
            any_address=bound.strip("[]") in WILDCARD_BINDS,
            any_host=ANY_HOST in entries,
        )

    def allows(self, host: str) -> bool:
        """Whether a Host header's host (``host[:port]``, ``[v6][:port]``) is allowed."""
        if self.any_host:
            return True
        name = _bare(_host_part(host))
        if name is None:
            return False
        if name in self.names:
            return True
        if self.any_address:
            try:
                ipaddress.ip_address(name)
            except ValueError:
                return False
            return True
        return False

    def describe(self) -> str:
        shown = sorted(self.names)
        if self.any_address:
            shown.append("any IP address")
        return ", ".join(shown)


def _host_part(host: str) -> str:
    """``host`` of ``host:port`` or ``[v6]:port`` (a bare IPv6 address stays whole)."""
    host = host.strip()
    if host.startswith("["):
        end = host.find("]")
        return host[: end + 1] if end > 0 else host
    if host.count(":") == 1:
        return host.split(":", 1)[0]
    return host


def origin_allowed(
    origin: str, host: str, hosts: AllowedHosts | None, cors_origins: tuple[str, ...]
) -> bool:
    """Whether a browser page of ``origin`` may open a WebSocket on this server: one of
    ``cors_origins``, or a page of this server itself: its host an allowed one (``hosts``,
    when the server checks hosts) and its host and port those the request was sent to."""
    if origin in cors_origins:
        return True
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False
    if hosts is not None and not hosts.any_host and not hosts.allows(parts.netloc):
        return False
    return parts.netloc.lower() == host.strip().lower()


class HostGuard:
    """ASGI middleware: 403 ``host_not_allowed`` for an HTTP request or a WebSocket
    handshake whose Host is not allowed; the allowed hosts are left in the scope."""

    def __init__(self, app: Callable[..., Awaitable[None]], hosts: AllowedHosts) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        scope[SCOPE_KEY] = self.hosts
        host = _header(scope, b"host")
        if host is None or self.hosts.allows(host):
            await self.app(scope, receive, send)
            return
        body = json.dumps(
            {
                "error": {
                    "code": HOST_NOT_ALLOWED,
                    "message": f"Host {host[:_SHOWN]!r} is not a host this server answers "
                    f"to ({self.hosts.describe()}); a name that leads here (a proxy's, a "
                    "container network's) is added with --allowed-hosts",
                }
            }
        ).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 403, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await _refuse_handshake(scope, send, headers, body)


async def _refuse_handshake(
    scope: Scope, send: Send, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    """A WebSocket handshake refused: the JSON error as an HTTP 403 where the server can
    send one, else a close before accepting (the server answers 403 without a body)."""
    if "websocket.http.response" in scope.get("extensions", {}):
        await send({"type": "websocket.http.response.start", "status": 403, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
        return
    await send({"type": "websocket.close", "code": 1008})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


__all__ = [
    "ANY_HOST",
    "HOST_NOT_ALLOWED",
    "SCOPE_KEY",
    "AllowedHosts",
    "HostGuard",
    "check_allowed_hosts",
    "origin_allowed",
    "parse_allowed_hosts",
]
