"""The endpoints Label Studio calls on an ML backend, at the backend URL's root.

GET /health, POST /setup, POST /predict, GET /versions, POST /webhook (see
:mod:`sam2serve.labelstudio.protocol`). They reach the Service through the server's
dependencies and the backend through :func:`get_backend` (``app.state.labelstudio``).

When the service has an API key, these endpoints want it too, given as Label Studio can
send it: with HTTP basic authentication (Label Studio's ML backend settings, "Basic
Authentication", any user name, the key as password), or as the /v1 endpoints take it.
/health stays open: it is the probe.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request
from fastapi.responses import Response

from sam2serve.labelstudio.predict import LabelStudioBackend
from sam2serve.labelstudio.protocol import (
    HealthResponse,
    PredictRequest,
    PredictResponse,
    SetupRequest,
    SetupResponse,
    VersionsResponse,
)
from sam2serve.server.dependencies import ServiceDep, SettingsDep
from sam2serve.server.errors import ApiError
from sam2serve.server.request_guard import run_guarded
from sam2serve.server.routes.common import ERROR_RESPONSES, client_address, json_response


async def get_backend(request: Request) -> LabelStudioBackend:
    backend: LabelStudioBackend = request.app.state.labelstudio
    return backend


BackendDep = Annotated[LabelStudioBackend, Depends(get_backend)]


async def require_key(request: Request, settings: SettingsDep) -> None:
    """401 unless the request carries the service's API key (when it has one): as the
    basic-auth password, a bearer token, or X-API-Key."""
    expected = settings.api_key
    if expected is None:
        return
    given = request.headers.get("x-api-key")
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        given = value.strip()
    elif scheme.lower() == "basic":
        try:
            given = base64.b64decode(value.strip(), validate=True).decode().partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            given = None
    if given is None or not secrets.compare_digest(given.encode(), expected.encode()):
        raise ApiError(
            401,
            "unauthorized",
            "missing or wrong API key; in Label Studio's ML backend settings choose Basic "
            "Authentication with the key as password",
            headers={"WWW-Authenticate": 'Basic realm="sam2serve"'},
        )


router = APIRouter(tags=["Label Studio ML backend"], responses=ERROR_RESPONSES)
protected = [Depends(require_key)]


@router.get("/health", response_model=HealthResponse, summary="Label Studio's health check")
async def health(service: ServiceDep, backend: BackendDep) -> HealthResponse:
    return HealthResponse(model_version=backend.model_version(service), ready=service.ready)


@router.post(
    "/setup",
    response_model=SetupResponse,
    dependencies=protected,
    summary="Label Studio connects a project: its config, address and token",
)
async def setup(
    body: Annotated[SetupRequest, Body()], service: ServiceDep, backend: BackendDep
) -> SetupResponse:
    return backend.setup(body, service)


@router.post(
    "/predict",
    response_model=PredictResponse,
    dependencies=protected,
    summary="Brush masks for tasks: from the annotator's clicks and box, or pre-annotation",
)
async def predict(
    request: Request,
    body: Annotated[PredictRequest, Body()],
    service: ServiceDep,
    backend: BackendDep,
) -> Response:
    async def work() -> Response:
        return json_response(await backend.predict(body, service, client_address(request)))

    return await run_guarded(
        request, work, service.settings.request_timeout_s, service.retry_headers
    )


@router.get(
    "/versions",
    response_model=VersionsResponse,
    dependencies=protected,
    summary="The model versions this backend answers with (one)",
)
async def versions(service: ServiceDep, backend: BackendDep) -> VersionsResponse:
    return VersionsResponse(versions=[backend.model_version(service)])


@router.post(
    "/webhook",
    dependencies=protected,
    summary="Label Studio's events (training is not supported: acknowledged and ignored)",
)
async def webhook(body: Annotated[dict[str, Any], Body()]) -> dict[str, str]:
    return {"status": "ignored", "action": str(body.get("action", ""))[:80]}


__all__ = ["get_backend", "router"]
