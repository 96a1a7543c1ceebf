"""POST /v1/concepts: every instance of a noun phrase or exemplar box (SAM 3), on a server
started with ``--concepts``.

The image comes in the body or by ``image_id`` (the content hash every image route uses;
here it names the image's cached SAM 3 encoding). The phrase and box counts are checked
against the server's limits before any image work, the boxes against the image once its
size is known; the encode (on a cache miss) and the detection of every phrase are jobs on
the service's model worker (:mod:`sam2serve.server.concept_images`). A server without the
concept model answers 404 ``concepts_disabled``, naming how to enable it.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypedDict

from fastapi import Request
from fastapi.responses import Response

from sam2serve.concepts.engine import ExemplarBox
from sam2serve.concepts.phrases import check_box
from sam2serve.engine.coco import coco_bbox
from sam2serve.engine.rle import area_from_rle
from sam2serve.server import concept_schemas as cs
from sam2serve.server import schemas
from sam2serve.server.answers import json_answer
from sam2serve.server.concept_images import ConceptImage, ConceptImages, DetectedConcept
from sam2serve.server.dependencies import LimitsDep, ServiceDep
from sam2serve.server.errors import ApiError
from sam2serve.server.routes.common import (
    body_doc,
    format_segmentations,
    guarded,
    read_body,
    v1_router,
)
from sam2serve.server.service import RequestClock, Service
from sam2serve.server.settings_groups import ConceptSettings
from sam2serve.server.uploads import probe_image

router = v1_router()


def concepts_of(service: Service) -> ConceptImages:
    """The service's concept model, or 404 when the server was started without it."""
    if service.concepts is None:
        raise ApiError(
            404,
            "concepts_disabled",
            "this server has no concept model: start it with 'sam2serve serve --concepts' "
            "(SAM 3's weights from --sam3-weights or 'sam2serve download --model sam3'; "
            "random with --random-weights) to answer /v1/concepts",
        )
    return service.concepts


def check_concept_counts(body: cs.ConceptsRequest, limits: ConceptSettings) -> None:
    """The server's limits on a request, before any image work (the schema's bounds are
    the API's; these may be lower)."""
    for field, count, limit, name in (
        ("phrases", len(body.phrases), limits.max_concept_phrases, "max_concept_phrases"),
        ("boxes", len(body.boxes), limits.max_concept_boxes, "max_concept_boxes"),
        (
            "max_instances",
            body.max_instances or 0,
            limits.max_concept_instances,
            "max_concept_instances",
        ),
    ):
        if count > limit:
            raise ApiError(
                422,
                "too_many_prompts",
                f"{field}: {count}; at most {limit} per request on this server ({name})",
            )


def exemplar_boxes(body: cs.ConceptPrompts) -> list[ExemplarBox]:
    """The request's exemplar boxes as the engine takes them (the schema checked each has
    four corners)."""
    out = []
    for exemplar in body.boxes:
        x0, y0, x1, y1 = exemplar.box
        out.append(ExemplarBox((x0, y0, x1, y1), exemplar.positive))
    return out


def check_boxes_inside(body: cs.ConceptPrompts, size: tuple[int, int]) -> None:
    """422 naming the first exemplar box that is not inside the image (the rule of
    :func:`sam2serve.concepts.phrases.check_box`, the command line's)."""
    for i, exemplar in enumerate(body.boxes):
        try:
            check_box(exemplar.box, size)
        except ValueError as exc:
            raise ApiError(422, "invalid_request", f"boxes[{i}].box: {exc}") from None


@router.post(
    "/concepts",
    response_model=cs.ConceptsResponse,
    summary="Every instance of noun phrases / exemplar boxes (SAM 3; serve --concepts)",
    openapi_extra=body_doc(cs.ConceptsRequest),
    responses={
        404: {
            "model": schemas.ErrorResponse,
            "description": "Unknown image_id ('unknown_image_id'), or the server runs "
            "without the concept model ('concepts_disabled': start it with --concepts)",
        },
        413: {
            "model": schemas.ErrorResponse,
            "description": "Upload or image too large, or the masks asked for would not fit "
            "in max_decoded_bytes_in_flight",
        },
    },
)
async def concepts(request: Request, service: ServiceDep, limits: LimitsDep) -> Response:
    clock = RequestClock()
    model = concepts_of(service)
    body, data = await read_body(request, cs.ConceptsRequest, service)
    body = body.with_server_default(model.concepts.spec.random_weights)
    check_concept_counts(body, model.limits)
    boxes = exemplar_boxes(body)
    phrases = body.prompt_phrases()
    max_instances = body.max_instances or model.limits.max_concept_instances

    def check_size(size: tuple[int, int]) -> None:  # before the image is encoded
        check_boxes_inside(body, size)
        model.check_mask_budget(len(phrases), max_instances, size)

    async def work() -> Response:
        if data:
            # From the header, nothing decoded (413 past max_pixels): masks that could never
            # fit are refused before a decode (width x height: the EXIF turn cannot change
            # it; boxes are checked against the turned image, after the decode).
            width, height = await asyncio.to_thread(probe_image, data, limits.max_pixels)
            if width and height:
                model.check_mask_budget(len(phrases), max_instances, (height, width))
        image = await model.resolve(data, body.image_id, clock, check_size=check_size)
        detected = await model.detect(
            image, phrases, boxes, body.score_thresh, max_instances, clock
        )
        flat = [rle for concept in detected for rle in concept.rles]
        segmentations = await format_segmentations(flat, body.mask_format, service)
        fields, timed = _image_fields(image, model), clock.timed()
        # Thousands of masks are megabytes of JSON: built and serialised off the loop.
        return await json_answer(
            lambda: cs.ConceptsResponse(
                **fields, concepts=_concepts_out(detected, segmentations), **timed
            ),
            pieces=("concepts", "instances"),
        )

    return await guarded(request, work, service)


class _ImageFields(TypedDict):
    image_id: str
    width: int
    height: int
    model: str
    cached: bool


def _image_fields(image: ConceptImage, model: ConceptImages) -> _ImageFields:
    height, width = image.size
    return {
        "image_id": image.key.image_id,
        "width": width,
        "height": height,
        "model": model.model_name,
        "cached": image.cached,
    }


def _concepts_out(detected: list[DetectedConcept], formatted: list[Any]) -> list[cs.ConceptOut]:
    """(In a worker thread.) Each phrase's instances, ``formatted`` their segmentations in
    order."""
    segmentations = iter(formatted)
    return [
        cs.ConceptOut(
            phrase=concept.phrase,
            instances=[
                cs.InstanceOut(
                    score=score,
                    bbox=coco_bbox(rle),
                    area=area_from_rle(rle),
                    segmentation=next(segmentations),
                )
                for score, rle in zip(concept.scores, concept.rles, strict=True)
            ],
        )
        for concept in detected
    ]
