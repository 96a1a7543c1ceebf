"""The Label Studio ML backend app: the service's app with Label Studio's endpoints added.

``create_labelstudio_app`` builds the service's app (:func:`sam2serve.server.app.create_app`:
the Service with its embedding cache, batching model worker, limits, metrics and error
shape; the annotation page and /v1 API stay available) and includes the router of
:mod:`sam2serve.labelstudio.routes`. So Label Studio's clicks share the cache, the queue
and the limits with every other client of the same process, and a persistent embedding
store, once the Service reads one, serves Label Studio too.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
from fastapi import FastAPI

from sam2serve.concepts.runtime import Concepts
from sam2serve.concepts.video_predictor import Sam3VideoPredictor
from sam2serve.engine.predictor import Predictor
from sam2serve.engine.video.predictor import VideoPredictor
from sam2serve.labelstudio.concept_predict import ConceptAnswerer
from sam2serve.labelstudio.concept_video import ConceptVideoTracker, video_thresholds
from sam2serve.labelstudio.images import ImageFetcher
from sam2serve.labelstudio.options import LabelStudioOptions
from sam2serve.labelstudio.predict import LabelStudioBackend
from sam2serve.labelstudio.routes import BODY_LIMITS, router
from sam2serve.server.app import create_app
from sam2serve.server.settings import ServerSettings


def create_labelstudio_app(
    settings: ServerSettings,
    options: LabelStudioOptions,
    predictor: Predictor | None = None,
    *,
    video_predictor: VideoPredictor | None = None,
    concepts: Concepts | None = None,
    concept_video: Sam3VideoPredictor | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> FastAPI:
    """The service's app for ``settings`` plus Label Studio's endpoints; loads the model
    unless a ``predictor`` is given, and with ``settings.video.enabled`` the video model (which
    tracks video tasks) unless a ``video_predictor`` is given. ``concepts``: SAM 3, loaded
    by the caller when ``options.concepts`` (label names and TextArea text become concept
    prompts); with ``settings.video.enabled`` too, SAM 3's video predictor is built from it
    (a phrase typed on a video is followed through the clip) unless ``concept_video`` is
    given. ``transport``: the HTTP transport that fetches images and videos (tests hand
    in a mock)."""
    if options.concepts and concepts is None:
        raise ValueError("options.concepts needs the concept model (concepts=load_concepts(...))")
    if options.concepts and not settings.concepts.enabled:
        raise ValueError("options.concepts needs settings.concepts.enabled (one --concepts flag)")
    # One SAM 3 for both: the service's /v1/concepts (settings.concepts.enabled, the same
    # --concepts flag) gets the model loaded here instead of loading its own.
    app = create_app(
        settings, predictor, video_predictor, body_limits=BODY_LIMITS, concepts=concepts
    )
    fetcher = ImageFetcher(
        max_bytes=settings.limits.max_upload_bytes,
        timeout_s=options.fetch_timeout_s,
        policy=options.fetch_policy(),
        local_roots=options.local_roots,
        transport=transport,
    )
    answerer = None
    video_tracker = None
    if options.concepts and concepts is not None:
        answerer = ConceptAnswerer(concepts, options)
        if settings.video.enabled:
            if concept_video is None:
                concept_video = _concept_video_predictor(concepts, options, settings)
            video_tracker = ConceptVideoTracker(concept_video, options)
    app.state.labelstudio = LabelStudioBackend(options, fetcher, answerer, video_tracker)
    app.include_router(router)

    service_lifespan = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with service_lifespan(app):
            try:
                yield
            finally:
                await fetcher.aclose()

    app.router.lifespan_context = lifespan
    return app


def _concept_video_predictor(
    concepts: Concepts, options: LabelStudioOptions, settings: ServerSettings
) -> Sam3VideoPredictor:
    """SAM 3's video predictor over ``concepts`` (its tracker from the same weights), at
    ``--concept-score-thresh``, tracking at most as many objects at once as a video session
    may (``max_video_objects``) and a phrase may answer (``--concept-max-instances``, the
    service's ``--max-concept-instances``, SAM 3's queries)."""
    from sam2serve.runtime.concepts import video_predictor_in_mode

    max_objects = min(
        settings.video.max_video_objects,
        options.concept_max_instances,
        settings.concepts.max_concept_instances,
        concepts.size.queries,
    )
    thresholds = video_thresholds(options.concept_score_thresh, max_objects)
    return video_predictor_in_mode(concepts, thresholds)  # the tracker in --mode, as the detector


__all__ = ["create_labelstudio_app"]
