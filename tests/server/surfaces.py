"""Helpers of the reliability suites of the surfaces added after /v1's core (video
sessions, /v1/coco, /v1/images, the Label Studio backend): hand-made hostile files, a
loopback web site for the backend to fetch from, and the tally of what each surface
answered (tried / 4xx / 5xx / worst /healthz stall / worst peak RSS growth).

Everything here talks to 127.0.0.1 only; the files are built in memory, small on disk
and on the wire whatever they declare.
"""

from __future__ import annotations

import io
import json
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from hostile import (
    LOOPBACK,
    Answer,
    GiB,
    SpawnedServer,
    StallProbe,
    exchange,
    proc_status,
    reset_peak_rss,
    spawn_server,
)

MiB = 1024 * 1024
REPORT_ENV = "SAM2SERVE_RELIABILITY_REPORT"  # a file the tallies are appended to (JSON lines)
MAX_STALL_S = 0.5  # the worst /healthz latency a hostile request may cause
SETTLE_S = 0.2  # after a garbage collection in the server, before a measurement
SEND_TIMEOUT_S = 60.0  # one request's answer on a busy 2-core machine; never asserted


def send(
    live: SpawnedServer,
    method: str,
    path: str,
    body: bytes = b"",
    content_type: str | None = None,
    timeout: float = SEND_TIMEOUT_S,
) -> Answer:
    """One request to a spawned server (raw socket, so hostile bodies go as they are)."""
    return exchange(live.url, method, path, body, content_type, timeout)


# --------------------------------------------------------------------------- files


def gif(screen: tuple[int, int], frames: int = 1) -> bytes:
    """An animated GIF whose logical screen is ``screen`` (width, height) and whose
    ``frames`` images are each one pixel: a few bytes per frame, however large the screen
    (a decoder that composes full frames allocates width x height per frame)."""
    width, height = screen
    out = b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80, 0, 0)
    out += b"\x00\x00\x00\xff\xff\xff"  # two-colour global table
    out += b"!\xff\x0bNETSCAPE2.0\x03\x01\x00\x00\x00"  # loop forever
    for _ in range(frames):
        out += b"!\xf9\x04\x00\x01\x00\x00\x00"  # graphic control: 10 ms
        out += b"," + struct.pack("<HHHHB", 0, 0, 1, 1, 0)
        out += b"\x02\x02\x44\x01\x00"  # LZW: clear, pixel 0, end
    return out + b";"


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares ``width`` x ``height`` (8-bit grey) and carries one row: what a
    decoder that trusts the header allocates before it finds the data short."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    row = zlib.compress(b"\x00" * (width + 1))
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", row)
        + (_png_chunk(b"IEND", b""))
    )


def png_zeros(width: int, height: int) -> bytes:
    """A valid all-black grey PNG of ``width`` x ``height``: a few KB for megapixels."""
    compressor = zlib.compressobj(9)
    row = b"\x00" * (width + 1)
    data = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", data)
        + (_png_chunk(b"IEND", b""))
    )


def mp4(frames: int, width: int, height: int) -> bytes:
    """An H.264 MP4 of ``frames`` black frames (its header says how many)."""
    import av
    import numpy as np

    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=25)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "40"}
        black = av.VideoFrame.from_ndarray(np.zeros((height, width, 3), np.uint8), "rgb24")
        for _ in range(frames):
            for packet in stream.encode(black):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


def multipart_files(parts: list[tuple[str, str, bytes]]) -> tuple[str, bytes]:
    """(content type, body) of multipart/form-data file parts (field, file name, data)."""
    boundary = "surfaces-5e1d"
    out = b""
    for name, filename, data in parts:
        out += (
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; '
                f'filename="{filename}"\r\nContent-Type: application/octet-stream\r\n\r\n'
            ).encode()
            + data
            + b"\r\n"
        )
    return f"multipart/form-data; boundary={boundary}", out + f"--{boundary}--\r\n".encode()


# --------------------------------------------------------------------------- servers


