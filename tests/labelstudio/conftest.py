"""Fixtures of the Label Studio backend tests: the tiny random model (shared), and apps on
it whose image downloads go to a mock transport the test controls."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sam2serve.checkpoint import load_model
from sam2serve.engine.predictor import Embedding, Predictor
from sam2serve.labelstudio.app import create_labelstudio_app
from sam2serve.labelstudio.options import LabelStudioOptions
from sam2serve.server.settings import MiB, ServerSettings

SETTINGS = ServerSettings.from_flat(warmup=False, max_upload_bytes=1 * MiB, max_wait_ms=0)


class MemoEncoder(Predictor):
    """The real predictor, whose encodes are remembered by pixels for the session: each
    test builds its own app (its own empty cache), and an image is still encoded once."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self._seen: dict[str, Embedding] = {}

    def encode(self, images: Any) -> Embedding:
        items = list(images) if isinstance(images, (list, tuple)) else [images]
        parts = []
        for item in items:
            pixels = np.ascontiguousarray(item)
            key = hashlib.sha256(pixels.tobytes() + str(pixels.shape).encode()).hexdigest()
            if key not in self._seen:
                self._seen[key] = super().encode([pixels])
            parts.append(self._seen[key])
        return Embedding(
            torch.cat([p.image_embed for p in parts]),
            tuple(torch.cat([p.high_res_feats[i] for p in parts]) for i in range(2)),
            tuple(size for p in parts for size in p.original_sizes),
        )


@pytest.fixture(scope="session")
def ls_predictor() -> Predictor:
    return MemoEncoder(load_model("tiny", random_weights=True, seed=0))


class Remote:
    """What the mock transport answers: files by URL, and the requests it saw."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[httpx.Request] = []
        self.handler: Callable[[httpx.Request], httpx.Response] | None = None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.handler is not None:
            return self.handler(request)
        data = self.files.get(str(request.url))
        if data is None:
            return httpx.Response(404, text="not found")
        return httpx.Response(200, content=data, headers={"content-type": "image/png"})


@pytest.fixture
def remote() -> Remote:
    return Remote()


@pytest.fixture
def make_client(ls_predictor, remote) -> Iterator[Callable[..., TestClient]]:
    """A TestClient (lifespan run) of a backend app with these options and settings."""
    clients: list[TestClient] = []

    def make(settings: ServerSettings = SETTINGS, **options: Any) -> TestClient:
        app = create_labelstudio_app(
            settings,
            LabelStudioOptions(**options),
            ls_predictor,
            transport=httpx.MockTransport(remote),
        )
        client = TestClient(app, raise_server_exceptions=False)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def client(make_client) -> TestClient:
    return make_client()
