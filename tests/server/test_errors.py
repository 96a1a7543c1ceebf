"""Every client error is a 4xx in the one shape, names what was wrong and what is
accepted, and leaves the server up with its cache (the last test checks both)."""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pytest
from server_support import b64, error_of, metric, png_bytes, scrape

from sam2serve.server.settings import MiB

POINT = {"points": [{"x": 10, "y": 10}]}


@pytest.fixture(scope="module")
def client(main_server):
    with main_server.client() as client:
        yield client


def fails(response, status: int, code: str, *words: str) -> str:
    assert response.status_code == status, response.text
    error = error_of(response)
    assert error["code"] == code, error
    for word in words:
        assert word in error["message"], (word, error["message"])
    return error["message"]


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height, with almost no pixel data: a
    decompression bomb as far as the header goes."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + chunk(b"IEND", b"")
    )


# --------------------------------------------------------------------------- bodies


def test_unsupported_content_type(client):
    response = client.post("/v1/embeddings", content=b"abc", headers={"content-type": "text/plain"})
    fails(
        response,
        415,
        "unsupported_media_type",
        "text/plain",
        "application/json",
        "multipart/form-data",
    )


def test_invalid_json(client):
    response = client.post(
        "/v1/segment", content=b'{"objects": [', headers={"content-type": "application/json"}
    )
    fails(response, 400, "invalid_json", "not valid JSON")


def test_body_not_an_object(client):
    response = client.post("/v1/segment", json=[1, 2])
    fails(response, 422, "invalid_request")


def test_missing_image(client):
    fails(client.post("/v1/embeddings", json={}), 422, "invalid_request", "image")


def test_bad_base64(client):
    fails(
        client.post("/v1/embeddings", json={"image": "not base64!"}),
        400,
        "invalid_base64",
        "base64",
    )
    fails(
        client.post("/v1/embeddings", json={"image": "data:image/png,abc"}),
        400,
        "invalid_base64",
        "data URL",
    )


def test_not_an_image(client):
    fails(
        client.post("/v1/embeddings", json={"image": b64(b"hello, world")}),
        400,
        "invalid_image",
        "not a readable image",
        "accepted: JPEG, PNG",
    )
    message = fails(
        client.post("/v1/embeddings", files={"image": ("x.png", b"GIF89a")}), 400, "invalid_image"
    )
    assert "BytesIO" not in message


