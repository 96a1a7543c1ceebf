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
from sam2serve.engine.rle import area_from_rle
from sam2serve.server import schemas
from sam2serve.server.batching import JobContext
from sam2serve.server.dependencies import PredictorDep, ServiceDep, SettingsDep
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
    json_response,
    read_body,
    v1_router,
)
from sam2serve.server.service import ImageState, RequestClock, Service

router = v1_router()


@router.post(
    "/segment",
    response_model=schemas.SegmentResponse,
    summary="Masks for point / box / mask prompts, all objects in one decoder call",
    openapi_extra=body_doc(schemas.SegmentRequest),
)
async def segment(
    request: Request, service: ServiceDep, settings: SettingsDep, predictor: PredictorDep
) -> Response:
    clock = RequestClock()
    body, data = await read_body(request, schemas.SegmentRequest, service)
    check_prompt_counts(body, settings)
    prompts = [Prompt.from_api(obj) for obj in body.objects]  # valid: the schema checked

    async def work() -> Response:
        image = await service.resolve_image(
            data, body.image_id, clock, check_size=lambda size: check_objects_inside(prompts, size)
        )
        refined = [
            prompt
            if obj.mask_id is None
            else prompt.with_mask(
                service.stored_mask(obj.mask_id, image.key, f"objects[{i}].mask_id")
            )
            for i, (prompt, obj) in enumerate(zip(prompts, body.objects, strict=True))
        ]

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
        objects = await _objects_out(decoded, image, body.mask_format, service)
        return json_response(
            schemas.SegmentResponse(
                **image_fields(image, service), objects=objects, **clock.timed()
            )
        )

    return await guarded(request, work, service)


async def _objects_out(
    decoded: DecodedMasks, image: ImageState, mask_format: str, service: Service
) -> list[schemas.ObjectOut]:
    """One ObjectOut per prompt object; each mask's logits are stored under its mask_id."""
    flat_rles = [rle for rles in decoded.rles for rle in rles]
    segmentations = iter(await format_segmentations(flat_rles, mask_format, service))
    objects = []
    for i, rles in enumerate(decoded.rles):
        masks = []
        for c, rle in enumerate(rles):
            mask_id = service.store_mask(image.key, decoded.low_res_logits[i][c : c + 1])
            masks.append(
                schemas.MaskOut(
                    mask_id=mask_id,
                    score=decoded.scores[i][c],
                    bbox=decoded.boxes[i][c],
                    area=area_from_rle(rle),
                    segmentation=next(segmentations),
                )
            )
        objects.append(schemas.ObjectOut(masks=masks))
    return objects
