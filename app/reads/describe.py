"""JSON descriptions of datasets for the catalog endpoints (plain dicts, no HTTP)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import numpy as np

from app.reads.tier_psnr import tier_psnr
from app.sources.source import VideoFeature
from app.sources.stats import load_stats
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
        + [_describe_camera(dataset, camera) for camera in meta.videos.values()],
        "features": meta.info.get("features") or None,
        "hub": dataset.supply.describe(),
        # The format's own description (LeRobot's meta/info.json, as the file holds it): robot_type,
        # codebase_version, chunks_size, path templates... for clients that present LeRobot's metadata.
        "info": meta.info or None,
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


def _describe_camera(dataset: Dataset, camera: VideoFeature) -> dict[str, Any]:
    """A camera's column: its frames' geometry and tier, and for a lossy tier the PSNR measured on its frames."""
    described = camera.describe()
    described["frames"] |= tier_psnr(dataset, camera)
    return described


def _iso_utc(epoch_seconds: float | None) -> str | None:
    """`2026-01-02T03:04:05.678Z`."""
    if epoch_seconds is None:
        return None
    moment = datetime.fromtimestamp(epoch_seconds, timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def list_episodes(dataset: Dataset) -> list[dict[str, Any]]:
    """One entry per episode: index, length, its rows `[dataset_from_index, dataset_to_index)` in the view of
    every episode (LeRobot's global `index` range for a well-formed dataset), and tasks where the format records
    them."""
    index = dataset.index()
    meta = dataset.info()
    lengths = index.episode_lengths.tolist()
    episodes = index.episodes.tolist()
    ends = np.cumsum(index.episode_lengths, dtype=np.int64).tolist()
    entries = [
        {"episode_index": e, "length": n, "dataset_from_index": end - n, "dataset_to_index": end}
        for e, n, end in zip(episodes, lengths, ends, strict=True)
    ]
    if meta.episode_tasks:
        for entry in entries:
            entry["tasks"] = meta.episode_tasks.get(entry["episode_index"], [])
    return entries


def dataset_stats(dataset: Dataset) -> dict[str, Any]:
    """The dataset's feature statistics as LeRobot loads them (`{feature: {stat: values}}`), the file they come
    from, or None for both when the dataset has none."""
    source = dataset.source()
    stats, path = load_stats(source.root, source.info.format)
    return {"dataset": dataset.id, "stats": stats, "source": path}