def test_truncated_image(client, photos):
    truncated = photos["rocket"][: len(photos["rocket"]) // 2]
    fails(client.post("/v1/embeddings", json={"image": b64(truncated)}), 400, "invalid_image")


def test_multipart_mistakes(client, photos):
    fails(
        client.post("/v1/embeddings", files={"file": ("x.png", photos["rocket"])}),
        400,
        "invalid_multipart",
        "'file'",
        "'image'",
    )
    fails(
        client.post("/v1/embeddings", files={"image": (None, "text, not a file")}),
        400,
        "invalid_multipart",
        "must be a file",
    )
    response = client.post(
        "/v1/segment", files={"image": ("x.png", photos["rocket"])}, data={"request": "{not json"}
    )
    fails(response, 400, "invalid_json", "'request'")
    response = client.post(
        "/v1/segment",
        files={"image": ("x.png", photos["rocket"])},
        data={"request": json.dumps({"image": "abc", "objects": [POINT]})},
    )
    fails(response, 422, "invalid_request", "file part")


# --------------------------------------------------------------------------- sizes


def test_upload_too_large(client):
    big = np.random.default_rng(0).integers(0, 256, (700, 700, 3), dtype=np.uint8)
    data = png_bytes(big)  # ~1.4 MiB of incompressible noise; the limit is 1 MiB
    assert len(data) > MiB
    fails(
        client.post("/v1/embeddings", json={"image": b64(data)}),
        413,
        "upload_too_large",
        "max_upload_bytes",
    )
    fails(
        client.post("/v1/embeddings", files={"image": ("big.png", data)}), 413, "upload_too_large"
    )


def test_body_over_the_limit_is_refused_before_reading(client):
    body = b"x" * (3 * MiB)  # more than the body limit (4/3 MiB + 1 MiB of JSON)
    response = client.post(
        "/v1/embeddings", content=body, headers={"content-type": "application/json"}
    )
    fails(response, 413, "upload_too_large", "limit")


def test_streamed_body_over_the_limit(client):
    def chunks():
        for _ in range(40):
            yield b"x" * (128 * 1024)  # 5 MiB without a Content-Length

    response = client.post(
        "/v1/embeddings", content=chunks(), headers={"content-type": "application/json"}
    )
    fails(response, 413, "upload_too_large")


def test_too_many_pixels(client):
    wide = png_bytes(np.zeros((500, 1300, 3), dtype=np.uint8))  # 650 000 > 600 000 pixels
    assert len(wide) < MiB
    fails(
        client.post("/v1/embeddings", json={"image": b64(wide)}),
        413,
        "too_many_pixels",
        "1300x500",
        "600000",
    )


def test_decompression_bomb_is_refused_from_the_header(client):
    bomb = png_header_only(100_000, 100_000)  # 10 gigapixels claimed in 100 bytes
    assert len(bomb) < 200
    fails(client.post("/v1/embeddings", json={"image": b64(bomb)}), 413, "too_many_pixels")
    bomb = png_header_only(5_000, 5_000)  # under Pillow's own guard, over ours
    fails(
        client.post("/v1/embeddings", json={"image": b64(bomb)}),
        413,
        "too_many_pixels",
        "5000x5000",
    )


# --------------------------------------------------------------------------- ids


def test_unknown_image_id(client):
    message = fails(
        client.post("/v1/segment", json={"image_id": "ab" * 32, "objects": [POINT]}),
        404,
        "unknown_image_id",
        "send the image",
    )
    assert "ab" * 32 in message


def test_malformed_image_id(client):
    fails(
        client.post("/v1/segment", json={"image_id": "../etc/passwd", "objects": [POINT]}),
        422,
        "invalid_request",
        "image_id",
        "64-character hex",
    )


def test_image_and_image_id_together_or_neither(client, photos, chelsea_id):
    fails(
        client.post(
            "/v1/segment",
            json={"image_id": chelsea_id, "image": b64(photos["rocket"]), "objects": [POINT]},
        ),
        422,
        "invalid_request",
        "exactly one",
    )
    fails(
        client.post("/v1/segment", json={"objects": [POINT]}), 422, "invalid_request", "exactly one"
    )


def test_unknown_mask_id(client, chelsea_id):
    response = client.post(
        "/v1/segment", json={"image_id": chelsea_id, "objects": [{**POINT, "mask_id": "nope"}]}
    )
    fails(response, 404, "unknown_mask_id", "objects[0].mask_id")


# --------------------------------------------------------------------------- prompts


@pytest.mark.parametrize(
    ("objects", "field", "hint"),
    [
        ([{"points": [{"x": 10, "y": 10, "label": 5}]}], "objects[0].points[0].label", "0 or 1"),
        ([{"points": [{"x": -1, "y": 10}]}], "objects[0].points[0].x", "greater than or equal"),
        ([{"points": [{"x": "left", "y": 10}]}], "objects[0].points[0].x", "number"),
        ([POINT, {"points": [{"x": 10}]}], "objects[1].points[0].y", "field required"),
        ([{"box": [50, 10, 20, 40]}], "objects[0]", "x0 <= x1"),
        ([{"box": [1, 2, 3]}], "objects[0].box", "at least 4"),
        ([{}], "objects[0]", "at least one point or a box"),
        ([{"pointz": []}], "objects[0].pointz", "accepted: points, box, mask_id"),
        ([], "objects", "at least 1"),
    ],
)
def test_bad_prompt_values_name_the_field(client, chelsea_id, objects, field, hint):
    response = client.post("/v1/segment", json={"image_id": chelsea_id, "objects": objects})
    message = fails(response, 422, "invalid_request", field, hint)
    assert response.json()["error"]["details"][0]["field"] == field, message


def test_nan_coordinates_are_refused(client, chelsea_id):
    body = '{"image_id": "ID", "objects": [{"points": [{"x": NaN, "y": 1}]}]}'
    body = body.replace("ID", chelsea_id)
    response = client.post(
        "/v1/segment", content=body.encode(), headers={"content-type": "application/json"}
    )
    fails(response, 422, "invalid_request", "objects[0].points[0].x", "finite")


def test_prompt_outside_the_image(client, chelsea_id):
    response = client.post(
        "/v1/segment", json={"image_id": chelsea_id, "objects": [{"points": [{"x": 300, "y": 10}]}]}
    )
    fails(response, 422, "invalid_request", "objects[0].points[0]", "256x170", "0 <= x <= 256")
    response = client.post(
        "/v1/segment", json={"image_id": chelsea_id, "objects": [POINT, {"box": [0, 0, 100, 400]}]}
    )
    fails(response, 422, "invalid_request", "objects[1].box", "inside the 256x170 image")


def test_bad_options(client, chelsea_id):
    response = client.post(
        "/v1/segment",
        json={
            "image_id": chelsea_id,
            "objects": [POINT],
            "mask_format": "jpeg",
            "multimask_output": "sometimes",
        },
    )
    message = fails(
        response,
        422,
        "invalid_request",
        "mask_format",
        "'coco_rle'",
        "'polygon'",
        "multimask_output",
    )
    assert len(response.json()["error"]["details"]) == 2, message


def test_too_many_objects_and_points(client, chelsea_id):
    response = client.post("/v1/segment", json={"image_id": chelsea_id, "objects": [POINT] * 9})
    fails(response, 422, "too_many_prompts", "9 objects", "at most 8", "max_objects")
    many = {"points": [{"x": i, "y": i} for i in range(7)]}
    response = client.post("/v1/segment", json={"image_id": chelsea_id, "objects": [many]})
    fails(response, 422, "too_many_prompts", "objects[0].points", "at most 6")


def test_bad_amg_params(client, photos):
    image = b64(photos["chelsea"])

    def amg(**params):
        return client.post("/v1/amg", json={"image": image, "params": params})

    fails(amg(points_per_side=0), 422, "invalid_request", "params.points_per_side", "1")
    fails(amg(crop_overlap_ratio=1.5), 422, "invalid_request", "params.crop_overlap_ratio")
    fails(
        amg(point_per_side=8),
        422,
        "invalid_request",
        "params.point_per_side",
        "accepted: points_per_side",
    )
    fails(amg(output_mode="binary_mask"), 422, "invalid_request", "params.output_mode")
    fails(amg(points_per_side=32), 422, "too_many_prompts", "1024 clicks", "max_amg_points")
    fails(amg(point_grids=[[[0.5, 2.0]]]), 422, "invalid_request", "point_grids")
    fails(client.post("/v1/amg", json={"image_id": "ab" * 32}), 422, "invalid_request", "image_id")


# --------------------------------------------------------------------------- routing


def test_unknown_route_and_method(client):
    fails(client.get("/v2/segment"), 404, "not_found", "/v2/segment", "/docs")
    fails(client.get("/v1/segment"), 405, "method_not_allowed", "GET")


def test_server_stays_up_and_keeps_its_cache(client, chelsea_id):
    """After every error above: no 5xx was counted (but /readyz's 503 while warming up),
    and the cached image still works."""
    samples = scrape(client)
    server_errors = sum(
        v
        for k, v in samples.items()
        if k.startswith("sam2serve_requests_total")
        and 'status="5' in k
        and 'endpoint="/readyz"' not in k
    )
    assert server_errors == 0
    assert metric(samples, "sam2serve_errors_total", code="invalid_request", status="422") > 0
    response = client.post("/v1/segment", json={"image_id": chelsea_id, "objects": [POINT]})
    assert response.status_code == 200
    assert client.get("/healthz").status_code == 200


def test_no_cors_headers_unless_configured(client):
    response = client.options(
        "/v1/segment",
        headers={"origin": "http://example.test", "access-control-request-method": "POST"},
    )
    assert "access-control-allow-origin" not in response.headers
