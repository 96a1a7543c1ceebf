"""The FastAPI app: ``create_app(settings, predictor=None)``.

A thin shell over the engine. A request's body is read on the event loop and bounded
there (size, time, JSON structure); parsing, validation, base64 and image decoding run in
threads, and all model work goes through the model worker
(:class:`~sam2serve.server.batching.ModelWorker`: one thread, batched encodes, bounded
queues, clicks before AMG). After the body, the work runs under
:func:`~sam2serve.server.request_guard.run_guarded`: cancelled when the client hangs up,
503 past ``request_timeout_s``. Embeddings are cached by content hash
(:mod:`sam2serve.server.cache`); concurrent requests for the same uncached image share one
encode. Every error a client can cause is a 4xx in the one error shape of
:mod:`sam2serve.server.errors`, and leaves the server and its caches as they were.

Endpoints: POST /v1/embeddings, /v1/segment, /v1/amg; /v1/concepts (SAM 3, with
``settings.concepts.enabled``); /v1/videos (video tracking sessions, with
``settings.video.enabled``); GET /healthz, /readyz, /metrics; OpenAPI at /docs. Request bodies are JSON (the image base64) or multipart/form-data (the
image as a file part named ``image``, the other fields as JSON in a part named
``request``).

This module assembles an app: the Service, the middleware, the docs pages, the error
handlers, the routers of :mod:`sam2serve.server.routes` (which reach the Service through
:mod:`sam2serve.server.dependencies`) and the OpenAPI document. The metric labels are the
paths of the app's routes, read once the routers are included.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from pydantic.json_schema import models_json_schema

from sam2serve.engine.predictor import Predictor
from sam2serve.engine.video.predictor import VideoPredictor
from sam2serve.runtime.spec import RuntimeSpec, WeightsSource
from sam2serve.server import concept_schemas, schemas, video_schemas
from sam2serve.server.api_docs import install_offline_docs
from sam2serve.server.body_limit import BodyLimitMiddleware
from sam2serve.server.errors import install_error_handlers
from sam2serve.server.image_folder import FolderIndex
from sam2serve.server.metrics import RequestMetricsMiddleware
from sam2serve.server.routes import ROUTERS
from sam2serve.server.routes.videos import VIDEOS_PATH
from sam2serve.server.service import Service
from sam2serve.server.settings import ServerSettings
from sam2serve.server.settings_groups import RuntimeSettings
from sam2serve.server.video_sessions import SessionLimits, VideoSessions

if TYPE_CHECKING:
    from sam2serve.concepts.runtime import Concepts


def create_app(
    settings: ServerSettings,
    predictor: Predictor | None = None,
    video_predictor: VideoPredictor | None = None,
    *,
    body_limits: Mapping[str, tuple[int, str]] | None = None,
    concepts: Concepts | None = None,
) -> FastAPI:
    """The app for ``settings``; loads the model unless a ``predictor`` is given, with
    ``settings.video.enabled`` the video model too unless a ``video_predictor`` is given,
    and with ``settings.concepts.enabled`` SAM 3 unless ``concepts`` is given (a
    ``WeightsError`` when its weights are missing).
    ``body_limits``: body limits of paths an app built on this one adds (``{path: (bytes,
    what the 413 names)}``); every other path has the service's."""
    runtime = settings.runtime
    if predictor is None:
        from sam2serve.runtime.build import build_predictor

        predictor = build_predictor(runtime.spec(), runtime.weights_source())
    videos = None
    if settings.video.enabled:
        if video_predictor is None:
            video_predictor = load_video_predictor(runtime, predictor)
        videos = VideoSessions(video_predictor, SessionLimits.of(settings.video), settings.live)
    if settings.concepts.enabled and concepts is None:
        concepts = load_concepts_model(runtime)
    images_dir = settings.page.images_dir
    service = Service(
        predictor,
        runtime=runtime,
        limits=settings.limits,
        batching=settings.batching,
        caches=settings.caches,
        store=settings.store,
        videos=videos,
        folder=None if images_dir is None else FolderIndex(images_dir, videos=videos is not None),
        concepts=concepts if settings.concepts.enabled else None,
        concept_limits=settings.concepts,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = _DocumentedApp(
        title="sam2serve",
        summary="Segment Anything 2 on images over HTTP: embeddings, prompts, AMG.",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,  # served from the package's own assets (offline), below
        redoc_url=None,
    )
    install_offline_docs(app)
    # What the routes' dependencies hand them (sam2serve.server.dependencies): the Service,
    # and the settings groups that no part of it reads.
    app.state.service = service
    app.state.access = settings.access
    app.state.video = settings.video
    for router in ROUTERS:
        app.include_router(router)
    endpoints = endpoint_paths(app)  # the metric labels; every other path is "other"
    install_error_handlers(
        app,
        service.metrics.observe_error,
        on_disconnect=lambda path, stage: service.metrics.observe_disconnect(
            path, stage, endpoints
        ),
    )
    app.add_middleware(
        BodyLimitMiddleware,
        limit=settings.limits.max_body_bytes,
        timeout_s=settings.connections.body_timeout_s,
        observe=service.metrics.observe_error,
        path_limits={
            VIDEOS_PATH: (settings.video.max_video_body_bytes, "max_video_upload_bytes"),
            **(body_limits or {}),
        },
    )
    app.add_middleware(RequestMetricsMiddleware, metrics=service.metrics, endpoints=endpoints)
    if settings.access.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.access.cors_origins),
            allow_methods=["GET", "POST", "PATCH", "DELETE"],
            allow_headers=["Authorization", "X-API-Key", "Content-Type"],
        )
    return app


