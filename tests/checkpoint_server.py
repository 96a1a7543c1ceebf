"""A loopback HTTP server of fake checkpoint files (for ``sam2serve download`` and the
first-use download): Range requests, and the faults a real download meets on demand, the
hostile ones included (a body or headers dripped a byte at a time, an endless body, a
publisher's digest header that does not match, a redirect to a CDN path as Hugging Face's).

Fake checkpoints have every key of the official file with its shape, strictly, so the
load check accepts them; their tensors are views of one seeded random storage, which
``torch.save`` writes once: ~9 MB for tiny instead of ~150 MB.
"""

from __future__ import annotations

import io
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

import torch

from sam2serve.checkpoint import is_video_key
from sam2serve.config import get_config
from sam2serve.modeling.sam2_video import SAM2Video


def fake_checkpoint(size: str = "tiny", seed: int = 0, sam21: bool = True) -> bytes:
    """The bytes of a checkpoint file that passes the load check of ``size``: SAM 2.1's
    keys (the video model's), or with ``sam21=False`` the image keys plus a SAM 2.0-only
    video key (skipped by name, as SAM 2.0's files' are)."""
    with torch.device("meta"):
        shapes = SAM2Video(get_config(size)).state_dict()
    if not sam21:
        shapes = {k: v for k, v in shapes.items() if not is_video_key(k)}
        shapes["memory_encoder.sam20_only.weight"] = torch.empty(2, device="meta")
    largest = max(v.numel() for v in shapes.values())
    storage = torch.randn(largest, generator=torch.Generator().manual_seed(seed))
    state = {k: storage[: v.numel()].view(v.shape) for k, v in shapes.items()}
    buffer = io.BytesIO()
    torch.save({"model": state}, buffer)
    return buffer.getvalue()


@dataclass
class Behaviour:
    """What the server does to requests for one file."""

    body: bytes
    # The first N answers are this status (then the file).
    fail_first: int = 0
    fail_status: int = 503
    # The first N answers send the headers of the whole answer, then this many body
    # bytes, then close the connection.
    cut_first: int = 0
    cut_at: int = 0
    # Answer 200 with the whole file even to a Range request.
    ignore_range: bool = False
    # After the first N answers (faults included), serve this file instead (it changed).
    later_body: bytes | None = None
    later_after: int = 0
    # Extra headers of the file's answer (ETag, Server, X-Linked-Etag...).
    headers: dict[str, str] = field(default_factory=dict)
    # Answer /files/NAME with a 302 to /cdn/NAME carrying these headers (as Hugging Face
    # answers with X-Linked-Etag and X-Linked-Size before its CDN sends the bytes).
    redirect_headers: dict[str, str] | None = None
    # Send the body (drip_body) or the status line and headers too (drip_headers) one byte
    # every drip_s seconds.
    drip_body: bool = False
    drip_headers: bool = False
    drip_s: float = 0.5
    # No Content-Length, and after the file bytes without end (until the client leaves).
    endless: bool = False
    requests: list[dict[str, str | None]] = field(default_factory=list)
    sent: int = 0  # body bytes written, all answers together


class CheckpointServer:
    """``with CheckpointServer() as server: server.files["x.pt"] = Behaviour(...)``; the
    files are under ``server.url_base``."""

    def __init__(self) -> None:
        self.files: dict[str, Behaviour] = {}
        self.lock = threading.Lock()
        self.closing = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                outer.answer(self)

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: object, client_address: object) -> None:
                pass  # a client that hangs up mid-answer (it saw a new size) is no error

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url_base = f"http://127.0.0.1:{self.httpd.server_address[1]}/files"

    def __enter__(self) -> Self:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing.set()  # answers still dripping stop
        self.httpd.shutdown()
        self.httpd.server_close()

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        cdn = handler.path.startswith("/cdn/")
        name = handler.path.removeprefix("/cdn/" if cdn else "/files/")
        with self.lock:
            item = self.files.get(name)
            if item is None:
                handler.send_error(404)
                return
            if item.redirect_headers is not None and not cdn:
                handler.send_response(302)
                handler.send_header("Location", f"/cdn/{name}")
                for key, value in item.redirect_headers.items():
                    handler.send_header(key, value)
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return
            item.requests.append({"range": handler.headers.get("Range")})
            index = len(item.requests)
        if item.drip_headers:
            self._drip(handler, item, b"HTTP/1.0 200 OK\r\nContent-Length: 10\r\n\r\n", body=False)
            return
        if index <= item.fail_first:
            handler.send_error(item.fail_status)
            return
        body, start = item.body, 0
        if item.later_body is not None and index > item.later_after:
            body = item.later_body
        match = re.fullmatch(r"bytes=(\d+)-", handler.headers.get("Range") or "")
        if match is not None and not item.ignore_range:
            start = int(match.group(1))
            if start >= len(body):
                handler.send_response(416)
                handler.send_header("Content-Range", f"bytes */{len(body)}")
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return
            handler.send_response(206)
            handler.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            handler.send_response(200)
        if not item.endless:
            handler.send_header("Content-Length", str(len(body) - start))
        for key, value in item.headers.items():
            handler.send_header(key, value)
        handler.end_headers()
        if index <= item.fail_first + item.cut_first:
            self._write(handler, item, body[start : start + item.cut_at])
            handler.close_connection = True
            return
        if item.drip_body:
            self._drip(handler, item, body[start:], body=True)
        elif item.endless:
            self._write(handler, item, body[start:])
            junk = bytes(range(256)) * 256
            while not self.closing.is_set() and self._write(handler, item, junk):
                pass
        else:
            self._write(handler, item, body[start:])

    def _write(self, handler: BaseHTTPRequestHandler, item: Behaviour, data: bytes) -> bool:
        """Send ``data``; False once the client has gone."""
        try:
            handler.wfile.write(data)
            handler.wfile.flush()
        except OSError:
            handler.close_connection = True
            return False
        with self.lock:
            item.sent += len(data)
        return True

    def _drip(
        self, handler: BaseHTTPRequestHandler, item: Behaviour, data: bytes, body: bool
    ) -> None:
        """``data`` one byte every ``item.drip_s`` seconds, until the client leaves."""
        for offset in range(len(data)):
            if self.closing.is_set():
                return
            try:
                handler.wfile.write(data[offset : offset + 1])
                handler.wfile.flush()
            except OSError:
                handler.close_connection = True
                return
            if body:
                with self.lock:
                    item.sent += 1
            time.sleep(item.drip_s)
