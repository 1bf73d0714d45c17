"""Liveness, readiness and metrics: open to load balancers and scrapers (metrics optionally token-protected).

Liveness and readiness are answered on the event loop, not in the thread pool: they do no blocking work, a probe
then costs a third of the CPU, and a pool busy with cold reads never makes a live worker look dead.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from app import metrics
from app.api.problems import OrjsonResponse, problem, problem_responses
from app.api.tokens import check_token

router = APIRouter(tags=["health"])


_ALIVE = b'{"status":"ok"}'


@router.get("/healthz", summary="Liveness: the process answers", response_model=dict[str, str])
async def healthz() -> Response:
    return Response(_ALIVE, media_type="application/json")


@router.get(
    "/readyz",
    summary="Readiness: the catalog is loaded",
    responses={200: {"description": "Ready: the number of datasets served"}, **problem_responses(503)},
)
async def readyz(request: Request) -> OrjsonResponse:
    catalog = getattr(request.app.state, "catalog", None)
    if catalog is None:
        return problem(503, "the catalog is still loading")
    return OrjsonResponse({"status": "ready", "datasets": len(catalog.ids())})


@router.get(
    "/metrics",
    summary="Prometheus metrics of every worker",
    response_class=Response,
    responses={
        200: {"description": "Prometheus text exposition", "content": {"text/plain": {"schema": {"type": "string"}}}},
        **problem_responses(401, 403),
    },
)
def prometheus_metrics(request: Request) -> Response:
    if request.app.state.settings.metrics_require_token:
        check_token(request)
    catalog = getattr(request.app.state, "catalog", None)
    if catalog is not None:
        statuses = [dataset.cache_status() for dataset in catalog.opened()]
        metrics.SEGMENTS_ON_DISK.set(sum(s["segments_built"] for s in statuses))
        metrics.SEGMENT_BYTES_ON_DISK.set(sum(s["bytes"] for s in statuses))
    body, content_type = metrics.render()
    return Response(body, media_type=content_type)
