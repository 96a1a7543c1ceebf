"""A stand-in for Label Studio in deploy/compose.yaml's test (test_compose.py): Label
Studio's image cannot be pulled here, so this takes its place on the compose network, in
the sam2serve image (python, numpy and Pillow are there), and does towards the ML backend
what Label Studio does:

- serves a task's uploaded image at /data/upload/..., only with the project's token
  (``Authorization: Token ...``, Label Studio's legacy API token), on port 8080;
- connects the backend by its compose name: GET /health, POST /setup with the labelling
  config, as "Connect Model" does;
- asks for a prediction: POST /predict for a task whose image is that upload's path, with
  one smart click in the context, as a click in the labelling editor does.

It answers /health itself, and /standin/result with what each step answered (the test
reads it over loopback). Run as ``python label_studio_standin.py``; the backend's URL is
$STANDIN_BACKEND_URL, the token $LABEL_STUDIO_API_KEY."""

from __future__ import annotations

import io
import json
import os
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
from PIL import Image

from sam2serve.labelstudio.label_config import EXAMPLE_CONFIG

BACKEND = os.environ.get("STANDIN_BACKEND_URL", "http://ml-backend:9090")
TOKEN = os.environ["LABEL_STUDIO_API_KEY"]
UPLOAD = "/data/upload/1/photo.png"
WIDTH, HEIGHT = 96, 64
CONNECT_WAIT_S = 600  # the backend loads its model first

state: dict[str, Any] = {"uploads_served": 0, "uploads_refused": 0, "steps": {}, "done": False}


def photo() -> bytes:
    pixels = np.full((HEIGHT, WIDTH, 3), 40, dtype=np.uint8)
    pixels[16:48, 20:60] = (220, 40, 40)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


PHOTO = photo()


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == UPLOAD:
            if self.headers.get("Authorization") != f"Token {TOKEN}":
                state["uploads_refused"] += 1
                self.answer(401, b'{"detail": "Authentication credentials were not provided."}')
                return
            state["uploads_served"] += 1
            self.answer(200, PHOTO, "image/png")
        elif self.path == "/health":
            self.answer(200, b'{"status": "UP"}')
        elif self.path == "/standin/result":
            self.answer(200, json.dumps(state).encode())
        else:
            self.answer(404, b'{"detail": "Not found."}')

    def answer(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        print("label-studio stand-in:", format % args, flush=True)


def call(method: str, path: str, body: dict | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(BACKEND + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")[:2000]


def click() -> dict:
    return {
        "type": "keypointlabels",
        "from_name": "click",
        "to_name": "image",
        "original_width": WIDTH,
        "original_height": HEIGHT,
        "image_rotation": 0,
        "is_positive": True,
        "value": {"x": 40.0, "y": 50.0, "width": 0.5, "keypointlabels": ["Object"]},
    }


def connect_and_predict() -> None:
    steps = state["steps"]
    started = time.monotonic()
    while True:
        try:
            steps["health"] = call("GET", "/health")
            if steps["health"][0] == 200:
                break
        except OSError as exc:  # not up yet
            steps["health"] = (None, str(exc))
        if time.monotonic() - started > CONNECT_WAIT_S:
            state["done"] = True
            return
        time.sleep(1)
    steps["setup"] = call("POST", "/setup", {"project": "1.1700000000", "schema": EXAMPLE_CONFIG})
    steps["predict"] = call(
        "POST",
        "/predict",
        {
            "tasks": [{"id": 1, "data": {"image": UPLOAD}}],
            "project": "1.1700000000",
            "label_config": EXAMPLE_CONFIG,
            "params": {"login": None, "password": None, "context": {"result": [click()]}},
        },
    )
    state["done"] = True
    print("label-studio stand-in: done", json.dumps(steps)[:500], flush=True)


if __name__ == "__main__":
    threading.Thread(target=connect_and_predict, daemon=True).start()
    ThreadingHTTPServer(("0.0.0.0", 8080), Handler).serve_forever()
