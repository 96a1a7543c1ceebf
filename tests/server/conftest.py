"""Fixtures of the server tests: real uvicorn servers on 127.0.0.1 (free ports), in
threads of the test process.

All servers share one tiny model with random weights. The main server (session-scoped)
runs the real predictor. The "stub encoder" servers replace only ``Predictor.encode``
with a zero embedding of the real shapes behind a gate the test controls: that makes
queue-full, timeout and eviction deterministic and cheap (an encode costs seconds on this
CPU), while everything else — HTTP, parsing, the worker, caches, the decoder — is real.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from server_support import (
    LiveServer,
    StubEncoderPredictor,
    b64,
    photo,
    png_bytes,
    start_server,
    wait_ready,
)

from sam2serve.checkpoint import load_model
from sam2serve.engine.predictor import Predictor
from sam2serve.server.settings import MiB, ServerSettings

# The main server: small limits so the limit tests need small inputs only, a generous
# batching window so concurrent uploads land in one encoder batch.
MAIN_SETTINGS = ServerSettings.from_flat(
    max_upload_bytes=1 * MiB,
    max_pixels=600_000,
    max_objects=8,
    max_points_per_object=6,
    max_amg_points=256,
    max_batch_size=4,
    max_wait_ms=3000,
    max_queue=64,
    request_timeout_s=300,
)


@pytest.fixture(scope="session")
def photos() -> dict[str, bytes]:
    """Small PNG files of real photos, by name."""
    return {name: png_bytes(photo(name)) for name in ("chelsea", "astronaut", "coffee", "rocket")}


@pytest.fixture(scope="session")
def predictor() -> Predictor:
    return Predictor(load_model("tiny", random_weights=True, seed=0))


@pytest.fixture
def stub_predictor(predictor) -> StubEncoderPredictor:
    return StubEncoderPredictor(predictor.model)


@pytest.fixture
def server_factory() -> Iterator[Callable[..., LiveServer]]:
    """Start servers with other settings (warm-up off; stopped after the test)."""
    started: list[LiveServer] = []

    def make(predictor: Predictor, video_predictor: Any = None, **changes: Any) -> LiveServer:
        settings = ServerSettings.from_flat(**{"warmup": False, **changes})
        live = start_server(settings, predictor, video_predictor)
        started.append(live)
        wait_ready(live)
        return live

    yield make
    for live in started:
        if isinstance(live.service.predictor, StubEncoderPredictor):
            live.service.predictor.gate.set()
        live.stop()


@pytest.fixture(scope="session")
def main_server(predictor) -> Iterator[LiveServer]:
    live = start_server(MAIN_SETTINGS, predictor)
    wait_ready(live)
    yield live
    live.stop()


@pytest.fixture(scope="session")
def chelsea_id(main_server, photos) -> str:
    """chelsea.png encoded on the main server: its image_id."""
    with main_server.client() as client:
        response = client.post("/v1/embeddings", json={"image": b64(photos["chelsea"])})
    assert response.status_code == 200, response.text
    return response.json()["image_id"]


class LogCapture(logging.Handler):
    """Everything the server logs, formatted as a log file would be (tracebacks included)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.stream = io.StringIO()
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.stream.write(self.format(record) + "\n")

    def text(self) -> str:
        return self.stream.getvalue()


@pytest.fixture
def server_log():
    capture = LogCapture()
    loggers = [logging.getLogger(name) for name in ("", "uvicorn", "uvicorn.error", "sam2serve")]
    for logger in loggers:
        logger.addHandler(capture)
    yield capture
    for logger in loggers:
        logger.removeHandler(capture)
