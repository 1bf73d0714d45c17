"""JSON descriptions of datasets for the catalog endpoints (plain dicts, no HTTP)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import numpy as np

from app.store.dataset import Dataset


def summarize_dataset(dataset: Dataset) -> dict[str, Any]:
    """Id, format, row and episode counts."""
    index = dataset.index()
    meta = dataset.info()
    return {
        "id": dataset.id,
        "format": meta.format,
        "rows": index.total_rows,
        "episodes": len(index.episodes) if index.has_episode_column else None,
        "fps": meta.fps,
    }


def describe_dataset(dataset: Dataset) -> dict[str, Any]:
    """Everything a client needs before reading rows."""
    index = dataset.index()
    meta = dataset.info()
    lengths = index.episode_lengths
    return {
        **summarize_dataset(dataset),
        "episode_column": dataset.episode_column if index.has_episode_column else None,
        "columns": [{"name": f.name, "type": str(f.type)} for f in index.schema]
        + [camera.describe() for camera in meta.videos.values()],
        "features": meta.info.get("features") or None,
        "tasks": {str(k): v for k, v in sorted(meta.tasks.items())},
        "episode_range": [int(index.episodes[0]), int(index.episodes[-1])] if len(index.episodes) else None,
        "episode_length": {
            "min": int(lengths.min()),
            "max": int(lengths.max()),
            "mean": float(np.mean(lengths)),
        }
        if len(lengths)
        else None,
        "source_files": len(index.files),
        "cache": dataset.cache_status(),
        "version": index.digest,
        "checked_at": _iso_utc(dataset.checked_at),
    }


def _iso_utc(epoch_seconds: float | None) -> str | None:
    """`2026-01-02T03:04:05.678Z`."""
    if epoch_seconds is None:
        return None
    moment = datetime.fromtimestamp(epoch_seconds, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def list_episodes(dataset: Dataset) -> list[dict[str, Any]]:
    """One entry per episode: index, length, and tasks where the format records them."""
    index = dataset.index()
    meta = dataset.info()
    lengths = index.episode_lengths.tolist()
    episodes = index.episodes.tolist()
    if not meta.episode_tasks:
        return [{"episode_index": e, "length": n} for e, n in zip(episodes, lengths, strict=True)]
    return [
        {"episode_index": e, "length": n, "tasks": meta.episode_tasks.get(e, [])}
        for e, n in zip(episodes, lengths, strict=True)
    ]
