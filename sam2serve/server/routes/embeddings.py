"""POST /v1/embeddings: encode an image once, so later clicks on it cost only the decoder.

An annotation tool uploads the image here when it opens it, then sends prompts by
``image_id`` (the content hash) to /v1/segment. Concurrent uploads of the same image share
one encode; uploads of different images land in one encoder batch.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from sam2serve.server import schemas
from sam2serve.server.dependencies import ServiceDep
from sam2serve.server.request_body import require_image
from sam2serve.server.routes.common import (
    body_doc,
    guarded,
    image_fields,
    json_response,
    read_body,
    v1_router,
)
from sam2serve.server.service import RequestClock

router = v1_router()


@router.post(
    "/embeddings",
    response_model=schemas.EmbeddingResponse,
    summary="Encode an image and cache its embedding",
    openapi_extra=body_doc(schemas.EmbeddingRequest),
)
async def embeddings(request: Request, service: ServiceDep) -> Response:
    clock = RequestClock()
    _, data = await read_body(request, schemas.EmbeddingRequest, service)
    image_bytes = require_image(data)

    async def work() -> Response:
        image = await service.image_from_bytes(image_bytes, clock)
        return json_response(
            schemas.EmbeddingResponse(**image_fields(image, service), **clock.timed())
        )

    return await guarded(request, work, service)