def load_video_predictor(runtime: RuntimeSettings, predictor: Predictor) -> VideoPredictor:
    """The tracker beside the image model, on its device
    (:func:`~sam2serve.runtime.backend_choice.tracker_beside_images`): the video graphs of
    the ONNX export it serves, where the export has them; else SAM 2's video model with the
    image model's size and weights, tracking in the server's mode (a mode the tracker does
    not run, int8, tracks as fast: fp32)."""
    from sam2serve.runtime.backend_choice import tracker_beside_images
    from sam2serve.runtime.video import build_video_predictor, video_predictor_for
    from sam2serve.runtime.video_model import video_model_like

    image = runtime.spec()
    artifacts = runtime.weights_source().artifacts
    device = str(predictor.device)
    choice = tracker_beside_images(image.mode, device, artifacts)
    spec = RuntimeSpec(
        model=image.model,
        mode=choice.mode,
        backend=choice.backend,
        device=device,
        threads=image.threads,
    )
    if choice.artifacts is not None:
        return build_video_predictor(spec, WeightsSource(artifacts=choice.artifacts))
    weights = predictor.model.weights_info
    model = video_model_like(image.model, weights, predictor.device)
    return video_predictor_for(model, spec)


def load_concepts_model(runtime: RuntimeSettings) -> Concepts:
    """SAM 3 as the runtime settings choose it, in their mode: random (same seed) with
    random SAM 2 weights, else from the download cache's sam3 folder ('serve' passes its
    --sam3-weights model)."""
    from sam2serve.concepts.runtime import ConceptsSpec
    from sam2serve.runtime.concepts import load_concepts_in_mode

    spec = ConceptsSpec(
        random_weights=runtime.random_weights, seed=runtime.seed, device=runtime.device
    )
    return load_concepts_in_mode(spec, runtime.mode)


def endpoint_paths(app: FastAPI) -> frozenset[str]:
    """The paths of the app's endpoints: its own routes (the docs pages) and those of the
    routers it includes. The routers are read directly because FastAPI may keep an included
    router as one entry of ``app.routes``; their routes' paths are the app's (each router
    carries its prefix and is included without one)."""
    routes = [*app.routes, *(route for router in ROUTERS for route in router.routes)]
    return frozenset(route.path for route in routes if isinstance(route, APIRoute))


# Request bodies the routes read by hand (not by FastAPI), added to the OpenAPI components.
_REQUEST_MODELS = (
    schemas.EmbeddingRequest,
    schemas.SegmentRequest,
    schemas.AMGRequest,
    concept_schemas.ConceptsRequest,
    video_schemas.VideoPromptRequest,
    video_schemas.PropagateRequest,
    video_schemas.VideoConceptsRequest,
    video_schemas.ConceptTrackRequest,
)


class _DocumentedApp(FastAPI):
    """The FastAPI app whose OpenAPI document also defines the request models read by hand
    (made when first asked for, so routes an app built on this one adds are in it)."""

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            spec = get_openapi(
                title=self.title, version=self.version, summary=self.summary, routes=self.routes
            )
            _, definitions = models_json_schema(
                [(m, "validation") for m in _REQUEST_MODELS],
                ref_template="#/components/schemas/{model}",
            )
            components = spec.setdefault("components", {}).setdefault("schemas", {})
            for name, schema in definitions.get("$defs", {}).items():
                components.setdefault(name, schema)
            self.openapi_schema = spec
        return self.openapi_schema


__all__ = ["create_app", "endpoint_paths", "load_concepts_model", "load_video_predictor"]
