"""POST /v1/segment: masks for point, box and mask prompts, every object in one call.

The interactive path: the image comes by ``image_id`` (cached by /v1/embeddings) or in the
body; prompts are checked against the limits before any model work and against the image
size once it is known; all objects are decoded in one model job. Each mask gets a
``mask_id`` whose low-res logits stay on the server, so a refinement sends the id instead
of the logits.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from sam2serve.engine.prompts import Prompt, PromptError
from sam2serve.server import schemas
from sam2serve.server.answers import json_answer
from sam2serve.server.batching import JobContext
from sam2serve.server.dependencies import LimitsDep, PredictorDep, ServiceDep
from sam2serve.server.errors import ApiError
from sam2serve.server.prompts import (
    DecodedMasks,
    check_objects_inside,
    check_prompt_counts,
    decode_objects,
)
from sam2serve.server.routes.common import (
    body_doc,
    format_segmentations,
    guarded,
    image_fields,
    read_body,
    v1_router,
)
from sam2serve.server.routes.segment_sam3 import segment_sam3
from sam2serve.server.segmentations import (
    objects_out,
    small_answer,
    store_masks,
    with_stored_masks,
)
from sam2serve.server.service import RequestClock

router = v1_router()


@router.post(
    "/segment",
    response_model=schemas.SegmentResponse,
    summary="Masks for point / box / mask prompts, all objects in one decoder call",
    openapi_extra=body_doc(schemas.SegmentRequest),
)
async def segment(
    request: Request, service: ServiceDep, limits: LimitsDep, predictor: PredictorDep
) -> Response:
    clock = RequestClock()
    body, data = await read_body(request, schemas.SegmentRequest, service)
    check_prompt_counts(body, limits)
    prompts = [Prompt.from_api(obj) for obj in body.objects]  # valid: the schema checked
    if body.model == "sam3":  # SAM 3's tracker heads (serve --concepts)
        return await segment_sam3(request, body, data, prompts, service, clock)

    async def work() -> Response:
        image = await service.resolve_image(
            data, body.image_id, clock, check_size=lambda size: check_objects_inside(prompts, size)
        )
        refined = with_stored_masks(prompts, body.objects, image.key, service)

        def run(context: JobContext) -> DecodedMasks:
            return decode_objects(
                predictor,
                image.embedding,
                refined,
                body.multimask_output,
                check=context.check,
                best_only=body.best_mask_only,
            )

        try:
            decoded = await service.run_job("decode", run, clock)
        except PromptError as exc:  # the checks above should leave none
            raise ApiError(422, "invalid_request", f"objects: {exc}") from None
        service.recount(image)  # the decoder may have kept its per-image side with it
        flat_rles = [rle for rles in decoded.rles for rle in rles]
        segmentations = await format_segmentations(flat_rles, body.mask_format, service)
        mask_ids = store_masks(decoded, image.key, service)
        fields, timed = image_fields(image, service), clock.timed()
        # Up to max_objects x 3 masks: built and serialised off the event loop.
        return await json_answer(
            lambda: schemas.SegmentResponse(
                **fields, objects=objects_out(decoded, mask_ids, segmentations), **timed
            ),
            pieces=("objects", "masks"),
            inline=small_answer(flat_rles, body.mask_format),
        )

    return await guarded(request, work, service)
