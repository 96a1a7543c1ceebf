"""The FastAPI app: ``create_app(settings, predictor=None)``.

A thin shell over the engine. A request's body is read on the event loop and bounded
there (size, time, JSON structure); parsing, validation, base64 and image decoding run in
threads, and all model work goes through the model worker
(:class:`~sam2serve.server.batching.ModelWorker`: one thread, batched encodes, bounded
queues, clicks before AMG). After the body, the work runs under
:func:`~sam2serve.server.request_guard.run_guarded`: cancelled when the client hangs up,
503 past ``request_timeout_s``. Embeddings are cached by content hash (:mod:`sam2serve.server.cache`); concurrent
requests for the same uncached image share one encode. Every error a client can cause is
a 4xx in the one error shape of :mod:`sam2serve.server.errors`, and leaves the server and
its caches as they were.

Endpoints: POST /v1/embeddings, /v1/segment, /v1/amg; GET /healthz, /readyz, /metrics;
OpenAPI at /docs. Request bodies are JSON (the image base64) or multipart/form-data (the
image as a file part named ``image``, the other fields as JSON in a part named
``request``).

This module holds the routes and their OpenAPI documentation; the parts they use live in
service.py (the request flow: caches, shared encodes, model jobs), request_body.py and
uploads.py (reading the body and the image), prompts.py (prompt checks and decoding),
auth.py (the API key) and body_limit.py (the body size limit).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from fastapi.routing import APIRoute
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from sam2serve.engine.amg import MaskGenerator, finite_or_none
from sam2serve.engine.predictor import Predictor, PromptError
from sam2serve.engine.rle import Rle, area_from_rle
from sam2serve.server import schemas
from sam2serve.server.api_docs import install_offline_docs
from sam2serve.server.auth import require_api_key
from sam2serve.server.batching import JobContext
from sam2serve.server.body_limit import BodyLimitMiddleware
from sam2serve.server.errors import ApiError, install_error_handlers
from sam2serve.server.metrics import RequestMetricsMiddleware
from sam2serve.server.prompts import (
    DecodedMasks,
    amg_params,
    check_prompt_bounds,
    check_prompt_counts,
    decode_objects,
)
from sam2serve.server.request_body import (
    IMAGE_PART,
    JSON_MEDIA,
    MULTIPART_MEDIA,
    REQUEST_PART,
    ModelT,
    parse_body,
    require_image,
)
from sam2serve.server.request_guard import run_guarded
from sam2serve.server.service import ImageState, RequestClock, Service
from sam2serve.server.settings import ServerSettings


def client_address(request: Request) -> str:
    """Who sent a request, for per-client limits: the peer's address."""
    return request.client.host if request.client is not None else "unknown"


def _json(model: BaseModel, status: int = 200) -> Response:
    return Response(model.model_dump_json(), status_code=status, media_type=JSON_MEDIA)


