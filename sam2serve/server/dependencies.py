"""The app's shared resources as FastAPI dependencies: the Service, its settings, the model.

``create_app`` builds one :class:`~sam2serve.server.service.Service` per app and keeps it in
``app.state.service``. The routes live in module-level routers that exist before any app
does, so they reach the service through the request rather than through closures: a route
declares what it needs in its signature (``service: ServiceDep``). That keeps each route a
plain function of its inputs, lets two apps in one process (tests, a cluster replica) each
serve their own service, and lets a test swap a resource with ``app.dependency_overrides``.

The dependencies are ``async`` on purpose: FastAPI runs a plain ``def`` dependency in its
thread pool, a hop per request that an attribute lookup does not need. None of them adds a
parameter to the OpenAPI document.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from sam2serve.engine.predictor import Predictor
from sam2serve.server.service import Service
from sam2serve.server.settings import ServerSettings


async def get_service(request: Request) -> Service:
    """The Service of the app answering ``request`` (set by ``create_app``)."""
    service: Service = request.app.state.service
    return service


ServiceDep = Annotated[Service, Depends(get_service)]


async def get_settings(service: ServiceDep) -> ServerSettings:
    """The app's settings: model and limits."""
    return service.settings


async def get_predictor(service: ServiceDep) -> Predictor:
    """The model the app serves (all model work still goes through the service's worker)."""
    return service.predictor


SettingsDep = Annotated[ServerSettings, Depends(get_settings)]
PredictorDep = Annotated[Predictor, Depends(get_predictor)]

__all__ = [
    "PredictorDep",
    "ServiceDep",
    "SettingsDep",
    "get_predictor",
    "get_service",
    "get_settings",
]