class SharedServer:
    """A spawned server that a module's tests share, started again when a request killed
    or froze it (each restart is kept, with the end of the dead server's log).
    ``spawn_server``'s arguments; ``prepare(live)`` runs after every start."""

    def __init__(
        self,
        settings: dict[str, Any],
        *,
        optional: dict[str, Any] | None = None,
        labelstudio: dict[str, Any] | None = None,
        memory_headroom: int = 3 * GiB,
        prepare: Callable[[SpawnedServer], None] | None = None,
        max_restarts: int = 3,
    ) -> None:
        self.spawn = {
            "settings": settings,
            "optional": optional,
            "labelstudio": labelstudio,
            "memory_headroom": memory_headroom,
        }
        self.prepare = prepare
        self.max_restarts = max_restarts
        self.live: SpawnedServer | None = None
        self.restarts: list[str] = []

    def ensure(self) -> SpawnedServer:
        if self.live is not None:
            if self.live.alive(timeout=5):
                return self.live
            self.restarts.append(self.live.log()[-1500:])
            self.live.stop()
            self.live = None
        if len(self.restarts) > self.max_restarts:
            pytest.fail(f"the server died or froze {len(self.restarts)} times; not again")
        self.live = spawn_server(**self.spawn)
        if self.prepare is not None:
            self.prepare(self.live)
        return self.live

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


# --------------------------------------------------------------------------- measuring


def measured(
    live: SpawnedServer, tally: Tally, request: Callable[[], Answer]
) -> tuple[int, Answer | None, int, float]:
    """(status, answer, peak RSS growth, worst /healthz latency) of one request."""
    live.collect_garbage(SETTLE_S)  # the peak is measured from what the server holds
    with StallProbe(live.url) as probe:
        (status, answer), growth = peak_growth(live, status_of(request))
        time.sleep(0.05)
    tally.add(status, growth)
    tally.stalled(probe.worst_s)
    print(f" [{status}, peak +{growth / MiB:.0f} MiB, /healthz {probe.worst_s:.3f} s]", end=" ")
    return status, answer, growth, probe.worst_s


def confirmed_stall(live: SpawnedServer, request: Callable[[], Answer], stall: float) -> float:
    """A /healthz stall over the limit, measured again with the same (refused) request up to
    twice: a handler that blocks the event loop stalls every time, a pause of a busy
    machine (2 cores shared with the test process and the suite's other servers) does not.
    The least of the measurements."""
    for _ in range(2):
        if stall <= MAX_STALL_S:
            break
        live.collect_garbage(SETTLE_S)
        with StallProbe(live.url) as probe:
            request()
            time.sleep(0.05)
        stall = min(stall, probe.worst_s)
    return stall


# --------------------------------------------------------------------------- tallies


@dataclass
class Tally:
    """What one surface answered to the hostile requests sent to it."""

    surface: str
    statuses: list[int] = field(default_factory=list)
    worst_stall_s: float = 0.0
    worst_growth: int = 0
    notes: list[str] = field(default_factory=list)

    def add(self, status: int, growth: int = 0) -> None:
        self.statuses.append(status)
        self.worst_growth = max(self.worst_growth, growth)

    def stalled(self, seconds: float) -> None:
        self.worst_stall_s = max(self.worst_stall_s, seconds)

    def row(self) -> dict[str, Any]:
        return {
            "surface": self.surface,
            "tried": len(self.statuses),
            "4xx": sum(400 <= s < 500 for s in self.statuses),
            "5xx": sum(s >= 500 for s in self.statuses),
            "no answer": self.statuses.count(0),
            "2xx": sum(200 <= s < 300 for s in self.statuses),
            "worst /healthz stall s": round(self.worst_stall_s, 3),
            "worst peak RSS growth MiB": round(self.worst_growth / MiB, 1),
        }


def report(tallies: dict[str, Tally]) -> str:
    """The tallies as one line each (and appended to $SAM2SERVE_RELIABILITY_REPORT)."""
    rows = [tally.row() for tally in tallies.values()]
    path = os.environ.get(REPORT_ENV)
    if path:
        with open(path, "a") as out:
            out.writelines(json.dumps(row) + "\n" for row in rows)
    return "\n".join(json.dumps(row) for row in rows)


