"""What a DNS-rebinding page sends: requests and WebSocket handshakes on loopback whose
Host (and Origin) name the attacker's host, as a browser sends them once the attacker's
name resolves to 127.0.0.1. Raw sockets: the Host header is exactly what is given.
"""

from __future__ import annotations

import base64
import os
import time

from hostile import Answer, connect, read_response

EVIL = "evil.example"


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _head(method: str, path: str, host: str | None, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1"]
    if host is not None:
        lines.append(f"Host: {host}")
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def request_with_host(
    url: str,
    method: str,
    path: str,
    host: str | None,
    body: bytes = b"",
    content_type: str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> Answer:
    """One HTTP request to the server at ``url`` whose Host header is ``host`` (None: no
    Host header at all)."""
    extra = {"Connection": "close", **(headers or {})}
    if content_type is not None:
        extra["Content-Type"] = content_type
    extra["Content-Length"] = str(len(body))
    started = time.perf_counter()
    with connect(url, timeout) as sock:
        sock.sendall(_head(method, path, host, extra) + body)
        status, head, data = read_response(sock, timeout)
    return Answer(status, head, data, time.perf_counter() - started)


def websocket_handshake(
    url: str,
    path: str,
    host: str,
    origin: str | None,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> Answer:
    """A WebSocket opening handshake with this Host and Origin: 101 when accepted."""
    extra = {
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
        "Sec-WebSocket-Version": "13",
        **(headers or {}),
    }
    if origin is not None:
        extra["Origin"] = origin
    started = time.perf_counter()
    with connect(url, timeout) as sock:
        sock.sendall(_head("GET", path, host, extra))
        status, head, data = read_response(sock, timeout)
    return Answer(status, head, data, time.perf_counter() - started)
