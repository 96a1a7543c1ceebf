"""Access, queue, timeout and cache limits on servers of their own.

These servers use StubEncoderPredictor: the real model for everything but the image
encoder, whose result (a zero embedding of the real shapes) waits on a gate the test
opens and closes. So "the worker is busy" and "the queue is full" are states the test
sets up exactly, not races against the clock.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from server_support import b64, error_of, metric, scrape, sha256

from sam2serve.server.settings import MiB

ENTRY = 16 * MiB  # one fp32 embedding
POINT = {"points": [{"x": 10, "y": 10}]}


def wait_until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def upload(live, image: bytes, **headers: str):
    with live.client() as client:
        return client.post("/v1/embeddings", json={"image": b64(image)}, headers=headers)


# --------------------------------------------------------------------------- API key


def test_api_key_is_required_when_configured(server_factory, stub_predictor, photos):
    live = server_factory(stub_predictor, api_key="s3cret")
    image = photos["rocket"]
    missing = upload(live, image)
    assert missing.status_code == 401 and error_of(missing)["code"] == "unauthorized"
    assert missing.headers["www-authenticate"] == "Bearer"
    assert "X-API-Key" in error_of(missing)["message"]
    assert upload(live, image, authorization="Bearer wrong").status_code == 401
    assert upload(live, image, **{"x-api-key": "s3cret!"}).status_code == 401
    assert upload(live, image, authorization="Bearer s3cret").status_code == 200
    assert upload(live, image, **{"x-api-key": "s3cret"}).json()["cached"] is True
    with live.client() as client:
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers={"x-api-key": "s3cret"}).status_code == 200
        # Probes stay open for orchestrators.
        assert client.get("/healthz").status_code == 200
        assert client.get("/readyz").status_code == 200


def test_cors_only_for_configured_origins(server_factory, stub_predictor):
    live = server_factory(stub_predictor, cors_origins=("http://annotator.test",))
    preflight = {"access-control-request-method": "POST"}
    with live.client() as client:
        allowed = client.options(
            "/v1/segment", headers={"origin": "http://annotator.test", **preflight}
        )
        other = client.options("/v1/segment", headers={"origin": "http://evil.test", **preflight})
    assert allowed.headers["access-control-allow-origin"] == "http://annotator.test"
    assert "access-control-allow-origin" not in other.headers


# --------------------------------------------------------------------------- queue


def test_full_queue_answers_503_with_retry_after(server_factory, stub_predictor, photos):
    live = server_factory(stub_predictor, max_queue=1, max_batch_size=1, max_wait_ms=0)
    stub_predictor.gate.clear()
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(upload, live, photos["rocket"])
        assert stub_predictor.entered.wait(30)  # the worker is now busy with it
        queued = pool.submit(upload, live, photos["coffee"])
        with live.client() as client:
            wait_until(
                lambda: metric(scrape(client), "sam2serve_queue_depth", queue="interactive") == 1
            )
        refused = upload(live, photos["astronaut"])
        stub_predictor.gate.set()
        assert running.result().status_code == 200 and queued.result().status_code == 200
    assert refused.status_code == 503
    error = error_of(refused)
    assert error["code"] == "overloaded" and "max_queue 1" in error["message"]
    assert int(refused.headers["retry-after"]) >= 1
    # Once the queue drains, the same request goes through.
    assert upload(live, photos["astronaut"]).status_code == 200
    with live.client() as client:
        assert (
            metric(scrape(client), "sam2serve_errors_total", code="overloaded", status="503") == 1
        )


def test_timeout_answers_503_and_keeps_the_work(server_factory, stub_predictor, photos):
    live = server_factory(stub_predictor, request_timeout_s=1.0)
    stub_predictor.gate.clear()
    timed_out = upload(live, photos["coffee"])
    assert timed_out.status_code == 503
    error = error_of(timed_out)
    assert error["code"] == "timeout" and "1 s" in error["message"]
    assert int(timed_out.headers["retry-after"]) >= 1
    stub_predictor.gate.set()
    # The encode had started, so it finished and was cached for the retry.
    with live.client() as client:
        wait_until(
            lambda: metric(scrape(client), "sam2serve_cache_entries", cache="embeddings") == 1
        )
    retry = upload(live, photos["coffee"])
    assert retry.status_code == 200 and retry.json()["cached"] is True
    assert stub_predictor.calls == 1


def test_timed_out_request_drops_its_queued_job(server_factory, stub_predictor, photos):
    live = server_factory(stub_predictor, request_timeout_s=1.0, max_batch_size=1, max_wait_ms=0)
    stub_predictor.gate.clear()
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(upload, live, photos["rocket"])  # runs, then times out
        assert stub_predictor.entered.wait(30)
        second = upload(live, photos["coffee"])  # waits in the queue, then times out
        assert second.status_code == 503 and error_of(second)["code"] == "timeout"
        assert first.result().status_code == 503
    with live.client() as client:
        assert metric(scrape(client), "sam2serve_queue_depth") == 0  # the job was dropped
    stub_predictor.gate.set()
    with live.client() as client:
        wait_until(
            lambda: metric(scrape(client), "sam2serve_cache_entries", cache="embeddings") == 1
        )
    assert stub_predictor.calls == 1  # coffee was never encoded


# --------------------------------------------------------------------------- cache


def test_eviction_under_a_small_byte_budget(server_factory, stub_predictor, photos):
    live = server_factory(stub_predictor, cache_bytes=int(2.5 * ENTRY))
    rocket, coffee, astronaut = photos["rocket"], photos["coffee"], photos["astronaut"]
    assert not upload(live, rocket).json()["cached"]
    assert not upload(live, coffee).json()["cached"]
    with live.client() as client:
        # Reading rocket by id refreshes it: coffee becomes the least recently used.
        response = client.post("/v1/segment", json={"image_id": sha256(rocket), "objects": [POINT]})
        assert response.status_code == 200
        assert not upload(live, astronaut).json()["cached"]  # over budget: evicts coffee
        gone = client.post("/v1/segment", json={"image_id": sha256(coffee), "objects": [POINT]})
        assert gone.status_code == 404 and error_of(gone)["code"] == "unknown_image_id"
        kept = client.post("/v1/segment", json={"image_id": sha256(rocket), "objects": [POINT]})
        assert kept.status_code == 200
        samples = scrape(client)
    assert metric(samples, "sam2serve_cache_evictions_total", cache="embeddings") == 1
    assert metric(samples, "sam2serve_cache_entries", cache="embeddings") == 2
    assert metric(samples, "sam2serve_cache_bytes", cache="embeddings") == 2 * ENTRY
    assert metric(samples, "sam2serve_cache_budget_bytes", cache="embeddings") == int(2.5 * ENTRY)
    # The evicted image is simply encoded again when sent again.
    assert upload(live, coffee).json()["cached"] is False
    assert stub_predictor.calls == 4


def test_mask_ids_are_evicted_too(server_factory, stub_predictor, photos):
    live = server_factory(stub_predictor, mask_cache_bytes=3 * 256 * 1024)  # three masks
    image_id = upload(live, photos["rocket"]).json()["image_id"]
    with live.client() as client:
        first = client.post("/v1/segment", json={"image_id": image_id, "objects": [POINT]})
        old_id = first.json()["objects"][0]["masks"][0]["mask_id"]
        client.post("/v1/segment", json={"image_id": image_id, "objects": [POINT]})  # 3 more
        stale = client.post(
            "/v1/segment", json={"image_id": image_id, "objects": [{**POINT, "mask_id": old_id}]}
        )
    assert stale.status_code == 404 and error_of(stale)["code"] == "unknown_mask_id"


def test_bad_prompts_are_refused_before_encoding(server_factory, stub_predictor, photos):
    live = server_factory(stub_predictor, max_objects=2)
    with live.client() as client:
        outside = client.post(
            "/v1/segment",
            json={"image": b64(photos["rocket"]), "objects": [{"points": [{"x": 5000, "y": 1}]}]},
        )
        too_many = client.post(
            "/v1/segment", json={"image": b64(photos["coffee"]), "objects": [POINT] * 3}
        )
    assert outside.status_code == 422 and "objects[0].points[0]" in error_of(outside)["message"]
    assert too_many.status_code == 422 and error_of(too_many)["code"] == "too_many_prompts"
    assert stub_predictor.calls == 0  # neither image was encoded


@pytest.mark.parametrize(
    "setting", [{"max_queue": 0}, {"cache_bytes": -1}, {"request_timeout_s": 0}, {"api_key": " "}]
)
def test_bad_settings_are_refused(setting):
    from sam2serve.server.settings import ServerSettings

    with pytest.raises(ValueError, match=next(iter(setting))):
        ServerSettings.from_flat(**setting)


# --------------------------------------------------------------------------- decode budget


def _decode_sizes(image: bytes) -> tuple[int, int]:
    """(bytes reserved while decoding, bytes of the pixels held until the encode)."""
    import io

    from PIL import Image

    from sam2serve.server.decode_budget import image_decode_bytes

    width, height = Image.open(io.BytesIO(image)).size
    return image_decode_bytes(width, height), width * height * 3


def test_decoded_bytes_in_flight_are_bounded_process_wide(server_factory, stub_predictor, photos):
    """An upload's pixels hold their bytes of max_decoded_bytes_in_flight until their
    encode has run: a second upload that does not fit beside them waits, then goes."""
    first_decode, first_pixels = _decode_sizes(photos["rocket"])
    second_decode, _ = _decode_sizes(photos["coffee"])
    budget = max(first_decode, second_decode) + first_pixels // 2
    live = server_factory(
        stub_predictor, max_decoded_bytes_in_flight=budget, max_batch_size=1, max_wait_ms=0
    )
    stub_predictor.gate.clear()
    with ThreadPoolExecutor(2) as pool, live.client() as client:
        first = pool.submit(upload, live, photos["rocket"])
        assert stub_predictor.entered.wait(30)  # decoded; its encode waits on the gate
        second = pool.submit(upload, live, photos["coffee"])
        wait_until(lambda: metric(scrape(client), "sam2serve_decode_waiting") == 1)
        assert metric(scrape(client), "sam2serve_decoded_bytes_in_flight") == first_pixels
        stub_predictor.gate.set()
        assert first.result().status_code == 200
        assert second.result().status_code == 200, second.result().text
        wait_until(lambda: metric(scrape(client), "sam2serve_decoded_bytes_in_flight") == 0)


def test_an_upload_larger_than_the_decode_budget_is_413(server_factory, stub_predictor, photos):
    decode, _ = _decode_sizes(photos["rocket"])
    live = server_factory(stub_predictor, max_decoded_bytes_in_flight=decode - 1)
    refused = upload(live, photos["rocket"])
    assert refused.status_code == 413
    error = error_of(refused)
    assert error["code"] == "over_decode_budget"
    assert "max_decoded_bytes_in_flight" in error["message"]
    assert stub_predictor.calls == 0
