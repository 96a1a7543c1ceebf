"""Every endpoint of a real server (uvicorn on 127.0.0.1, tiny model, random weights).

Answers are checked against independent computations: the library's own predictor and
mask generator on the very embedding the server cached, pycocotools for COCO RLE, PIL for
the PNG masks.
"""

from __future__ import annotations

import base64
import io
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as mask_utils
from server_support import b64, error_of, metric, scrape, sha256

from sam2serve.engine.amg import MaskGenerator
from sam2serve.engine.masks import batched_mask_to_box, box_xyxy_to_xywh
from sam2serve.engine.rle import rle_to_mask

CHELSEA_SIZE = (170, 256)  # (h, w) of chelsea downscaled to a 256 px longer side


@pytest.fixture(scope="module")
def client(main_server):
    with main_server.client() as client:
        yield client


def cached_embedding(server, image_id: str):
    return server.service.cache.get(server.service.key_for(image_id))


# --------------------------------------------------------------------------- health


def test_healthz_and_readyz(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    body = ready.json()
    assert body["status"] == "ready" and body["model"] == "tiny" and body["mode"] == "fast"
    assert body["weights"]["source"] == "random" and body["dtype"] == "float32"


def test_readyz_waits_for_warmup(main_server, client):
    samples = scrape(client)
    assert metric(samples, "sam2serve_ready") == 1
    # The warm-up ran one job on the model worker before ready was reported.
    assert metric(samples, "sam2serve_batch_size_count", kind="warmup") == 1


# --------------------------------------------------------------------------- embeddings


def test_embeddings_issues_content_hash_and_caches(client, photos, chelsea_id):
    assert chelsea_id == sha256(photos["chelsea"])
    before = scrape(client)
    again = client.post(
        "/v1/embeddings", files={"image": ("cat.png", photos["chelsea"], "image/png")}
    )
    after = scrape(client)
    assert again.status_code == 200, again.text
    body = again.json()
    assert body == {
        "image_id": chelsea_id,
        "width": 256,
        "height": 170,
        "model": "tiny",
        "cached": True,
        "inference_ms": 0.0,
        "queue_ms": 0.0,
    }
    # No encoder ran for the second upload; the cache counted a hit.
    encodes = "sam2serve_batch_size_count"
    assert metric(after, encodes, kind="encode") == metric(before, encodes, kind="encode")
    hits = "sam2serve_cache_hits_total"
    assert metric(after, hits, cache="embeddings") == metric(before, hits, cache="embeddings") + 1


def test_data_url_and_urlsafe_base64_are_accepted(client, photos, chelsea_id):
    data_url = "data:image/png;base64," + b64(photos["chelsea"])
    urlsafe = base64.urlsafe_b64encode(photos["chelsea"]).decode()
    for image in (data_url, urlsafe):
        response = client.post("/v1/embeddings", json={"image": image})
        assert response.status_code == 200 and response.json()["image_id"] == chelsea_id


def test_concurrent_uploads_are_batched_and_deduplicated(main_server, photos):
    """Three clients at once: two different images and one repeat. The two distinct images
    go through ONE encoder call; the repeat shares its encode."""
    names = ("astronaut", "coffee", "coffee")
    with main_server.client() as client:
        before = scrape(client)

        def upload(name: str):
            with main_server.client() as own:
                return own.post("/v1/embeddings", json={"image": b64(photos[name])})

        with ThreadPoolExecutor(len(names)) as pool:
            responses = list(pool.map(upload, names))
        after = scrape(client)
    assert [r.status_code for r in responses] == [200, 200, 200]
    bodies = [r.json() for r in responses]
    assert [b["image_id"] for b in bodies] == [sha256(photos[n]) for n in names]
    assert not bodies[0]["cached"] and not bodies[1]["cached"]

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("sam2serve_batch_size_count", kind="encode") == 1  # one encoder call...
    assert delta("sam2serve_batch_size_sum", kind="encode") == 2  # ...of two images
    assert delta("sam2serve_batch_size_bucket", kind="encode", le="1.0") == 0


# --------------------------------------------------------------------------- segment


def segment(client, **body):
    response = client.post("/v1/segment", json=body)
    assert response.status_code == 200, response.text
    return response.json()


OBJECTS = [
    {"points": [{"x": 120, "y": 80}, {"x": 30, "y": 40, "label": 0}, {"x": 200, "y": 100}]},
    {"points": [{"x": 60, "y": 120}]},
    {"box": [20, 30, 150, 160]},
    {"box": [100, 20, 250, 150], "points": [{"x": 180, "y": 90}]},
]


def test_segment_matches_the_library_on_the_cached_embedding(main_server, client, chelsea_id):
    before = scrape(client)
    body = segment(client, image_id=chelsea_id, objects=OBJECTS, mask_format="uncompressed_rle")
    after = scrape(client)
    assert body["image_id"] == chelsea_id and body["cached"] is True
    assert (body["height"], body["width"]) == CHELSEA_SIZE
    assert body["inference_ms"] > 0 and body["queue_ms"] >= 0
    assert [len(o["masks"]) for o in body["objects"]] == [3, 3, 3, 3]
    # All four objects went through one model job.
    decodes = "sam2serve_batch_size_count"
    assert metric(after, decodes, kind="decode") == metric(before, decodes, kind="decode") + 1

    # The library on the same embedding: object 0 (the longest prompt, 3 clicks, so not
    # padded) decoded on its own gives the very same masks.
    predictor = main_server.service.predictor
    embedding = cached_embedding(main_server, chelsea_id)
    alone = predictor.predict(
        embedding, point_coords=[[120, 80], [30, 40], [200, 100]], point_labels=[1, 0, 1]
    )
    for c, mask in enumerate(body["objects"][0]["masks"]):
        assert np.array_equal(rle_to_mask(mask["segmentation"]), alone.masks[0, c].numpy())
        assert mask["score"] == pytest.approx(float(alone.iou_scores[0, c]), abs=1e-5)
        assert mask["area"] == int(alone.masks[0, c].sum())
        expected_box = box_xyxy_to_xywh(batched_mask_to_box(alone.masks[0, c])).tolist()
        assert mask["bbox"] == [float(v) for v in expected_box]
    # Object 2 (a box alone) is padded to 3 tokens with "not a point" labels, exactly as a
    # library user batching these prompts would pad it.
    padded = predictor.predict(
        embedding, point_coords=[[20, 30], [150, 160], [0, 0]], point_labels=[2, 3, -1]
    )
    for c, mask in enumerate(body["objects"][2]["masks"]):
        assert np.array_equal(rle_to_mask(mask["segmentation"]), padded.masks[0, c].numpy())


def test_best_mask_only_answers_the_top_scoring_candidate(client, chelsea_id):
    """A click as the page sends it: of SAM's 3 candidates only the best is upsampled and
    sent, and it is the very candidate (mask, score, box) the full answer ranks first."""
    objects = OBJECTS[:2]
    full = segment(client, image_id=chelsea_id, objects=objects, mask_format="coco_rle")
    best = segment(
        client, image_id=chelsea_id, objects=objects, mask_format="coco_rle", best_mask_only=True
    )
    assert [len(o["masks"]) for o in best["objects"]] == [1, 1]
    for everything, only in zip(full["objects"], best["objects"], strict=True):
        top = max(everything["masks"], key=lambda mask: mask["score"])
        (kept,) = only["masks"]
        assert kept["segmentation"] == top["segmentation"]
        assert (kept["score"], kept["bbox"], kept["area"]) == (
            top["score"],
            top["bbox"],
            top["area"],
        )
    # Without multimask output there is one mask anyway: the flag changes nothing.
    single = segment(
        client, image_id=chelsea_id, objects=objects, multimask_output=False, best_mask_only=True
    )
    assert [len(o["masks"]) for o in single["objects"]] == [1, 1]


def test_segment_with_the_image_itself(client, photos, chelsea_id):
    body = segment(
        client, image=b64(photos["chelsea"]), objects=OBJECTS[:1], multimask_output=False
    )
    assert body["image_id"] == chelsea_id and body["cached"] is True
    assert len(body["objects"][0]["masks"]) == 1


def test_segment_multipart(client, photos, chelsea_id):
    request = {"objects": OBJECTS[1:2], "mask_format": "coco_rle"}
    response = client.post(
        "/v1/segment",
        files={"image": ("cat.png", photos["chelsea"], "image/png")},
        data={"request": json.dumps(request)},
    )
    assert response.status_code == 200, response.text
    assert response.json()["image_id"] == chelsea_id


def test_mask_formats_encode_the_same_masks(client, chelsea_id):
    answers = {
        fmt: segment(client, image_id=chelsea_id, objects=OBJECTS, mask_format=fmt)
        for fmt in ("coco_rle", "uncompressed_rle", "png_base64", "polygon")
    }
    nonempty = 0
    for i in range(len(OBJECTS)):
        for c in range(3):
            masks = {fmt: answer["objects"][i]["masks"][c] for fmt, answer in answers.items()}
            coco = masks["coco_rle"]["segmentation"]
            from_coco = mask_utils.decode(
                {"size": coco["size"], "counts": coco["counts"].encode()}
            ).astype(bool)
            png = base64.b64decode(masks["png_base64"]["segmentation"])
            from_png = np.asarray(Image.open(io.BytesIO(png))).astype(bool)
            uncompressed = masks["uncompressed_rle"]["segmentation"]
            from_rle = mask_utils.decode(
                mask_utils.frPyObjects(uncompressed, *uncompressed["size"])
            ).astype(bool)
            assert from_coco.shape == CHELSEA_SIZE
            assert np.array_equal(from_coco, from_png) and np.array_equal(from_coco, from_rle)
            assert masks["coco_rle"]["area"] == int(from_coco.sum())
            polygons = masks["polygon"]["segmentation"]
            if from_coco.sum() >= 50:
                nonempty += 1
                assert polygons and all(len(p) >= 6 and len(p) % 2 == 0 for p in polygons)
                xs = np.array([v for p in polygons for v in p[0::2]])
                ys = np.array([v for p in polygons for v in p[1::2]])
                assert xs.min() >= -0.5 and xs.max() <= 256 and ys.min() >= -0.5
                assert ys.max() <= 170
                # How well polygons cover clean shapes is checked in test_formats; random
                # weights give speckled masks whose one-pixel islands are tiny diamonds.
    assert nonempty > 0


def test_mask_id_refines_by_reference(client, chelsea_id):
    first = segment(client, image_id=chelsea_id, objects=OBJECTS[:2])
    mask_id = first["objects"][0]["masks"][0]["mask_id"]
    refined = segment(
        client,
        image_id=chelsea_id,
        multimask_output=False,
        objects=[
            {"points": [{"x": 120, "y": 80}], "mask_id": mask_id},
            {"points": [{"x": 60, "y": 120}]},  # without a mask in the same request
        ],
    )
    assert [len(o["masks"]) for o in refined["objects"]] == [1, 1]
    plain = segment(
        client,
        image_id=chelsea_id,
        multimask_output=False,
        objects=[{"points": [{"x": 120, "y": 80}]}],
    )
    # The previous mask changed the answer for the same click.
    assert (
        refined["objects"][0]["masks"][0]["segmentation"]
        != plain["objects"][0]["masks"][0]["segmentation"]
    )


def test_mask_id_from_another_image_is_refused(client, photos, chelsea_id):
    other = segment(
        client, image=b64(photos["astronaut"]), objects=[{"points": [{"x": 10, "y": 10}]}]
    )
    mask_id = other["objects"][0]["masks"][0]["mask_id"]
    response = client.post(
        "/v1/segment",
        json={
            "image_id": chelsea_id,
            "objects": [{"points": [{"x": 10, "y": 10}], "mask_id": mask_id}],
        },
    )
    assert response.status_code == 422
    assert "objects[0].mask_id" in error_of(response)["message"]


# --------------------------------------------------------------------------- AMG


def test_amg_matches_the_library(main_server, client, photos, chelsea_id):
    params = {"points_per_side": 4, "pred_iou_thresh": 0.0, "stability_score_thresh": 0.0}
    response = client.post(
        "/v1/amg",
        files={"image": ("cat.png", photos["chelsea"])},
        data={"request": json.dumps({"params": params})},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["cached"] is True and body["image_id"] == chelsea_id
    assert body["params"]["points_per_side"] == 4 and "output_mode" not in body["params"]
    generator = MaskGenerator(main_server.service.predictor, output_mode="coco_rle", **params)
    pixels = np.asarray(Image.open(io.BytesIO(photos["chelsea"])).convert("RGB"))
    expected = generator.generate(pixels, embedding=cached_embedding(main_server, chelsea_id))
    assert len(body["masks"]) == len(expected) > 0
    for got, want in zip(body["masks"], expected, strict=True):
        assert set(got) == set(want)
        assert got["segmentation"] == want["segmentation"]
        assert got["area"] == want["area"] and got["bbox"] == pytest.approx(want["bbox"])
        assert got["predicted_iou"] == pytest.approx(want["predicted_iou"], abs=1e-5)


def test_amg_json_with_polygons(client, photos):
    response = client.post(
        "/v1/amg",
        json={
            "image": b64(photos["chelsea"]),
            "mask_format": "polygon",
            "params": {"points_per_side": 2, "pred_iou_thresh": 0, "stability_score_thresh": 0},
        },
    )
    assert response.status_code == 200, response.text
    masks = response.json()["masks"]
    assert masks and all(isinstance(m["segmentation"], list) for m in masks)


# --------------------------------------------------------------------------- metrics, docs


def test_metrics_exposition(client, chelsea_id):
    client.post("/v1/segment", json={"image_id": "0" * 64, "objects": OBJECTS[:1]})
    text = client.get("/metrics").text
    for expected in (
        'sam2serve_request_duration_seconds_bucket{endpoint="/v1/segment",le="0.1"}',
        'sam2serve_requests_total{endpoint="/v1/segment",status="404"}',
        'sam2serve_stage_duration_seconds_count{stage="encode"}',
        'sam2serve_stage_duration_seconds_count{stage="decode_masks"}',
        'sam2serve_stage_duration_seconds_count{stage="decode_image"}',
        'sam2serve_stage_duration_seconds_count{stage="format"}',
        'sam2serve_queue_wait_seconds_count{kind="encode"}',
        'sam2serve_batch_size_bucket{kind="encode",le="2.0"}',
        'sam2serve_cache_hits_total{cache="embeddings"}',
        'sam2serve_cache_misses_total{cache="embeddings"}',
        'sam2serve_cache_evictions_total{cache="embeddings"}',
        'sam2serve_cache_bytes{cache="embeddings"}',
        'sam2serve_cache_entries{cache="masks"}',
        "sam2serve_inflight_requests 1.0",  # the scrape itself
        'sam2serve_errors_total{code="unknown_image_id",status="404"}',
        "sam2serve_queue_depth",
        "process_resident_memory_bytes",
        "sam2serve_process_peak_rss_bytes",
        'sam2serve_model_info{backend="custom",device="cpu",dtype="float32",mode="fast",model="tiny"',
    ):
        assert expected in text, expected
    samples = scrape(client)
    # chelsea, astronaut and coffee are cached: 3 entries of 16 MiB each.
    assert metric(samples, "sam2serve_cache_bytes", cache="embeddings") >= 3 * 16 * 2**20


def test_openapi_documents_both_body_forms(client):
    spec = client.get("/openapi.json").json()
    for path in ("/v1/embeddings", "/v1/segment", "/v1/amg"):
        content = spec["paths"][path]["post"]["requestBody"]["content"]
        assert set(content) == {"application/json", "multipart/form-data"}
    schemas = spec["components"]["schemas"]
    for name in (
        "SegmentRequest",
        "ObjectPrompt",
        "Point",
        "AMGOptions",
        "AMGRequest",
        "EmbeddingRequest",
        "SegmentResponse",
        "EmbeddingResponse",
        "AMGResponse",
        "AMGRecord",
        "MaskOut",
        "ErrorResponse",
        "Ready",
    ):
        for field, schema in schemas[name]["properties"].items():
            assert schema.get("description"), (name, field)  # every field is documented
    assert client.get("/docs").status_code == 200


def api_bounds(name: str):
    """The engine's spec of an API parameter with the service's cap on top."""
    from sam2serve.engine.amg_params import PARAM_SPECS
    from sam2serve.server.schemas import AMG_CAPS

    spec = PARAM_SPECS[name]
    return spec.capped(AMG_CAPS[name]) if name in AMG_CAPS else spec


def just_outside(spec) -> list[float]:
    step = 1 if spec.kind == "int" else 1e-3
    values = [spec.low - step] if spec.low is not None else []
    if spec.high is not None:
        values.append(spec.high + step if spec.high_inclusive else spec.high)
    return values


def test_amg_options_are_the_engine_parameters_with_the_service_caps():
    """Names, types, defaults, descriptions and bounds of the schema all come from the
    engine's ParamSpecs; the service only adds its caps."""
    from sam2serve.engine.amg_params import PARAM_SPECS, AMGParams
    from sam2serve.server.schemas import (
        AMG_FIELDS_NOT_IN_API,
        MAX_CROP_LAYERS,
        MAX_GRID_POINTS,
        AMGOptions,
    )

    api = [name for name in PARAM_SPECS if name not in AMG_FIELDS_NOT_IN_API]
    assert list(AMGOptions.model_fields) == api
    schema = AMGOptions.model_json_schema()["properties"]
    for name in api:
        spec, field = api_bounds(name), schema[name]
        assert field["default"] == AMGParams.defaults()[name], name
        assert field["description"] == spec.help[0].upper() + spec.help[1:] + ".", name
        branches = field.get("anyOf", [field])
        assert ({"type": "null"} in branches) == spec.nullable, name
        [value] = [b for b in branches if b != {"type": "null"}]
        if spec.kind == "point_grids":
            assert (value["minItems"], value["maxItems"]) == (1, MAX_CROP_LAYERS + 1)
            value = value["items"]
            assert (value["minItems"], value["maxItems"]) == (1, MAX_GRID_POINTS)
            value = value["items"]
            assert (value["minItems"], value["maxItems"]) == (2, 2)
            value = value["items"]
        kind = "float" if spec.kind == "point_grids" else spec.kind
        assert value["type"] == {"int": "integer", "float": "number", "bool": "boolean"}[kind]
        assert value.get("minimum") == spec.low, name
        upper = "maximum" if spec.high_inclusive else "exclusiveMaximum"
        assert value.get(upper) == spec.high, name
        assert {"maximum", "exclusiveMaximum"} & set(value) <= {upper}, name


def test_a_value_past_a_bound_is_refused_by_the_library_and_the_service(client):
    from pydantic import ValidationError

    from sam2serve.engine.amg_params import PARAM_SPECS, AMGParamError, AMGParams
    from sam2serve.server.schemas import AMG_FIELDS_NOT_IN_API, AMGOptions

    checked = 0
    for name, engine in PARAM_SPECS.items():
        if name in AMG_FIELDS_NOT_IN_API or engine.kind not in ("int", "float"):
            continue
        for value in just_outside(engine):  # the engine's own bounds
            with pytest.raises(AMGParamError, match=rf"^{name} must be .*got {value!r}$"):
                AMGParams(**{name: value})
        for value in just_outside(api_bounds(name)):  # the same, or the service's cap
            with pytest.raises(ValidationError):
                AMGOptions(**{name: value})
            response = client.post("/v1/amg", json={"params": {name: value}})
            assert response.status_code == 422, (name, value, response.text)
            error = error_of(response)
            assert error["code"] == "invalid_request" and f"params.{name}" in error["message"]
            checked += 1
        if api_bounds(name).high is not None and api_bounds(name).high_inclusive:
            AMGOptions(**{name: api_bounds(name).high})  # the bound itself is accepted
    assert checked >= 12
