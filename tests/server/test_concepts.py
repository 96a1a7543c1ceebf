"""POST /v1/concepts (serve --concepts): every instance of a phrase, under the service's
limits, cache and model worker.

In process (TestClient) with the session's tiny random SAM 3 (``concepts_tiny``) beside the
session's tiny SAM 2.1: an answer equals ``Concepts.segment`` on the same image, and every
hostile request is a 4xx naming its field, refused before any model work where it can be.
The start-up error of ``serve --concepts`` without SAM 3's weights runs the real command.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from fuzzing import FuzzReport, fuzz
from hostile import free_port, spawn_cli_server
from hypothesis import strategies as st
from pycocotools import mask as mask_utils
from schemathesis import GenerationMode
from server_support import b64, photo, png_bytes, sha256
from user_text_cases import ACCEPTED_NAMES, REFUSED_NAMES

from sam2serve.server import concept_schemas as cs
from sam2serve.server.app import create_app
from sam2serve.server.settings import MiB, ServerSettings

LIMITS = {
    "max_concept_phrases": 5,
    "max_concept_boxes": 2,
    "max_concept_instances": 12,
    "max_pixels": 20_000,
    "max_upload_bytes": 1 * MiB,
}
PICTURE = photo("chelsea", 64)  # 64 x 43
PNG = png_bytes(PICTURE)
BIG_PNG = png_bytes(photo("astronaut", 200))  # 200 x 200 = 40,000 pixels > max_pixels


@pytest.fixture(scope="module")
def client(predictor, concepts_tiny) -> Iterator[TestClient]:
    settings = ServerSettings.from_flat(warmup=False, concepts=True, **LIMITS)
    with TestClient(create_app(settings, predictor, concepts=concepts_tiny)) as client:
        yield client


@pytest.fixture(scope="module")
def answer(client) -> dict[str, Any]:
    """The picture's concepts at threshold 0 (every query): encoded by this request."""
    response = client.post(
        "/v1/concepts", json={"image": b64(PNG), "phrases": ["cat", " ear "], "score_thresh": 0}
    )
    assert response.status_code == 200, response.text
    return response.json()


def concept_cache(client: TestClient):
    return client.app.state.service.concepts.cache


def error_of(response) -> dict[str, Any]:
    return response.json()["error"]


# --------------------------------------------------------------------------- answers


def test_every_query_comes_back_and_equals_the_engine(answer, concepts_tiny):
    queries = concepts_tiny.size.queries
    assert answer["image_id"] == sha256(PNG)  # the id /v1/embeddings and /v1/segment use
    assert (answer["width"], answer["height"], answer["cached"]) == (64, 43, False)
    assert answer["model"] == "sam3-tiny"
    assert [c["phrase"] for c in answer["concepts"]] == ["cat", "ear"]  # stripped, in order
    expected = concepts_tiny.segment([PICTURE], ["cat", "ear"], (), 0.0)[0]
    for concept in answer["concepts"]:
        instances = concept["instances"]
        # max_concept_instances (12) caps the tiny model's 20 queries, highest scores first
        assert len(instances) == min(queries, LIMITS["max_concept_instances"]) == 12
        scores = [i["score"] for i in instances]
        assert scores == sorted(scores, reverse=True)
        reference = sorted(expected[concept["phrase"]], key=lambda inst: -inst.score)
        assert len(reference) == queries
        for got, want in zip(instances, reference, strict=False):
            assert got["score"] == pytest.approx(want.score, abs=1e-5)
            rle = {"size": got["segmentation"]["size"], "counts": got["segmentation"]["counts"]}
            mask = mask_utils.decode(rle).astype(bool)
            np.testing.assert_array_equal(mask, want.mask)
            assert got["area"] == int(mask.sum()) == int(mask_utils.area(rle))
            assert got["bbox"] == pytest.approx(mask_utils.toBbox(rle).tolist())


