"""POST /v1/segment with ``"model": "sam3"`` (serve --concepts): clicks and boxes answered by
SAM 3's tracker heads over the image's cached SAM 3 encoding.

In process (TestClient) with the session's tiny random SAM 3 beside its tiny SAM 2.1: the
answer equals the engine's (``Concepts.interactive`` on the same encoding), an image_id from
/v1/concepts is refined without a new encode, a mask_id carries SAM 3's low-res logits into
the next click, and hostile requests are 4xx naming the value.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pycocotools import mask as mask_utils
from server_support import b64, photo, png_bytes, sha256

from sam2serve.server.app import create_app
from sam2serve.server.settings import ServerSettings

PICTURE = photo("chelsea", 64)  # 64 x 43
PNG = png_bytes(PICTURE)
CLICK = {"points": [{"x": 30, "y": 20, "label": 1}]}


@pytest.fixture(scope="module")
def client(predictor, concepts_tiny) -> Iterator[TestClient]:
    settings = ServerSettings.from_flat(warmup=False, concepts=True)
    with TestClient(create_app(settings, predictor, concepts=concepts_tiny)) as client:
        yield client


@pytest.fixture(scope="module")
def image_id(client) -> str:
    """The picture's id, encoded by /v1/concepts (as the page's concept pass does)."""
    response = client.post("/v1/concepts", json={"image": b64(PNG), "phrases": ["cat"]})
    assert response.status_code == 200, response.text
    return response.json()["image_id"]


def decoded(mask: dict[str, Any]) -> np.ndarray:
    rle = {"size": mask["segmentation"]["size"], "counts": mask["segmentation"]["counts"]}
    return mask_utils.decode(rle).astype(bool)


def test_a_click_on_the_concept_encoding_equals_the_engine(client, image_id, concepts_tiny):
    response = client.post(
        "/v1/segment", json={"image_id": image_id, "model": "sam3", "objects": [CLICK]}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["image_id"] == image_id == sha256(PNG)
    assert (body["model"], body["cached"], body["width"], body["height"]) == (
        "sam3-tiny",
        True,
        64,
        43,
    )
    [encoding] = concepts_tiny.encode([PICTURE])
    expected = concepts_tiny.interactive.predict(encoding.tracker, [[30, 20]], [1])
    masks, iou, _ = expected.numpy()
    [obj] = body["objects"]
    assert len(obj["masks"]) == 3
    for c, mask in enumerate(obj["masks"]):
        assert mask["score"] == pytest.approx(float(iou[0, c]), abs=1e-5)
        np.testing.assert_array_equal(decoded(mask), masks[0, c])


def test_a_mask_id_refines_with_sam3s_logits(client, image_id, concepts_tiny):
    first = client.post(
        "/v1/segment",
        json={"image_id": image_id, "model": "sam3", "objects": [CLICK], "best_mask_only": True},
    ).json()
    [mask] = first["objects"][0]["masks"]
    second = {
        "points": [{"x": 30, "y": 20, "label": 1}, {"x": 50, "y": 30, "label": 0}],
        "mask_id": mask["mask_id"],
    }
    response = client.post(
        "/v1/segment",
        json={
            "image_id": image_id,
            "model": "sam3",
            "objects": [second],
            "multimask_output": False,
        },
    )
    assert response.status_code == 200, response.text
    [encoding] = concepts_tiny.encode([PICTURE])
    predictor = concepts_tiny.interactive
    one = predictor.predict(encoding.tracker, [[30, 20]], [1])
    best = int(one.iou_scores[0].argmax())
    refined = predictor.predict(
        encoding.tracker,
        [[30, 20], [50, 30]],
        [1, 0],
        mask_input=one.low_res_logits[0, best : best + 1],
        multimask_output=False,
    )
    [got] = response.json()["objects"][0]["masks"]
    assert got["score"] == pytest.approx(float(refined.iou_scores[0, 0]), abs=1e-5)
    np.testing.assert_array_equal(decoded(got), refined.masks[0, 0].numpy())


def test_an_upload_is_encoded_once_for_both_sam3_paths(client):
    other = png_bytes(photo("coffee", 40))
    cache = client.app.state.service.concepts.cache
    response = client.post(
        "/v1/segment",
        json={"image": b64(other), "model": "sam3", "objects": [{"box": [2, 3, 30, 25]}]},
    )
    assert response.status_code == 200, response.text
    assert response.json()["cached"] is False
    before = cache.stats()
    again = client.post(
        "/v1/concepts", json={"image_id": response.json()["image_id"], "phrases": ["cup"]}
    )
    assert again.status_code == 200 and again.json()["cached"] is True
    assert cache.stats().entries == before.entries


@pytest.mark.parametrize(
    ("model", "shown"), [("sam4", "sam4"), ("SAM3", "SAM3"), (3, "3"), (None, "None")]
)
def test_an_unknown_model_is_named(client, image_id, model, shown):
    response = client.post(
        "/v1/segment", json={"image_id": image_id, "model": model, "objects": [CLICK]}
    )
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert "model" in message and shown in message


def test_a_click_outside_the_image_is_refused_before_the_encode(client):
    cache = client.app.state.service.concepts.cache
    before = cache.stats().entries
    other = png_bytes(photo("astronaut", 30))
    response = client.post(
        "/v1/segment",
        json={
            "image": b64(other),
            "model": "sam3",
            "objects": [{"points": [{"x": 300, "y": 2, "label": 1}]}],
        },
    )
    assert response.status_code == 422, response.text
    assert "objects[0]" in response.json()["error"]["message"]
    assert "300" in response.json()["error"]["message"]
    assert cache.stats().entries == before


def test_a_sam2_mask_id_does_not_refine_sam3(client, image_id):
    sam2 = client.post("/v1/segment", json={"image": b64(PNG), "objects": [CLICK]})
    assert sam2.status_code == 200, sam2.text
    mask_id = sam2.json()["objects"][0]["masks"][0]["mask_id"]
    response = client.post(
        "/v1/segment",
        json={"image_id": image_id, "model": "sam3", "objects": [{**CLICK, "mask_id": mask_id}]},
    )
    assert response.status_code == 422, response.text
    assert mask_id in response.json()["error"]["message"]


def test_an_image_id_sam3_never_encoded_is_404(client):
    response = client.post(
        "/v1/segment", json={"image_id": "a" * 64, "model": "sam3", "objects": [CLICK]}
    )
    assert response.status_code == 404, response.text
    assert response.json()["error"]["code"] == "unknown_image_id"


def test_a_server_without_concepts_says_how_to_enable_them(predictor):
    with TestClient(create_app(ServerSettings.from_flat(warmup=False), predictor)) as client:
        response = client.post(
            "/v1/segment", json={"image": b64(PNG), "model": "sam3", "objects": [CLICK]}
        )
        assert response.status_code == 404, response.text
        error = response.json()["error"]
        assert error["code"] == "concepts_disabled" and "--concepts" in error["message"]
        default = client.post("/v1/segment", json={"image": b64(PNG), "objects": [CLICK]})
        assert default.status_code == 200 and default.json()["model"] != "sam3"
