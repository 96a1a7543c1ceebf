"""What the /v1 routes share: their router's policy, their OpenAPI pieces, and the steps
every request takes (read the body, run the work guarded, describe the image, format masks:
:func:`~sam2serve.server.segmentations.format_segmentations`, handed on from here).

The steps are plain functions of the request and the :class:`Service` they act on, so a
route reads top to bottom as its request's flow and nothing is captured from an app.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import BaseModel

from sam2serve.server import schemas
from sam2serve.server.auth import require_api_key
from sam2serve.server.request_body import (
    IMAGE_PART,
    JSON_MEDIA,
    MAX_PART_BYTES,
    MULTIPART_MEDIA,
    REQUEST_PART,
    ModelT,
    parse_body,
)
from sam2serve.server.request_guard import run_guarded
from sam2serve.server.segmentations import format_segmentations
from sam2serve.server.service import ImageState, Service

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": schemas.ErrorResponse, "description": description}
    for status, description in {
        400: "Malformed body, JSON (or nested too deep), base64 or image",
        401: "Missing or wrong API key",
        404: "Unknown image_id or mask_id",
        408: "The body did not arrive within body_timeout_s",
        413: "Upload, image or JSON structure too large",
        415: "Unsupported Content-Type",
        422: "A field has a bad value",
        429: "This client already has max_bulk_jobs_per_client AMG requests (see Retry-After)",
        503: "Overloaded, timed out or not ready (see Retry-After)",
    }.items()
}


def v1_router() -> APIRouter:
    """A router of /v1 endpoints: behind the API key, documenting every error response.

    The prefix is the router's own (the app includes it without one), so the paths of its
    routes are the app's paths: the metric labels are read from them."""
    return APIRouter(
        prefix="/v1", dependencies=[Depends(require_api_key)], responses=ERROR_RESPONSES
    )


def body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI requestBody for an endpoint taking JSON or multipart (read by hand, so
    FastAPI cannot document it itself)."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    multipart = {
        "type": "object",
        "properties": {
            IMAGE_PART: {"type": "string", "format": "binary", "description": "The image file."},
            REQUEST_PART: {
                "type": "string",
                "maxLength": MAX_PART_BYTES,
                "description": f"JSON of the other fields of {model.__name__} (without 'image').",
            },
        },
    }
    return {
        "requestBody": {
            "required": True,
            "content": {JSON_MEDIA: {"schema": ref}, MULTIPART_MEDIA: {"schema": multipart}},
        }
    }


def json_body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI requestBody for an endpoint taking a JSON body it reads by hand."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {JSON_MEDIA: {"schema": ref}}}}


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON schema with its definitions inlined: the body is read by hand, so
    FastAPI does not add its models to the document's components."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return inline(
                    {
                        **definitions[ref.removeprefix("#/$defs/")],
                        **{k: v for k, v in node.items() if k != "$ref"},
                    }
                )
            return {key: inline(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inline(item) for item in node]
        return node

    return inline(schema)


def json_response(model: BaseModel, status: int = 200) -> Response:
    """``model`` as JSON, serialised by pydantic once (no second validation by FastAPI)."""
    return Response(model.model_dump_json(), status_code=status, media_type=JSON_MEDIA)


def client_address(request: Request) -> str:
    """Who sent a request, for per-client limits: the peer's address."""
    return request.client.host if request.client is not None else "unknown"


async def read_body(
    request: Request, model: type[ModelT], service: Service
) -> tuple[ModelT, bytes | None]:
    """The request model and the image bytes (if any), within the app's body limits."""
    started = time.perf_counter()
    parsed = await parse_body(request, model, service.limits)
    service.metrics.stage_latency.labels("read_body").observe(time.perf_counter() - started)
    return parsed


def guarded(
    request: Request, work: Callable[[], Awaitable[Response]], service: Service
) -> Awaitable[Response]:
    """The work after the body: within request_timeout_s, cancelled if the client goes."""
    return run_guarded(request, work, service.limits.request_timeout_s, service.retry_headers)


def image_fields(image: ImageState, service: Service) -> dict[str, Any]:
    """The fields every response has about its image."""
    height, width = image.size
    return {
        "image_id": image.key.image_id,
        "width": width,
        "height": height,
        "model": service.model_name,
        "cached": image.cached,
    }


__all__ = [
    "ERROR_RESPONSES",
    "body_doc",
    "client_address",
    "format_segmentations",
    "guarded",
    "image_fields",
    "inline_schema",
    "json_body_doc",
    "json_response",
    "read_body",
    "v1_router",
]
