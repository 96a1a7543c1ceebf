"""Issue 36, item 1: large answers are built and serialised off the event loop.

A /v1/concepts answer of 16 phrases x 20 instances as uncompressed RLE or polygons on a
large image is tens of MB of JSON; built and serialised on the event loop it stalled
/healthz (and every other client) for seconds. Against a real server subprocess whose
SAM 3 finds striped masks (``striped_concepts.py``: the detector is not the subject, the
answer is), /healthz stays within the suite's bound while such answers are made, the
answer is complete and exact, and the server logs no traceback. :func:`dump_json`'s bytes
are pydantic's own.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator

import numpy as np
import pytest
from hostile import JSON, SpawnedServer, StallProbe, dumps
from pycocotools import mask as mask_utils
from server_logs import assert_no_traceback, log_mark
from server_support import png_bytes
from striped_concepts import spawn_striped_server, striped_masks
from surfaces import MAX_STALL_S, SETTLE_S, MiB, confirmed_stall, send

from sam2serve.server import concept_schemas as cs
from sam2serve.server import schemas
from sam2serve.server.answers import dump_json

SIDE = 600  # 50 stripes a column: 30,000 runs a mask, 9.6 M numbers in an RLE answer
PHRASES = [f"thing {i}" for i in range(16)]
QUERIES = 20  # the tiny SAM 3's: instances per phrase
IMAGE = png_bytes(np.full((SIDE, SIDE, 3), 90, np.uint8))
SETTINGS = {
    "max_concept_phrases": 16,
    "max_pixels": 4_000_000,
    "request_timeout_s": 300,
    "max_decoded_bytes_in_flight": 2048 * MiB,
}
WORST: dict[str, float] = {}


@pytest.fixture(scope="module")
def server() -> Iterator[SpawnedServer]:
    live = spawn_striped_server(SETTINGS)
    yield live
    live.stop()
    print(f"\nworst /healthz stall per answer format: {WORST}")


def concepts_request(mask_format: str, phrases: list[str]) -> bytes:
    return dumps(
        {
            "image": base64.b64encode(IMAGE).decode(),
            "phrases": phrases,
            "score_thresh": 0,
            "mask_format": mask_format,
        }
    )


# Polygons of stripes are the costliest answer per mask (a contour the image's width per
# stripe, 25 a mask: 2.5 M numbers for 4 phrases); the RLEs get every phrase.
@pytest.mark.parametrize(
    ("mask_format", "phrases"),
    [("uncompressed_rle", PHRASES), ("coco_rle", PHRASES), ("polygon", PHRASES[:4])],
)
def test_a_large_concept_answer_does_not_stall_the_event_loop(server, mask_format, phrases):
    mark = log_mark(server)
    body = concepts_request(mask_format, phrases)

    def request():
        return send(server, "POST", "/v1/concepts", body, JSON)

    server.collect_garbage(SETTLE_S)
    with StallProbe(server.url) as probe:
        answer = request()
        time.sleep(0.05)
    assert answer.status == 200, answer.text[:500]
    document = json.loads(answer.body)
    assert [c["phrase"] for c in document["concepts"]] == phrases
    expected = striped_masks(QUERIES, SIDE, SIDE)
    for concept in document["concepts"]:
        instances = concept["instances"]
        assert len(instances) == QUERIES
        if mask_format == "uncompressed_rle":  # the masks found, exactly
            for instance, mask in zip(instances, expected, strict=True):
                rle = mask_utils.frPyObjects(instance["segmentation"], SIDE, SIDE)
                np.testing.assert_array_equal(mask_utils.decode(rle).astype(bool), mask)
    stall = confirmed_stall(server, request, probe.worst_s)
    WORST[mask_format] = round(stall, 3)
    assert stall <= MAX_STALL_S, f"/healthz waited {stall:.2f} s while the answer was made"
    assert_no_traceback(server, mark)


def test_dump_json_is_pydantics_own_serialisation():
    rle = {"size": [3, 2], "counts": [1, 2, 3]}
    tricky = 'a "concepts":[] phrase, "instances":[] \\ \u2028 é'
    answer = cs.ConceptsResponse(
        image_id="0" * 64,
        width=2,
        height=3,
        model="sam3-tiny",
        cached=False,
        concepts=[
            cs.ConceptOut(
                phrase=phrase,
                instances=[
                    cs.InstanceOut(score=0.5, bbox=[0, 0, 1, 1], area=3, segmentation=seg)
                    for seg in (rle, [[0.0, 0.0, 1.0, 0.0, 1.0, 1.0]], "rle-string")
                ],
            )
            for phrase in (tricky, "cat")
        ]
        + [cs.ConceptOut(phrase="nothing", instances=[])],
        inference_ms=1.5,
        queue_ms=0.0,
    )
    assert dump_json(answer, ("concepts", "instances")) == answer.model_dump_json()
    assert dump_json(answer, ("concepts",)) == answer.model_dump_json()
    empty = answer.model_copy(update={"concepts": []})
    assert dump_json(empty, ("concepts", "instances")) == empty.model_dump_json()
    segment = schemas.SegmentResponse(
        image_id="1" * 64,
        width=2,
        height=3,
        model="tiny",
        cached=True,
        objects=[
            schemas.ObjectOut(
                masks=[
                    schemas.MaskOut(
                        mask_id="m", score=0.1, bbox=[0, 0, 1, 1], area=3, segmentation=rle
                    )
                ]
            )
        ],
        inference_ms=1.0,
        queue_ms=2.0,
    )
    assert dump_json(segment, ("objects", "masks")) == segment.model_dump_json()
