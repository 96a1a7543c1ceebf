"""What a DNS-rebinding page sends: requests and WebSocket handshakes on loopback whose
Host (and Origin) name the attacker's host, as a browser sends them once the attacker's
name resolves to 127.0.0.1. Raw sockets: the Host header is exactly what is given.
"""

from __future__ import annotations

import base64
import os
import time

from hostile import Answer, connect

EVIL = "evil.example"


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _head(method: str, path: str, host: str | None, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1"]
    if host is not None:
        lines.append(f"Host: {host}")
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _read(sock, timeout: float) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and (Content-Length framed) body; a 101 has none."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"connection closed before a response: {data[:200]!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    status = int(status_line.split()[1])
    length = int(headers.get("content-length", "0") or 0)
    while status != 101 and len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, body


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
        status, head, data = _read(sock, timeout)
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
        status, head, data = _read(sock, timeout)
    return Answer(status, head, data, time.perf_counter() - started)
