"""Cache endpoints: status with build progress, and background warm-up."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from app.api.deps import get_dataset, json_body_schema, read_json_body
from app.api.problems import OrjsonResponse, problem_responses
from app.reads.requests import WarmRequest
from app.reads.service import files_needed
from app.store.dataset import Dataset
from app.store.warming import Warmer

router = APIRouter(tags=["cache"])


async def get_warmer(request: Request) -> Warmer:
    return request.app.state.warmer


def cache_report(dataset: Dataset, warmer: Warmer) -> dict[str, Any]:
    status = dataset.cache_status()
    job = warmer.job(dataset.id)
    return {
        "dataset": dataset.id,
        **status,
        "building": [
            {
                "source": b.source,
                "rows_done": b.rows_done,
                "rows_total": b.rows_total,
                "bytes_done": b.bytes_done,
                "progress": b.rows_done / b.rows_total if b.rows_total else 1.0,
            }
            for b in dataset.builds_in_progress()
        ],
        "warming": job.as_dict() if job else None,
    }


def _start_warming(dataset: Dataset, warmer: Warmer, request: WarmRequest) -> dict[str, Any]:
    warmer.start(dataset, files_needed(dataset, request.episode_ranges(dataset.limits)))
    return cache_report(dataset, warmer)


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
    report = await run_in_threadpool(_start_warming, dataset, warmer, body)
    return OrjsonResponse(report, status_code=202)
