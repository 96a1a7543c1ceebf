"""Concurrent /v1/concepts requests for different images share one SAM 3 encoder call.

In process (TestClient) with the session's tiny random SAM 3 (``concepts_tiny``), its
encoder wrapped to record every call. A job held on the model worker lets the requests
queue up behind it, so which encodes wait together is decided by the test, not by timing:
N images waiting make ONE ``encode`` call of N images (at most ``max_concept_batch_size``),
each answer equal to the engine on that image alone, and a failing image fails only its
own request.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from pycocotools import mask as mask_utils
from server_support import b64, photo, png_bytes

from sam2serve.server.app import create_app
from sam2serve.server.settings import ServerSettings

PHRASES = ["cat", "cup"]
MAX_INSTANCES = 3
# Different names and sizes: each is its own image (and its own encoding's height/width).
PICTURES = {
    name: photo(name, side)
    for name, side in (("chelsea", 40), ("coffee", 36), ("rocket", 44), ("astronaut", 32))
}
FAILING_WIDTH = 29  # the recording encoder fails any call holding an image this wide
BROKEN = np.ascontiguousarray(photo("camera", 60)[:20, :FAILING_WIDTH])


class RecordingConcepts:
    """The session's concept model with its ``encode`` calls recorded (each call's images'
    sizes) and, for an image ``FAILING_WIDTH`` wide, failing as a broken encoder would."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[list[tuple[int, int]]] = []
        self.held_at_encode: list[int] = []
        self.decoding = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def encode(self, images):
        self.calls.append([image.shape[:2] for image in images])
        if self.decoding is not None:
            self.held_at_encode.append(self.decoding.held)
        if any(image.shape[1] == FAILING_WIDTH for image in images):
            raise ValueError("this encoder cannot take that image")
        return self.inner.encode(images)


def make_app(predictor, concepts_tiny, **changes):
    defaults = {"warmup": False, "concepts": True, "max_wait_ms": 0, "request_timeout_s": 120}
    settings = ServerSettings.from_flat(**{**defaults, **changes})
    return create_app(settings, predictor, concepts=concepts_tiny)


@pytest.fixture(scope="module")
def client(predictor, concepts_tiny) -> Iterator[TestClient]:
    with TestClient(make_app(predictor, concepts_tiny, max_concept_batch_size=4)) as client:
        yield client


@contextlib.contextmanager
def recorded(client: TestClient) -> Iterator[RecordingConcepts]:
    images = client.app.state.service.concepts
    inner = images.concepts
    recording = RecordingConcepts(inner)
    images.concepts = recording
    try:
        yield recording
    finally:
        images.concepts = inner


def body(pixels: np.ndarray) -> dict[str, Any]:
    return {
        "image": b64(png_bytes(pixels)),
        "phrases": PHRASES,
        "score_thresh": 0,
        "max_instances": MAX_INSTANCES,
    }


