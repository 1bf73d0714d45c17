"""Catalog endpoints: the dataset list, one dataset's description, its episodes."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from app.api.deps import get_catalog, get_dataset
from app.api.problems import problem_responses
from app.reads.catalog import Catalog, Dataset
from app.reads.describe import dataset_stats, describe_dataset, list_episodes, summarize_dataset

router = APIRouter(tags=["datasets"])


@router.get(
    "/datasets",
    summary="The catalog: ids, formats, row and episode counts",
    description="`skipped` lists the directories below the roots that are not offered, each with its `path` "
    "relative to its root and the `reason` (no dataset in it, a name that is no valid id, a link out of the root).",
)
def list_datasets(catalog: Catalog = Depends(get_catalog)) -> dict[str, Any]:
    return {
        "datasets": [summarize_dataset(catalog.get(i)) for i in catalog.ids()],
        "skipped": [entry.as_json() for entry in catalog.skipped()],
    }


@router.get(
    "/datasets/{dataset_id:path}/episodes",
    summary="Per-episode length, row range and tasks",
    responses=problem_responses(404),
)
def dataset_episodes(dataset: Dataset = Depends(get_dataset)) -> dict[str, Any]:
    return {"dataset": dataset.id, "episodes": list_episodes(dataset)}


@router.get(
    "/datasets/{dataset_id:path}/stats",
    summary="Feature statistics (min, max, mean, std, count, quantiles) as LeRobot loads them",
    description="From `meta/stats.json` (LeRobot v3.0), or merged from `meta/episodes_stats.jsonl` (v2.1), "
    "count-weighted like LeRobot's `aggregate_stats`. `stats` and `source` are null for a dataset without "
    "statistics.",
    responses=problem_responses(404),
)
def dataset_statistics(dataset: Dataset = Depends(get_dataset)) -> dict[str, Any]:
    return dataset_stats(dataset)


@router.get(
    "/datasets/{dataset_id:path}",
    summary="Schema, features, fps, episodes, rows and cache state",
    description="Each camera column's `frames` states its frame tier: `raw` (exact frames, `lossy` false), or a "
    "lossy tier with its `quality`, `chroma_subsampling` and `psnr_db`, the PSNR of its frames against the exact "
    "ones over the camera's first `psnr_frames` frames of the first episode (null when they could not be decoded).",
    responses=problem_responses(404),
)
def dataset_info(dataset: Dataset = Depends(get_dataset)) -> dict[str, Any]:
    return describe_dataset(dataset)