def peak_growth(live: SpawnedServer, send: Callable[[], Any]) -> tuple[Any, int]:
    """``send()``'s result and how far the server's peak RSS (VmHWM) rose above its RSS
    just before (the peak is reset first where Linux allows; else it is the process's
    peak so far, which can only overstate the growth)."""
    reset_peak_rss(live.pid)
    before = proc_status(live.pid)["VmRSS"]
    result = send()
    return result, max(0, proc_status(live.pid)["VmHWM"] - before)


def status_of(send: Callable[[], Answer]) -> Callable[[], tuple[int, Answer | None]]:
    """``send`` as (status, answer): 0 and None when no answer came (dropped, timed out)."""

    def run() -> tuple[int, Answer | None]:
        try:
            answer = send()
        except (TimeoutError, OSError):
            return 0, None
        return answer.status, answer

    return run


# --------------------------------------------------------------------------- a web site


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class LoopbackSite:
    """A small web site on 127.0.0.1 (threads of the test process) for the backend to
    fetch from; it records every request it gets.

    GET /img.png and /data/upload/...: the image; POST /api/token/refresh: an access
    token; /redirect?to=URL: a 302 to URL; /loop?n=K: a 302 to /loop?n=K+1; /drip: one
    byte every ``drip_s`` of a declared kilobyte; /declared-huge: a 1 GB Content-Length
    and a few bytes; /endless: chunks without a length until the client gives up."""

    def __init__(self, image: bytes, drip_s: float = 0.5) -> None:
        self.image = image
        self.drip_s = drip_s
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        site = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                site._record(self, b"")
                site._answer(self)

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(min(length, 1 << 20))
                site._record(self, body)
                if self.path.startswith("/api/token/refresh"):
                    site._send(self, 200, json.dumps({"access": "short-lived"}).encode())
                else:
                    site._send(self, 404, b"no")

        self.server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://{LOOPBACK}:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def requests_to(self, prefix: str = "") -> list[Seen]:
        with self._lock:
            return [seen for seen in self.seen if seen.path.startswith(prefix)]

    def _record(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        headers = {name.lower(): value for name, value in handler.headers.items()}
        with self._lock:
            self.seen.append(Seen(handler.command, handler.path, headers, body))

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, body: bytes, **headers: str) -> None:
        handler.send_response(status)
        handler.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            handler.send_header(name.replace("_", "-"), value)
        handler.end_headers()
        handler.wfile.write(body)

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(handler.path)
        query = parse_qs(parts.query)
        path = parts.path
        if path == "/img.png" or path.startswith("/data/upload/"):
            self._send(handler, 200, self.image, Content_Type="image/png")
        elif path == "/redirect":
            self._send(handler, 302, b"", Location=query["to"][0])
        elif path == "/loop":
            hop = int(query.get("n", ["0"])[0]) + 1
            self._send(handler, 302, b"", Location=f"{self.url}/loop?n={hop}")
        elif path == "/drip":
            self._drip(handler)
        elif path == "/declared-huge":
            handler.send_response(200)
            handler.send_header("Content-Length", str(10**9))
            handler.end_headers()
            handler.wfile.write(b"\x89PNG")
        elif path == "/endless":
            self._endless(handler)
        else:
            self._send(handler, 404, b"not here")

    def _drip(self, handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", "1024")
        handler.send_header("Content-Type", "image/png")
        handler.end_headers()
        try:
            for _ in range(1024):  # at most ~8 minutes, or until the client hangs up
                handler.wfile.write(b"\x00")
                handler.wfile.flush()
                time.sleep(self.drip_s)
        except OSError:
            pass

    @staticmethod
    def _endless(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "image/png")
        handler.send_header("Connection", "close")
        handler.end_headers()
        chunk = b"\x00" * 65536
        try:
            for _ in range(4096):  # 256 MiB at most
                handler.wfile.write(chunk)
        except OSError:
            pass
        handler.close_connection = True


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
