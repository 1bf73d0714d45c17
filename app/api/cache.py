"""Cache endpoints: status with build progress, and background warm-up."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from app.api.deps import get_dataset
from app.api.json_body import json_body_schema, read_json_body
from app.api.problems import OrjsonResponse, problem_responses
from app.reads.cache_report import cache_report, start_warming
from app.reads.catalog import Dataset, Warmer
from app.reads.requests import WarmRequest

router = APIRouter(tags=["cache"])


async def get_warmer(request: Request) -> Warmer:
    return request.app.state.warmer


@router.get(
    "/datasets/{dataset_id:path}/cache",
    summary="Cache status: segments built, bytes, builds in progress",
    responses=problem_responses(404),
)
def cache_status(dataset: Dataset = Depends(get_dataset), warmer: Warmer = Depends(get_warmer)) -> dict[str, Any]:
    return cache_report(dataset, warmer)


@router.post(
    "/datasets/{dataset_id:path}/cache",
    summary="Start warming the cache (all or some episodes) in the background",
    status_code=202,
    responses=problem_responses(400, 404, 413, 415),
    openapi_extra=json_body_schema(WarmRequest, required=False),
)
async def warm_cache(
    request: Request, dataset: Dataset = Depends(get_dataset), warmer: Warmer = Depends(get_warmer)
) -> OrjsonResponse:
    body = WarmRequest()
    if request.headers.get("content-length", "0") != "0" or "transfer-encoding" in request.headers:
        body = await read_json_body(request, WarmRequest, dataset.limits.max_body_bytes)
    report = await run_in_threadpool(start_warming, dataset, warmer, body.episode_ranges(dataset.limits))
    return OrjsonResponse(report, status_code=202)
