"""Helpers of the server tests: real uvicorn servers in threads, images, metrics."""

from __future__ import annotations

import base64
import hashlib
import io
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import torch
import uvicorn
from PIL import Image

from sam2serve.engine.image import load_image
from sam2serve.engine.predictor import Embedding, Predictor
from sam2serve.server.app import create_app
from sam2serve.server.http_server import uvicorn_config
from sam2serve.server.settings import ServerSettings

IMAGE_SIDE = 256  # photos are downscaled to this longer side: decode and RLE stay cheap
START_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 300.0


@dataclass
class LiveServer:
    url: str
    app: Any
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def service(self) -> Any:
        return self.app.state.service

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kwargs.pop("timeout", 300), **kwargs)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)


def start_server(
    settings: ServerSettings, predictor: Predictor, video_predictor: Any = None
) -> LiveServer:
    """Start a real uvicorn server for ``create_app(settings, predictor, video_predictor)``
    on a free port."""
    return start_app(create_app(settings, predictor, video_predictor), settings)


def start_app(app: Any, settings: ServerSettings) -> LiveServer:
    """Serve ``app`` (made for ``settings``) with the real uvicorn configuration on a free
    loopback port."""
    config = uvicorn_config(
        app,
        settings,
        "127.0.0.1",
        0,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    return LiveServer(f"http://127.0.0.1:{port}", app, server, thread)


def wait_ready(live: LiveServer) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    with live.client() as client:
        while client.get("/readyz").status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("the test server never became ready")
            time.sleep(0.1)


# --------------------------------------------------------------------------- images


def png_bytes(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def photo(name: str, side: int = IMAGE_SIDE) -> np.ndarray:
    import skimage.data

    picture = Image.fromarray(np.ascontiguousarray(getattr(skimage.data, name)()))
    if picture.mode != "RGB":
        picture = picture.convert("RGB")
    picture.thumbnail((side, side))
    return np.asarray(picture)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- model


class StubEncoderPredictor(Predictor):
    """The real predictor except ``encode``: a zero embedding of the real shapes, returned
    once ``gate`` is open. ``entered`` is set when an encode starts; ``calls`` counts them."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.calls = 0

    def encode(self, images: Any) -> Embedding:
        items = list(images) if isinstance(images, (list, tuple)) else [images]
        self.calls += 1
        self.entered.set()
        if not self.gate.wait(timeout=120):
            raise RuntimeError("test gate never opened")
        n = len(items)
        return Embedding(
            torch.zeros(n, 256, 64, 64),
            (torch.zeros(n, 32, 256, 256), torch.zeros(n, 64, 128, 128)),
            tuple(load_image(item).shape[:2] for item in items),
        )


# --------------------------------------------------------------------------- metrics

# Label values are quoted and may hold braces (a path template: /v1/videos/{session_id}).
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?\s+(\S+)$')


def scrape(client: httpx.Client) -> dict[str, float]:
    """``{'name{labels}': value}`` of every sample of /metrics."""
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    samples = {}
    for line in response.text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            samples[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return samples


def metric(samples: dict[str, float], name: str, **labels: str) -> float:
    """The value of one sample (0 when absent), labels matched as given (any order)."""
    wanted = {f'{k}="{v}"' for k, v in labels.items()}
    for key, value in samples.items():
        base, _, rest = key.partition("{")
        if base == name and wanted == (set(rest.rstrip("}").split(",")) - {""}):
            return value
    return 0.0


def error_of(response: httpx.Response) -> dict[str, Any]:
    """The error object of a 4xx/5xx answer, checking the one error shape."""
    assert response.headers["content-type"].startswith("application/json"), response.text
    body = response.json()
    assert set(body) == {"error"}, body
    assert isinstance(body["error"]["code"], str) and body["error"]["code"]
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]
