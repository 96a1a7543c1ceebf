"""POST /v1/segment with ``"model": "sam3"``: the same prompts answered by SAM 3's tracker
heads over the image's SAM 3 encoding (:mod:`sam2serve.concepts.interactive`), on a server
started with ``--concepts``.

The image is resolved as /v1/concepts resolves it (the concept cache, keyed by the same
content hash: an ``image_id`` from /v1/concepts refines its instances without a new
encode), the prompts are decoded as SAM 2.1's (:func:`~sam2serve.server.prompts.decode_objects`,
one model job), and each mask's low-res logits are kept under a ``mask_id`` for SAM 3's
next refinement of the same image. The answer has /v1/segment's shape; its ``model`` is SAM
3's name (``sam3``).
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response

from sam2serve.engine.prompts import Prompt, PromptError
from sam2serve.server import schemas
from sam2serve.server.answers import json_answer
from sam2serve.server.batching import JobContext
from sam2serve.server.errors import ApiError
from sam2serve.server.prompts import DecodedMasks, check_objects_inside, decode_objects
from sam2serve.server.routes.common import format_segmentations, guarded
from sam2serve.server.routes.concepts import concepts_of
from sam2serve.server.segmentations import objects_out, store_masks, with_stored_masks
from sam2serve.server.service import RequestClock, Service


async def segment_sam3(
    request: Request,
    body: schemas.SegmentRequest,
    data: bytes | None,
    prompts: list[Prompt],
    service: Service,
    clock: RequestClock,
) -> Response:
    """/v1/segment's answer from SAM 3 (404 ``concepts_disabled`` without it)."""
    model = concepts_of(service)
    if model.concepts.tracker is None:
        raise ApiError(
            404,
            "concepts_disabled",
            "this server's SAM 3 has no tracker heads: 'model': 'sam3' needs them",
        )
    predictor = model.concepts.interactive

    async def work() -> Response:
        image = await model.resolve(
            data, body.image_id, clock, check_size=lambda size: check_objects_inside(prompts, size)
        )
        refined = with_stored_masks(prompts, body.objects, image.key, service)
        side = image.encoding.tracker
        assert side is not None  # the model has tracker heads: every encoding has its side

        def run(context: JobContext) -> DecodedMasks:
            return decode_objects(
                predictor,
                side,
                refined,
                body.multimask_output,
                check=context.check,
                best_only=body.best_mask_only,
            )

        try:
            decoded = await service.run_job("decode", run, clock)
        except PromptError as exc:  # the checks above should leave none
            raise ApiError(422, "invalid_request", f"objects: {exc}") from None
        model.cache.recount(image.key)  # the fast decoder keeps its per-image side with it
        flat_rles = [rle for rles in decoded.rles for rle in rles]
        segmentations = await format_segmentations(flat_rles, body.mask_format, service)
        mask_ids = store_masks(decoded, image.key, service)
        height, width = image.size
        fields: dict[str, Any] = {
            "image_id": image.key.image_id,
            "width": width,
            "height": height,
            "model": model.model_name,
            "cached": image.cached,
        }
        timed = clock.timed()
        return await json_answer(
            lambda: schemas.SegmentResponse(
                **fields, objects=objects_out(decoded, mask_ids, segmentations), **timed
            ),
            pieces=("objects", "masks"),
        )

    return await guarded(request, work, service)
