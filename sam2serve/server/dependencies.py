"""The app's shared resources as FastAPI dependencies: the Service, the model, and the
settings groups the routes read (each group on its own, never the whole settings).

``create_app`` builds one :class:`~sam2serve.server.service.Service` per app and keeps it in
``app.state.service``. The routes live in module-level routers that exist before any app
does, so they reach the service through the request rather than through closures: a route
declares what it needs in its signature (``service: ServiceDep``). That keeps each route a
plain function of its inputs, lets two apps in one process (tests, a cluster replica) each
serve their own service, and lets a test swap a resource with ``app.dependency_overrides``.

The groups: the request limits (:class:`LimitSettings`) are the Service's, which holds
every request to them; the API key and origins (:class:`AccessSettings`) and the video
bounds (:class:`VideoSettings`, read by the routes whether or not the server tracks) are
put in ``app.state`` by ``create_app``. A video session's own limits are its
:class:`~sam2serve.server.video_sessions.VideoSessions`', SAM 3's request bounds its
:class:`~sam2serve.server.concept_images.ConceptImages`'.

The dependencies are ``async`` on purpose: FastAPI runs a plain ``def`` dependency in its
thread pool, a hop per request that an attribute lookup does not need. None of them adds a
parameter to the OpenAPI document.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from starlette.requests import HTTPConnection

from sam2serve.engine.predictor import Predictor
from sam2serve.server.service import Service
from sam2serve.server.settings_groups import AccessSettings, LimitSettings, VideoSettings


async def get_service(connection: HTTPConnection) -> Service:
    """The Service of the app answering the request (set by ``create_app``)."""
    service: Service = connection.app.state.service
    return service


ServiceDep = Annotated[Service, Depends(get_service)]


async def get_limits(service: ServiceDep) -> LimitSettings:
    """What every request is held to (sizes, counts, time)."""
    return service.limits


async def get_access(connection: HTTPConnection) -> AccessSettings:
    """Who may call the app: its API key and the origins of pages that may."""
    access: AccessSettings = connection.app.state.access
    return access


async def get_video_settings(connection: HTTPConnection) -> VideoSettings:
    """The bounds of videos (frames, upload bytes), whether or not the server tracks."""
    video: VideoSettings = connection.app.state.video
    return video


async def get_predictor(service: ServiceDep) -> Predictor:
    """The model the app serves (all model work still goes through the service's worker)."""
    return service.predictor


LimitsDep = Annotated[LimitSettings, Depends(get_limits)]
AccessDep = Annotated[AccessSettings, Depends(get_access)]
VideoSettingsDep = Annotated[VideoSettings, Depends(get_video_settings)]
PredictorDep = Annotated[Predictor, Depends(get_predictor)]

__all__ = [
    "AccessDep",
    "LimitsDep",
    "PredictorDep",
    "ServiceDep",
    "VideoSettingsDep",
    "get_access",
    "get_limits",
    "get_predictor",
    "get_service",
    "get_video_settings",
]
