"""GET /healthz, /readyz, /metrics: what orchestrators and monitoring poll.

The probes are open (a load balancer has no API key): /healthz says the process answers,
/readyz that the model is loaded and warm (503 until then, so no traffic reaches a cold
replica). /metrics is the Prometheus scrape, behind the API key when the server has one:
its labels name the endpoints and its counts describe the traffic.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from sam2serve.server import schemas
from sam2serve.server.auth import require_api_key
from sam2serve.server.dependencies import PredictorDep, ServiceDep
from sam2serve.server.errors import ApiError
from sam2serve.server.routes.common import ERROR_RESPONSES

router = APIRouter()


@router.get("/healthz", response_model=schemas.Health, summary="The process is alive")
async def healthz() -> schemas.Health:
    return schemas.Health()


@router.get(
    "/readyz",
    response_model=schemas.Ready,
    responses={503: {"model": schemas.ErrorResponse, "description": "Not warm yet"}},
    summary="The model is loaded and warm",
)
async def readyz(service: ServiceDep, predictor: PredictorDep) -> schemas.Ready:
    if not service.ready:
        raise ApiError(
            503,
            "not_ready",
            "the model is warming up; retry shortly",
            headers={"Retry-After": "1"},
        )
    concepts = service.concepts.limits if service.concepts is not None else None
    return schemas.Ready(
        model=service.model_name,
        mode=service.mode,
        backend=service.backend,
        device=str(predictor.device),
        dtype=service.dtype_name,
        weights=service.weights,
        concepts=concepts is not None,
        # What the page bounds its concept requests with before it sends one.
        max_concept_phrases=concepts.max_concept_phrases if concepts else None,
        max_concept_boxes=concepts.max_concept_boxes if concepts else None,
    )


@router.get(
    "/metrics",
    dependencies=[Depends(require_api_key)],
    summary="Prometheus metrics",
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
        401: ERROR_RESPONSES[401],
    },
)
async def metrics(service: ServiceDep) -> Response:
    content, media_type = service.metrics.render()
    return Response(content, media_type=media_type)
