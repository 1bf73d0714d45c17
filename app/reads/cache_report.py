"""A dataset's cache as the API reports it (segments built, bytes, builds and warming under way), and the start of
its warming for some episodes."""

from __future__ import annotations

from typing import Any

from app.reads.episode_spec import EpisodeRanges
from app.reads.service import files_needed
from app.store.dataset import Dataset
from app.store.warming import Warmer


def cache_report(dataset: Dataset, warmer: Warmer) -> dict[str, Any]:
    """Segments built / total and their bytes, decoded-frame segments, builds in progress, the warming job, and for a
    Hub dataset its files fetched and being fetched."""
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
            for b in dataset.rows.building()
        ],
        "warming": job.as_dict() if job else None,
        "hub": dataset.supply.describe(),
    }


def start_warming(dataset: Dataset, warmer: Warmer, episodes: EpisodeRanges | None) -> dict[str, Any]:
    """Start building, in the background, the segments of the selected episodes (all: None); the report after."""
    warmer.start(dataset, files_needed(dataset, episodes))
    return cache_report(dataset, warmer)
