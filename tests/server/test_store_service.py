"""The service with a persistent store (``settings.store.location``): memory -> store -> encode,
written through, so two services sharing one store answer each other's image_ids with
no encode; damaged entries are re-encoded, other runtimes never served.

Two real servers (uvicorn in threads) stand for two replicas. Service B runs a stub
encoder that counts its calls: "zero encodes in B" is that count.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from server_support import StubEncoderPredictor, b64, error_of

from sam2serve.store.identity import image_id_of

CLICK = {"objects": [{"points": [{"x": 120, "y": 80}, {"x": 30, "y": 40, "label": 0}]}]}


def segment(server, **body):
    with server.client() as client:
        return client.post("/v1/segment", json={**CLICK, **body})


def embed(server, data: bytes):
    with server.client() as client:
        response = client.post("/v1/embeddings", json={"image": b64(data)})
    assert response.status_code == 200, response.text
    return response.json()


def test_b_answers_the_image_id_a_encoded_without_encoding(
    server_factory, predictor, photos, tmp_path
):
    store = str(tmp_path / "store")
    a = server_factory(predictor, store=store)
    b_encoder = StubEncoderPredictor(predictor.model)
    b = server_factory(b_encoder, store=store)

    image_id = embed(a, photos["chelsea"])["image_id"]
    assert image_id == image_id_of(photos["chelsea"])
    from_a = segment(a, image_id=image_id)
    from_b = segment(b, image_id=image_id)  # B never saw the image
    assert from_b.status_code == 200, from_b.text
    assert b_encoder.calls == 0
    masks = [[m["segmentation"] for m in r.json()["objects"][0]["masks"]] for r in (from_a, from_b)]
    assert masks[0] == masks[1]  # float32 entries: the same masks, bit for bit

    # Uploading the image itself to B: from the store too, reported as cached.
    body = embed(b, photos["chelsea"])
    assert body["cached"] is True and b_encoder.calls == 0


def test_a_shared_fsspec_uri_store(server_factory, stub_predictor, predictor, photos):
    store = f"memory://shared-{uuid.uuid4().hex}"
    a = server_factory(stub_predictor, store=store)
    b_encoder = StubEncoderPredictor(predictor.model)
    b = server_factory(b_encoder, store=store)
    image_id = embed(a, photos["coffee"])["image_id"]
    assert stub_predictor.calls == 1
    assert segment(b, image_id=image_id).status_code == 200
    assert b_encoder.calls == 0


def test_a_damaged_entry_is_encoded_again_not_a_crash(
    server_factory, stub_predictor, predictor, photos, tmp_path
):
    store = tmp_path / "store"
    a = server_factory(stub_predictor, store=str(store))
    image_id = embed(a, photos["rocket"])["image_id"]
    [entry] = store.rglob(f"{image_id}.safetensors")
    entry.write_bytes(entry.read_bytes()[:1000])  # truncated

    b_encoder = StubEncoderPredictor(predictor.model)
    b = server_factory(b_encoder, store=str(store))
    missing = segment(b, image_id=image_id)
    assert missing.status_code == 404 and error_of(missing)["code"] == "unknown_image_id"
    body = embed(b, photos["rocket"])
    assert body["cached"] is False and b_encoder.calls == 1  # encoded, written through
    c = server_factory(StubEncoderPredictor(predictor.model), store=str(store))
    assert segment(c, image_id=image_id).status_code == 200  # the entry is whole again
    assert Path(entry).stat().st_size > 16 * 2**20


def test_another_runtime_does_not_read_the_entries(
    server_factory, stub_predictor, predictor, photos, tmp_path
):
    store = str(tmp_path / "store")
    a = server_factory(stub_predictor, store=store)
    image_id = embed(a, photos["astronaut"])["image_id"]
    baseline = server_factory(StubEncoderPredictor(predictor.model), store=store, mode="baseline")
    response = segment(baseline, image_id=image_id)
    assert response.status_code == 404
    assert "or the store" in error_of(response)["message"]
    half = server_factory(StubEncoderPredictor(predictor.model), store=store, store_dtype="float16")
    assert segment(half, image_id=image_id).status_code == 404
