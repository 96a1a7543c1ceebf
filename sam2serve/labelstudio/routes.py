"""The endpoints Label Studio calls on an ML backend, at the backend URL's root.

GET /health, POST /setup, POST /predict, GET /versions, POST /webhook (see
:mod:`sam2serve.labelstudio.protocol`). They reach the Service through the server's
dependencies and the backend through :func:`get_backend` (``app.state.labelstudio``). Their
bodies are read by hand as /v1's are, within the same limits and off the event loop.

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

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from sam2serve.labelstudio.predict import LabelStudioBackend, check_task_count
from sam2serve.labelstudio.protocol import (
    MAX_NAME_CHARS,
    SETUP_BODY_BYTES,
    HealthResponse,
    PredictRequest,
    PredictResponse,
    SetupRequest,
    SetupResponse,
    VersionsResponse,
)
from sam2serve.server.dependencies import AccessDep, ServiceDep
from sam2serve.server.errors import ApiError
from sam2serve.server.request_body import JSON_MEDIA, parse_json_body
from sam2serve.server.request_guard import run_guarded
from sam2serve.server.routes.common import (
    ERROR_RESPONSES,
    client_address,
    inline_schema,
    json_response,
)


async def get_backend(request: Request) -> LabelStudioBackend:
    backend: LabelStudioBackend = request.app.state.labelstudio
    return backend


BackendDep = Annotated[LabelStudioBackend, Depends(get_backend)]


async def require_key(request: Request, access: AccessDep) -> None:
    """401 unless the request carries the service's API key (when it has one): as the
    basic-auth password, a bearer token, or X-API-Key."""
    expected = access.api_key
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
# What Label Studio's bodies may be: the service's limits (bytes, JSON items and depth,
# read and validated off the event loop), /setup's body smaller (its labelling config and
# a few short fields), every string field of its own length (protocol.py).
BODY_LIMITS = {"/setup": (SETUP_BODY_BYTES, "the /setup limit: a labelling config and its fields")}


def _json_body(model: type) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {JSON_MEDIA: {"schema": inline_schema(model)}},
        }
    }


@router.get("/health", response_model=HealthResponse, summary="Label Studio's health check")
async def health(service: ServiceDep, backend: BackendDep) -> HealthResponse:
    return HealthResponse(model_version=backend.model_version(service), ready=service.ready)


@router.post(
    "/setup",
    response_model=SetupResponse,
    dependencies=protected,
    summary="Label Studio connects a project: its config, address and token",
    openapi_extra=_json_body(SetupRequest),
)
async def setup(request: Request, service: ServiceDep, backend: BackendDep) -> Response:
    body = await parse_json_body(request, SetupRequest, service.limits)
    return json_response(await backend.setup(body, service))


@router.post(
    "/predict",
    response_model=PredictResponse,
    dependencies=protected,
    summary="Brush masks for tasks: from the annotator's clicks and box, or pre-annotation",
    openapi_extra=_json_body(PredictRequest),
)
async def predict(request: Request, service: ServiceDep, backend: BackendDep) -> Response:
    limit = service.limits.max_predict_tasks

    def count_tasks(document: Any) -> None:  # before the tasks are validated, one by one
        tasks = document.get("tasks") if isinstance(document, dict) else None
        if isinstance(tasks, list):
            check_task_count(len(tasks), limit)

    body = await parse_json_body(request, PredictRequest, service.limits, count_tasks)

    async def work() -> Response:
        return json_response(await backend.predict(body, service, client_address(request)))

    return await run_guarded(request, work, service.limits.request_timeout_s, service.retry_headers)


@router.get(
    "/versions",
    response_model=VersionsResponse,
    dependencies=protected,
    summary="The model versions this backend answers with (one)",
)
async def versions(service: ServiceDep, backend: BackendDep) -> VersionsResponse:
    return VersionsResponse(versions=[backend.model_version(service)])


class WebhookEvent(BaseModel):
    """A Label Studio event; only its action is read."""

    model_config = ConfigDict(extra="allow")
    action: str | None = Field(None, max_length=MAX_NAME_CHARS, description="The event's name.")


@router.post(
    "/webhook",
    dependencies=protected,
    summary="Label Studio's events (training is not supported: acknowledged and ignored)",
    openapi_extra=_json_body(WebhookEvent),
)
async def webhook(request: Request, service: ServiceDep) -> dict[str, str]:
    body = await parse_json_body(request, WebhookEvent, service.limits)
    return {"status": "ignored", "action": (body.action or "")[:80]}


__all__ = ["BODY_LIMITS", "get_backend", "router"]