def post_queued(
    client: TestClient, bodies: list[dict], queued: int, answered: int = 0
) -> list[httpx.Response]:
    """Send ``bodies`` at once while a job holds the model worker; let it go once
    ``queued`` encodes wait behind it (so they are batched as the worker's rules say) and
    ``answered`` requests have been answered meanwhile."""
    service = client.app.state.service
    holding, release = threading.Event(), threading.Event()

    def hold(context) -> None:
        holding.set()
        assert release.wait(60)

    async def scenario() -> list[httpx.Response]:
        blocker = service.worker.submit("hold", hold)
        try:
            assert await asyncio.to_thread(holding.wait, 30)
            transport = httpx.ASGITransport(app=client.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
                sent = [asyncio.create_task(http.post("/v1/concepts", json=b)) for b in bodies]
                deadline = time.monotonic() + 60
                while (
                    service.worker.depths()["interactive"] < queued
                    or sum(task.done() for task in sent) < answered
                ):
                    assert time.monotonic() < deadline, service.worker.depths()
                    await asyncio.sleep(0.01)
                release.set()
                return await asyncio.gather(*sent)
        finally:
            release.set()
            await asyncio.wrap_future(blocker.future)

    return client.portal.call(scenario)


def one_call_of(encoder: RecordingConcepts, pictures: list[np.ndarray]) -> bool:
    """Whether the encoder was called once, with these images (in the order they were
    queued, which is the order their decoding finished)."""
    return len(encoder.calls) == 1 and sorted(encoder.calls[0]) == sorted(
        p.shape[:2] for p in pictures
    )


def assert_equals_the_engine_alone(answer: dict, pixels: np.ndarray, concepts_tiny) -> None:
    """The answer is the engine's on this image encoded alone (scores within 1e-5, masks
    equal), top MAX_INSTANCES per phrase."""
    assert (answer["height"], answer["width"]) == pixels.shape[:2]
    expected = concepts_tiny.segment([pixels], PHRASES, (), 0.0)[0]
    assert [c["phrase"] for c in answer["concepts"]] == PHRASES
    for concept in answer["concepts"]:
        reference = sorted(expected[concept["phrase"]], key=lambda inst: -inst.score)
        instances = concept["instances"]
        assert len(instances) == MAX_INSTANCES
        for got, want in zip(instances, reference, strict=False):
            assert got["score"] == pytest.approx(want.score, abs=1e-5)
            mask = mask_utils.decode(got["segmentation"]).astype(bool)
            np.testing.assert_array_equal(mask, want.mask)


def test_different_images_waiting_together_are_one_encoder_call(client, concepts_tiny):
    pictures = [PICTURES[name] for name in ("chelsea", "coffee", "rocket")]
    with recorded(client) as encoder:
        answers = post_queued(client, [body(p) for p in pictures], queued=3)
    assert [a.status_code for a in answers] == [200] * 3, answers[0].text
    assert one_call_of(encoder, pictures)  # ONE call, three images
    for answer, pixels in zip(answers, pictures, strict=True):
        assert answer.json()["cached"] is False
        assert_equals_the_engine_alone(answer.json(), pixels, concepts_tiny)
    service = client.app.state.service
    assert not len(service.concepts.flights) and service.decoding.held == 0
    metrics = client.get("/metrics").text
    assert 'sam2serve_batch_size_bucket{kind="concepts_encode",le="4.0"}' in metrics


def test_each_batched_encoding_is_cached_on_its_own(client):
    """A batch's encodings are copies, not views of the batch: each cache entry holds (and
    counts) its own image's features only."""
    images = client.app.state.service.concepts
    pictures = [photo("chelsea", 48), photo("rocket", 50)]  # not sent before
    answers = post_queued(client, [body(p) for p in pictures], queued=2)
    assert [a.status_code for a in answers] == [200, 200], answers[0].text
    for answer in answers:
        encoding = images.cache.get(images.key_for(answer.json()["image_id"]))
        assert encoding is not None
        for tensor in (*encoding.fpn_hidden_states, *encoding.fpn_position_encoding):
            assert tensor.shape[0] == 1
            assert tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()


def test_the_same_image_still_shares_one_encode_inside_a_batch(client, concepts_tiny):
    astronaut = PICTURES["astronaut"]
    fresh = photo("coffee", 30)  # not sent before
    bodies = [body(astronaut), body(fresh), body(astronaut), body(astronaut)]
    with recorded(client) as encoder:
        answers = post_queued(client, bodies, queued=2)  # two encodes: one per image
    assert [a.status_code for a in answers] == [200] * 4, answers[0].text
    assert one_call_of(encoder, [astronaut, fresh])
    first, _, third, fourth = (a.json() for a in answers)
    assert first["concepts"] == third["concepts"] == fourth["concepts"]
    assert_equals_the_engine_alone(first, astronaut, concepts_tiny)
    assert_equals_the_engine_alone(answers[1].json(), fresh, concepts_tiny)


def test_a_failing_image_fails_only_its_own_request(client, concepts_tiny, server_log):
    good = [photo("chelsea", 34), photo("rocket", 38)]  # not sent before
    with recorded(client) as encoder:
        answers = post_queued(client, [body(good[0]), body(BROKEN), body(good[1])], queued=3)
    statuses = [a.status_code for a in answers]
    assert statuses == [200, 500, 200], [a.text for a in answers]
    error = answers[1].json()["error"]
    assert error["code"] == "encode_failed"
    assert f"{FAILING_WIDTH}x20 image" in error["message"] and "ValueError" in error["message"]
    assert "Traceback" not in answers[1].text
    # the batch failed as a whole, then each image was encoded alone
    sizes = [g.shape[:2] for g in good]
    broken = BROKEN.shape[:2]
    batch, *alone = encoder.calls
    assert sorted(batch) == sorted([sizes[0], broken, sizes[1]])
    assert alone == [[size] for size in batch]
    for answer, pixels in zip((answers[0], answers[2]), good, strict=True):
        assert_equals_the_engine_alone(answer.json(), pixels, concepts_tiny)
    assert "SAM 3 could not encode image" in server_log.text()
    service = client.app.state.service
    assert not len(service.concepts.flights) and service.decoding.held == 0
    # nothing cached for it: sent again, it is encoded (and fails) again
    with recorded(client) as encoder:
        again = client.post("/v1/concepts", json=body(BROKEN))
    assert again.status_code == 500 and encoder.calls == [[broken]]


def test_a_batch_never_exceeds_max_concept_batch_size(predictor, concepts_tiny):
    pictures = [photo(name, side) for name in ("chelsea", "coffee") for side in (30, 34, 38)][:5]
    app = make_app(predictor, concepts_tiny, max_concept_batch_size=2)
    with TestClient(app) as client, recorded(client) as encoder:
        answers = post_queued(client, [body(p) for p in pictures], queued=5)
    assert [a.status_code for a in answers] == [200] * 5, answers[0].text
    assert [len(call) for call in encoder.calls] == [2, 2, 1]
    assert sorted(s for call in encoder.calls for s in call) == sorted(
        p.shape[:2] for p in pictures
    )


def test_many_concurrent_requests_stay_within_the_batch_and_memory_bounds(predictor, concepts_tiny):
    """Hostile: a burst of distinct uploads against a small decode budget and batch bound.
    Every encoder call holds at most max_concept_batch_size images, the bytes reserved
    never pass the budget (the requests wait their turn for it), every request is
    answered, and nothing is left held."""
    pictures = [
        photo(name, side) for name in ("chelsea", "coffee", "astronaut") for side in (40, 46)
    ]
    budget = 96 * 1024  # ~3 uploads' headers (11 bytes a pixel) at once
    app = make_app(
        predictor,
        concepts_tiny,
        max_concept_batch_size=2,
        max_wait_ms=20,
        max_decoded_bytes_in_flight=budget,
    )
    service = app.state.service

    async def burst() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            return await asyncio.gather(
                *(http.post("/v1/concepts", json=body(p)) for p in pictures)
            )

    with TestClient(app) as client, recorded(client) as encoder:
        encoder.decoding = service.decoding
        answers = client.portal.call(burst)
    assert [a.status_code for a in answers] == [200] * len(pictures), [
        a.text for a in answers if a.status_code != 200
    ]
    assert all(1 <= len(call) <= 2 for call in encoder.calls), encoder.calls
    assert sum(len(call) for call in encoder.calls) == len(pictures)  # each image once
    assert max(encoder.held_at_encode) <= budget
    assert service.decoding.held == 0 and not len(service.concepts.flights)


def test_a_full_queue_refuses_the_rest_and_holds_nothing_for_them(predictor, concepts_tiny):
    """Hostile: more distinct uploads than the queue takes while the worker is busy: the
    overflow gets 503 overloaded at once (its pixels released), the queued ones are one
    batch."""
    pictures = [photo("chelsea", side) for side in (30, 32, 34, 36, 38)]
    app = make_app(predictor, concepts_tiny, max_concept_batch_size=4, max_queue=2)
    with TestClient(app) as client, recorded(client) as encoder:
        answers = post_queued(client, [body(p) for p in pictures], queued=2, answered=3)
        service = client.app.state.service
        assert service.decoding.held == 0 and not len(service.concepts.flights)
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200, 200, 503, 503, 503], [a.text for a in answers]
    refused = [a for a in answers if a.status_code == 503]
    assert all(a.json()["error"]["code"] == "overloaded" for a in refused)
    assert all("retry-after" in a.headers for a in refused)
    assert [len(call) for call in encoder.calls] == [2]
