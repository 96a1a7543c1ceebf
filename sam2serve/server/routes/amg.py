"""POST /v1/amg: automatic mask generation, every object in the image.

The bulk path: one request runs many decoder batches, so it waits in the bulk queue (clicks
on /v1/segment go first, AMG yields to them at its checkpoints) and each client may hold
only ``max_bulk_jobs_per_client`` of them at once. It needs the pixels, not an image_id:
the point grid is sampled on crops of the image.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response

from sam2serve.engine.amg import MaskGenerator, MaskRecord, finite_or_none
from sam2serve.server import schemas
from sam2serve.server.answers import json_answer
from sam2serve.server.batching import JobContext
from sam2serve.server.dependencies import LimitsDep, PredictorDep, ServiceDep
from sam2serve.server.prompts import amg_params
from sam2serve.server.request_body import require_image
from sam2serve.server.routes.common import (
    body_doc,
    client_address,
    format_segmentations,
    guarded,
    image_fields,
    read_body,
    v1_router,
)
from sam2serve.server.service import RequestClock

router = v1_router()


@router.post(
    "/amg",
    response_model=schemas.AMGResponse,
    summary="Automatic mask generation: segment everything in the image",
    openapi_extra=body_doc(schemas.AMGRequest),
)
async def amg(
    request: Request, service: ServiceDep, limits: LimitsDep, predictor: PredictorDep
) -> Response:
    clock = RequestClock()
    body, data = await read_body(request, schemas.AMGRequest, service)
    upload = require_image(data, "; AMG needs the pixels, not an image_id")
    params = amg_params(body.params, limits)

    async def work() -> Response:
        generator = MaskGenerator(predictor, **params.to_dict())
        pixels, reservation = await service.decode(upload)
        with reservation:  # AMG crops the pixels: their bytes stay reserved until it ends
            image = await service.image_from_bytes(upload, clock, pixels)

            def run(context: JobContext) -> list[MaskRecord]:
                return generator.generate(
                    pixels, embedding=image.embedding, progress=lambda done, total: context.check()
                )

            records = await service.run_job("amg", run, clock, bulk=True)
            service.recount(image)  # the decoder may have kept its per-image side with it
        segmentations = await format_segmentations(
            [r["segmentation"] for r in records], body.mask_format, service
        )
        public = {
            k: v for k, v in params.to_dict().items() if k not in schemas.AMG_FIELDS_NOT_IN_API
        }
        fields, timed = image_fields(image, service), clock.timed()
        # Hundreds of masks: built and serialised off the event loop, mask by mask.
        return await json_answer(
            lambda: schemas.AMGResponse(
                **fields, params=public, masks=_records_out(records, segmentations), **timed
            ),
            pieces=("masks",),
        )

    # The slot is taken after the body is read and checked: a bad request gets its 4xx,
    # not a 429, and holds no slot.
    with service.bulk_slot(client_address(request)):
        return await guarded(request, work, service)


def _records_out(
    records: list[dict[str, Any]], segmentations: list[Any]
) -> list[schemas.AMGRecord]:
    """(In a worker thread.) The generator's records with their formatted masks."""
    return [
        schemas.AMGRecord(
            **{
                **record,
                "segmentation": segmentation,
                "stability_score": finite_or_none(record["stability_score"]),
            }
        )
        for record, segmentation in zip(records, segmentations, strict=True)
    ]