def test_max_instances_and_the_image_id_reuse_the_encoding(client, answer):
    before = concept_cache(client).stats()
    response = client.post(
        "/v1/concepts",
        json={
            "image_id": answer["image_id"],
            "phrases": ["cat"],
            "score_thresh": 0,
            "max_instances": 3,
            "mask_format": "uncompressed_rle",
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["cached"] is True and body["image_id"] == answer["image_id"]
    instances = body["concepts"][0]["instances"]
    # the top 3 of the same phrase (detected alone now, with 'ear' before: fp differences)
    assert [i["score"] for i in instances] == pytest.approx(
        [i["score"] for i in answer["concepts"][0]["instances"][:3]], abs=1e-5
    )
    assert isinstance(instances[0]["segmentation"]["counts"], list)
    after = concept_cache(client).stats()
    assert (after.hits, after.misses) == (before.hits + 1, before.misses)


def test_boxes_alone_are_the_phrase_visual_and_a_high_threshold_keeps_nothing(client, answer):
    response = client.post(
        "/v1/concepts",
        json={
            "image_id": answer["image_id"],
            "boxes": [{"box": [0, 0, 64, 43]}, {"box": [10, 5, 20, 15], "positive": False}],
            "score_thresh": 1,
        },
    )
    assert response.status_code == 200, response.text
    assert response.json()["concepts"] == [{"phrase": "visual", "instances": []}]


def test_random_weights_default_the_threshold_to_zero(client, answer):
    """Random weights score about 0.25: without score_thresh the server keeps every
    instance (as the command line does); one that is sent is kept."""
    body = {"image_id": answer["image_id"], "phrases": ["cat", " ear "]}
    default = client.post("/v1/concepts", json=body)
    assert default.status_code == 200, default.text
    assert default.json()["concepts"] == answer["concepts"]  # answer: score_thresh 0
    assert all(c["instances"] for c in default.json()["concepts"])
    meta = client.post("/v1/concepts", json={**body, "score_thresh": 0.5})
    assert meta.status_code == 200, meta.text
    kept = [i["score"] for c in meta.json()["concepts"] for i in c["instances"]]
    every = [i["score"] for c in answer["concepts"] for i in c["instances"]]
    assert sorted(kept) == sorted(score for score in every if score > 0.5)


def test_a_server_with_weights_keeps_metas_threshold():
    request = cs.ConceptsRequest(phrases=["cat"], image_id="0" * 64)
    assert request.with_server_default(random_weights=False).score_thresh == 0.5
    assert request.with_server_default(random_weights=True).score_thresh == 0.0
    sent = cs.ConceptsRequest(phrases=["cat"], image_id="0" * 64, score_thresh=0.7)
    assert sent.with_server_default(random_weights=True).score_thresh == 0.7


@pytest.mark.parametrize(
    "text",
    [t for t, _ in REFUSED_NAMES] + ACCEPTED_NAMES + [" " * 200 + "cat", "cat" + " " * 300, ""],
)
def test_the_command_line_and_the_service_take_the_same_phrases(text):
    """One rule: a phrase the service takes, the command line takes as the same phrase."""
    from sam2serve.commands.common import UsageError
    from sam2serve.commands.concept_prompts import check_phrase

    try:
        served = cs.clean_phrases([text])[0]
    except ValueError:
        served = None
    try:
        typed = check_phrase(text, "prompts file")
    except UsageError:
        typed = None
    assert served == typed


def test_odd_but_readable_phrases_and_thin_boxes_are_answered(client, answer):
    """(What is refused: test_a_bad_request_is_a_422... and tests/engine/test_user_text.py.)"""
    phrases = ["\U0001f600", "<|endoftext|>", "a" * 64, "\U0001f469\u200d\U0001f4bb", "猫"]
    response = client.post(
        "/v1/concepts",
        json={
            "image_id": answer["image_id"],
            "phrases": phrases,
            "boxes": [{"box": [0, 0, 0.5, 0.5]}, {"box": [63, 42, 64, 43], "positive": False}],
            "score_thresh": 0,
            "max_instances": 2,
            "mask_format": "polygon",
        },
    )
    assert response.status_code == 200, response.text
    concepts = response.json()["concepts"]
    assert [c["phrase"] for c in concepts] == phrases
    assert all(len(c["instances"]) == 2 for c in concepts)


def test_concurrent_uploads_of_one_image_share_one_encode(client, concepts_tiny):
    images = client.app.state.service.concepts
    calls = []

    class Counting:  # the session's model, its encodes counted
        size = concepts_tiny.size
        spec = concepts_tiny.spec

        def encode(self, pixels):
            calls.append(len(pixels))
            return concepts_tiny.encode(pixels)

        def detect(self, *args, **kwargs):
            return concepts_tiny.detect(*args, **kwargs)

    fresh = png_bytes(photo("coffee", 32))
    body = {"image": b64(fresh), "phrases": ["cup"], "score_thresh": 0, "max_instances": 2}

    async def both() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            return await asyncio.gather(*(http.post("/v1/concepts", json=body) for _ in "ab"))

    images.concepts = Counting()
    try:
        answers = client.portal.call(both)
    finally:
        images.concepts = concepts_tiny
    assert [a.status_code for a in answers] == [200, 200], answers[0].text
    assert calls == [1]  # one encode of one image
    first, second = (a.json() for a in answers)
    assert first["concepts"] == second["concepts"]
    assert not len(images.flights)


def test_ready_metrics_and_docs_name_the_route(client, answer, predictor):
    ready = client.get("/readyz").json()
    assert ready["concepts"] is True
    # The server's own limits, which the page bounds its searches with.
    assert (ready["max_concept_phrases"], ready["max_concept_boxes"]) == (5, 2)
    metrics = client.get("/metrics").text
    assert 'endpoint="/v1/concepts"' in metrics
    assert 'sam2serve_cache_entries{cache="concepts"}' in metrics
    assert 'stage="concepts_detect"' in metrics
    operation = client.get("/openapi.json").json()["paths"]["/v1/concepts"]["post"]
    assert {"200", "404", "413", "422"} <= set(operation["responses"])
    assert "concepts_disabled" in operation["responses"]["404"]["description"]


def test_an_evicted_encoding_is_counted_and_its_id_is_404(predictor, concepts_tiny):
    # Room for one tiny encoding (~24 MiB): a second image evicts the first.
    settings = ServerSettings.from_flat(warmup=False, concepts=True, concept_cache_bytes=30 * MiB)
    second = png_bytes(photo("coffee", 40))
    with TestClient(create_app(settings, predictor, concepts=concepts_tiny)) as client:
        for data in (PNG, second):
            response = client.post("/v1/concepts", json={"image": b64(data), "phrases": ["cup"]})
            assert response.status_code == 200, response.text
        stats = concept_cache(client).stats()
        assert (stats.entries, stats.evictions) == (1, 1)
        again = client.post("/v1/concepts", json={"image_id": sha256(PNG), "phrases": ["cup"]})
        assert again.status_code == 404 and error_of(again)["code"] == "unknown_image_id"
        assert (
            'sam2serve_cache_evictions_total{cache="concepts"} 1.0' in client.get("/metrics").text
        )


# --------------------------------------------------------------------------- hostile

IMAGE_ID = sha256(PNG)
TOO_MANY = [f"thing {i}" for i in range(6)]


@pytest.mark.parametrize(
    "body, status, words",
    [
        ({"phrases": TOO_MANY}, 422, ("phrases", "max_concept_phrases")),
        ({"phrases": [f"p{i}" for i in range(65)]}, 422, ("phrases",)),
        ({"boxes": [{"box": [0, 0, 5, 5]}] * 3}, 422, ("boxes", "max_concept_boxes")),
        ({"phrases": ["cat"], "max_instances": 13}, 422, ("max_instances", "max_concept")),
        ({"phrases": ["cat"], "max_instances": 0}, 422, ("max_instances",)),
        ({"phrases": ["cat"], "max_instances": 201}, 422, ("max_instances",)),
        ({"phrases": ["cat", "  "]}, 422, ("phrases[1]", "empty")),
        ({"phrases": ["x" * 65]}, 422, ("phrases[0]", "65 characters")),
        ({"phrases": ["x" * 257]}, 422, ("phrases",)),
        ({"phrases": ["cat", " cat"]}, 422, ("phrases[1]", "twice")),
        ({"phrases": [7]}, 422, ("phrases",)),
        ({}, 422, ("phrase", "box")),
        ({"phrases": [], "boxes": []}, 422, ("phrase", "box")),
        ({"boxes": [{"box": [0, 0, 5]}]}, 422, ("boxes[0].box",)),
        ({"boxes": [{"box": [5, 0, 1, 5]}]}, 422, ("boxes[0].box", "x0 < x1")),
        ({"boxes": [{"box": [0, 0, 0, 0]}]}, 422, ("boxes[0].box", "is empty")),
        ({"boxes": [{"box": [1, 1, 9, 1]}]}, 422, ("boxes[0].box", "y0 < y1")),
        ({"boxes": [{"box": [-1, 0, 1, 5]}]}, 422, ("boxes[0].box", "below 0")),
        ({"phrases": ["ca\u0000t"]}, 422, ("phrases[0]", "U+0000")),
        ({"phrases": ["cat", "\u202e x"]}, 422, ("phrases[1]", "U+202E")),
        ({"phrases": ["a\u2028b"]}, 422, ("phrases[0]", "U+2028 LINE SEPARATOR")),
        ({"phrases": ["c\u200bat"]}, 422, ("phrases[0]", "U+200B ZERO WIDTH SPACE")),
        ({"boxes": [{"box": [0, 0, 5, 5], "positive": 1}]}, 422, ("boxes[0].positive",)),
        ({"boxes": [{"box": [0, 0, 5, 5], "label": 1}]}, 422, ("boxes[0].label",)),
        ({"phrases": ["cat"], "score_thresh": -0.1}, 422, ("score_thresh",)),
        ({"phrases": ["cat"], "score_thresh": 1.5}, 422, ("score_thresh",)),
        ({"phrases": ["cat"], "score_thresh": "0.5"}, 422, ("score_thresh",)),
        ({"phrases": ["cat"], "mask_format": "binary_mask"}, 422, ("mask_format",)),
        ({"phrases": ["cat"], "prompt": "cat"}, 422, ("prompt",)),
    ],
)
def test_a_bad_request_is_a_422_naming_the_field_before_any_work(client, body, status, words):
    before = concept_cache(client).stats()
    response = client.post("/v1/concepts", json={"image": b64(PNG), **body})
    assert response.status_code == status, response.text
    message = error_of(response)["message"]
    assert all(word in message for word in words), message
    after = concept_cache(client).stats()
    assert (after.hits, after.misses, after.entries) == (before.hits, before.misses, before.entries)


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("where", ["box", "score_thresh"])
def test_nan_and_infinity_are_refused(client, value, where):
    fields = (
        f'"boxes": [{{"box": [0, 0, {value}, 5]}}]'
        if where == "box"
        else f'"phrases": ["cat"], "score_thresh": {value}'
    )
    raw = f'{{"image_id": "{IMAGE_ID}", {fields}}}'
    response = client.post(
        "/v1/concepts", content=raw.encode(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 422, response.text
    assert where in error_of(response)["message"]


def test_a_box_outside_the_image_is_refused_before_the_encode(client):
    fresh = png_bytes(photo("rocket", 48))  # never sent before: not cached
    width, height = photo("rocket", 48).shape[1], photo("rocket", 48).shape[0]
    before = concept_cache(client).stats()
    response = client.post(
        "/v1/concepts",
        json={"image": b64(fresh), "boxes": [{"box": [0, 0, width + 1, height]}]},
    )
    assert response.status_code == 422, response.text
    message = error_of(response)["message"]
    assert "boxes[0].box" in message and f"{width}x{height}" in message
    assert concept_cache(client).stats().entries == before.entries  # nothing encoded


def test_image_ids_and_images(client):
    unknown = client.post("/v1/concepts", json={"image_id": "0" * 64, "phrases": ["cat"]})
    assert unknown.status_code == 404 and error_of(unknown)["code"] == "unknown_image_id"
    malformed = client.post("/v1/concepts", json={"image_id": "../etc", "phrases": ["cat"]})
    assert malformed.status_code == 422 and "image_id" in error_of(malformed)["message"]
    both = client.post(
        "/v1/concepts", json={"image": b64(PNG), "image_id": IMAGE_ID, "phrases": ["cat"]}
    )
    assert both.status_code == 422 and "exactly one" in error_of(both)["message"]
    neither = client.post("/v1/concepts", json={"phrases": ["cat"]})
    assert neither.status_code == 422 and "exactly one" in error_of(neither)["message"]
    big = client.post("/v1/concepts", json={"image": b64(BIG_PNG), "phrases": ["cat"]})
    assert big.status_code == 413 and error_of(big)["code"] == "too_many_pixels"
    multipart = client.post(
        "/v1/concepts",
        files={"image": ("big.png", BIG_PNG, "image/png")},
        data={"request": json.dumps({"phrases": ["cat"]})},
    )
    assert multipart.status_code == 413, multipart.text
    garbage = client.post("/v1/concepts", json={"image": b64(b"not an image"), "phrases": ["x"]})
    assert garbage.status_code == 400, garbage.text


def test_a_server_without_concepts_says_how_to_enable_them(predictor):
    with TestClient(create_app(ServerSettings.from_flat(warmup=False), predictor)) as client:
        response = client.post("/v1/concepts", json={"image": b64(PNG), "phrases": ["cat"]})
        assert response.status_code == 404, response.text
        error = error_of(response)
        assert error["code"] == "concepts_disabled" and "serve --concepts" in error["message"]
        ready = client.get("/readyz").json()
        assert ready["concepts"] is False
        assert ready["max_concept_phrases"] is None and ready["max_concept_boxes"] is None


def test_the_mask_budget_bounds_a_detection_before_the_encode(predictor, concepts_tiny):
    settings = ServerSettings.from_flat(
        warmup=False, concepts=True, max_decoded_bytes_in_flight=1 * MiB
    )
    app = create_app(settings, predictor, concepts=concepts_tiny)
    wide = png_bytes(photo("astronaut", 120))  # 120 x 120
    # 3 phrases x 20 kept masks, plus one phrase's upsampling: 2.2 MiB > 1 MiB
    need = app.state.service.concepts.mask_bytes(3, 100, (120, 120))
    assert need == 3 * 20 * 14_400 + 20 * 14_400 * 9 > MiB
    with TestClient(app) as client:
        response = client.post(
            "/v1/concepts", json={"image": b64(wide), "phrases": ["a", "b", "c"], "score_thresh": 0}
        )
        assert response.status_code == 413, response.text
        assert "masks of 3 phrase(s) x 20 instances" in error_of(response)["message"]
        assert concept_cache(client).stats().entries == 0  # refused before the encode


def test_the_mask_budget_is_read_from_the_header_before_any_decode(predictor, concepts_tiny):
    """A small upload whose header declares more pixels than its masks could ever hold in
    the decode budget is refused (413) with nothing decoded, as Label Studio's path is."""
    settings = ServerSettings.from_flat(
        warmup=False, concepts=True, max_decoded_bytes_in_flight=1 * MiB
    )
    app = create_app(settings, predictor, concepts=concepts_tiny)

    async def no_decode(data):
        raise AssertionError("the image was decoded before the mask budget was checked")

    app.state.service.decode = no_decode
    with TestClient(app) as client:
        response = client.post(
            "/v1/concepts",
            json={"image": b64(png_bytes(photo("astronaut", 120))), "phrases": ["a", "b", "c"]},
        )
        assert response.status_code == 413, response.text
        assert error_of(response)["code"] == "over_decode_budget"


def test_serve_concepts_without_weights_is_one_line_exit_2(tmp_path):
    command = [sys.executable, "-m", "sam2serve", "serve", "--concepts"]
    command += ["--sam3-weights", str(tmp_path), "--port", str(free_port())]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "SAM 3 weights not found" in lines[0] and "download --model sam3" in lines[0]


def _real_image(case, operation, mode, data) -> None:
    """Half the JSON cases carry the real picture, so they reach the model."""
    if isinstance(case.body, dict) and data.draw(st.booleans(), label="a real image"):
        case.body.pop("image_id", None)
        case.body["image"] = b64(PNG)


@pytest.mark.extended
def test_schemathesis_on_a_served_concept_model():
    """The real command with a tiny random SAM 3: every answer of /v1/concepts as the
    OpenAPI document says (no 5xx), positive and negative cases."""
    live = spawn_cli_server(["--random-weights", "--concepts", "--sam3-size", "tiny"])
    try:
        with live.client() as client:
            assert client.get("/readyz").json()["concepts"] is True
            response = client.post(
                "/v1/concepts", json={"image": b64(PNG), "phrases": ["cat"], "score_thresh": 0}
            )
            assert response.status_code == 200, response.text
            assert len(response.json()["concepts"][0]["instances"]) == 20
            # Random weights: no score_thresh is 0 (the start says so), as on the CLI.
            assert "without score_thresh keeps every instance" in live.log()
            unset = client.post("/v1/concepts", json={"image": b64(PNG), "phrases": ["cat"]})
            assert unset.json()["concepts"] == response.json()["concepts"]
            for phrase, named in (("a\u202eb", "U+202E"), ("c\x00t", "U+0000")):
                bad = client.post("/v1/concepts", json={"image": b64(PNG), "phrases": [phrase]})
                assert bad.status_code == 422 and named in bad.json()["error"]["message"]
        report = FuzzReport.within(300)
        examples = {GenerationMode.POSITIVE: 60, GenerationMode.NEGATIVE: 30}
        fuzz(
            live.url,
            report,
            "concepts",
            examples=examples,
            seed=_real_image,
            paths=("/v1/concepts",),
        )
        print(f"\nschemathesis, /v1/concepts: {report.summary()}")
        assert not report.failures, report.describe()
        assert report.statuses, "nothing was sent"
        assert live.alive()
    finally:
        live.stop()