def _body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI requestBody for an endpoint taking JSON or multipart."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    multipart = {
        "type": "object",
        "properties": {
            IMAGE_PART: {"type": "string", "format": "binary", "description": "The image file."},
            REQUEST_PART: {
                "type": "string",
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


def create_app(settings: ServerSettings, predictor: Predictor | None = None) -> FastAPI:
    """The app for ``settings``; loads the model unless a ``predictor`` is given."""
    if predictor is None:
        from sam2serve.runtime.build import build_predictor

        predictor = build_predictor(settings.runtime_spec(), settings.weights_source())
    service = Service(settings, predictor)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(
        title="sam2serve",
        summary="Segment Anything 2 on images over HTTP: embeddings, prompts, AMG.",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,  # served from the package's own assets (offline), below
        redoc_url=None,
    )
    install_offline_docs(app)
    app.state.service = service
    install_error_handlers(
        app,
        service.metrics.observe_error,
        on_disconnect=lambda path, stage: service.metrics.observe_disconnect(
            path, stage, endpoints
        ),
    )
    app.add_middleware(
        BodyLimitMiddleware,
        limit=settings.max_body_bytes,
        timeout_s=settings.body_timeout_s,
        observe=service.metrics.observe_error,
    )
    # Metric labels are the app's own routes, filled in once they are defined (below);
    # Starlette builds the middleware at the first request, after that.
    endpoints: set[str] = set()
    app.add_middleware(RequestMetricsMiddleware, metrics=service.metrics, endpoints=endpoints)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "X-API-Key", "Content-Type"],
        )

    auth = Depends(require_api_key)
    v1 = APIRouter(prefix="/v1", dependencies=[auth], responses=ERROR_RESPONSES)

    def guarded(request: Request, work: Callable[[], Awaitable[Response]]) -> Awaitable[Response]:
        """The work after the body: within request_timeout_s, cancelled if the client goes."""
        return run_guarded(request, work, settings.request_timeout_s, service.retry_headers)

    async def read(request: Request, model: type[ModelT]) -> tuple[ModelT, bytes | None]:
        started = time.perf_counter()
        parsed = await parse_body(request, model, settings)
        service.metrics.stage_latency.labels("read_body").observe(time.perf_counter() - started)
        return parsed

    def image_fields(image: ImageState) -> dict[str, Any]:
        height, width = image.size
        return {
            "image_id": image.key.image_id,
            "width": width,
            "height": height,
            "model": service.model_name,
            "cached": image.cached,
        }

    async def formatted(rles: list[Rle], mask_format: str) -> list[Any]:
        started = time.perf_counter()
        out = await asyncio.to_thread(
            lambda: [schemas.encode_segmentation(rle, mask_format) for rle in rles]
        )
        service.metrics.stage_latency.labels("format").observe(time.perf_counter() - started)
        return out

    @v1.post(
        "/embeddings",
        response_model=schemas.EmbeddingResponse,
        summary="Encode an image and cache its embedding",
        openapi_extra=_body_doc(schemas.EmbeddingRequest),
    )
    async def embeddings(request: Request) -> Response:
        clock = RequestClock()
        _, data = await read(request, schemas.EmbeddingRequest)
        require_image(data)

        async def work() -> Response:
            image = await service.image_from_bytes(data, clock)
            return _json(schemas.EmbeddingResponse(**image_fields(image), **clock.timed()))

        return await guarded(request, work)

    @v1.post(
        "/segment",
        response_model=schemas.SegmentResponse,
        summary="Masks for point / box / mask prompts, all objects in one decoder call",
        openapi_extra=_body_doc(schemas.SegmentRequest),
    )
    async def segment(request: Request) -> Response:
        clock = RequestClock()
        body, data = await read(request, schemas.SegmentRequest)
        check_prompt_counts(body, settings)

        async def work() -> Response:
            image = await service.resolve_image(
                data, body.image_id, clock, check_size=lambda size: check_prompt_bounds(body, size)
            )
            mask_inputs = [
                None
                if obj.mask_id is None
                else service.stored_mask(obj.mask_id, image.key, f"objects[{i}].mask_id")
                for i, obj in enumerate(body.objects)
            ]

            def run(context: JobContext) -> DecodedMasks:
                return decode_objects(
                    predictor,
                    image.embedding,
                    body.objects,
                    mask_inputs,
                    body.multimask_output,
                    check=context.check,
                )

            try:
                decoded = await service.run_job("decode", run, clock)
            except PromptError as exc:  # the checks above should leave none
                raise ApiError(422, "invalid_request", f"objects: {exc}") from None
            flat_rles = [rle for rles in decoded.rles for rle in rles]
            segmentations = iter(await formatted(flat_rles, body.mask_format))
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
            return _json(
                schemas.SegmentResponse(**image_fields(image), objects=objects, **clock.timed())
            )

        return await guarded(request, work)

    @v1.post(
        "/amg",
        response_model=schemas.AMGResponse,
        summary="Automatic mask generation: segment everything in the image",
        openapi_extra=_body_doc(schemas.AMGRequest),
    )
    async def amg(request: Request) -> Response:
        clock = RequestClock()
        body, data = await read(request, schemas.AMGRequest)
        require_image(data, "; AMG needs the pixels, not an image_id")
        params = amg_params(body.params, settings)

        async def work() -> Response:
            generator = MaskGenerator(predictor, **params.to_dict())
            pixels = await service.decode(data)
            image = await service.image_from_bytes(data, clock, pixels)

            def run(context: JobContext) -> list[dict[str, Any]]:
                return generator.generate(
                    pixels, embedding=image.embedding, progress=lambda done, total: context.check()
                )

            records = await service.run_job("amg", run, clock, bulk=True)
            segmentations = await formatted([r["segmentation"] for r in records], body.mask_format)
            masks = [
                schemas.AMGRecord(
                    **{
                        **record,
                        "segmentation": segmentation,
                        "stability_score": finite_or_none(record["stability_score"]),
                    }
                )
                for record, segmentation in zip(records, segmentations, strict=True)
            ]
            public = {
                k: v for k, v in params.to_dict().items() if k not in schemas.AMG_FIELDS_NOT_IN_API
            }
            return _json(
                schemas.AMGResponse(
                    **image_fields(image), params=public, masks=masks, **clock.timed()
                )
            )

        with service.bulk_slot(client_address(request)):
            return await guarded(request, work)

    app.include_router(v1)

    @app.get("/healthz", response_model=schemas.Health, summary="The process is alive")
    async def healthz() -> schemas.Health:
        return schemas.Health()

    @app.get(
        "/readyz",
        response_model=schemas.Ready,
        responses={503: {"model": schemas.ErrorResponse, "description": "Not warm yet"}},
        summary="The model is loaded and warm",
    )
    async def readyz() -> schemas.Ready:
        if not service.ready:
            raise ApiError(
                503,
                "not_ready",
                "the model is warming up; retry shortly",
                headers={"Retry-After": "1"},
            )
        return schemas.Ready(
            model=service.model_name,
            mode=settings.mode,
            backend=service.backend,
            device=str(predictor.device),
            dtype=service.dtype_name,
            weights=service.weights,
        )

    @app.get(
        "/metrics",
        dependencies=[auth],
        summary="Prometheus metrics",
        response_class=Response,
        responses={
            200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
            401: ERROR_RESPONSES[401],
        },
    )
    async def metrics() -> Response:
        content, media_type = service.metrics.render()
        return Response(content, media_type=media_type)

    endpoints.update(
        route.path for route in (*v1.routes, *app.routes) if isinstance(route, APIRoute)
    )
    _document_request_models(app)
    return app


def _document_request_models(app: FastAPI) -> None:
    """Add the request models (read by hand, not by FastAPI) to the OpenAPI components."""
    request_models = (schemas.EmbeddingRequest, schemas.SegmentRequest, schemas.AMGRequest)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes
            )
            _, definitions = models_json_schema(
                [(m, "validation") for m in request_models],
                ref_template="#/components/schemas/{model}",
            )
            components = spec.setdefault("components", {}).setdefault("schemas", {})
            for name, schema in definitions.get("$defs", {}).items():
                components.setdefault(name, schema)
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


__all__ = ["create_app"]
