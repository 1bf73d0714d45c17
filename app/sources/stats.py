"""A LeRobot dataset's feature statistics, as LeRobot loads them (format reference, sections 1, 2.6 and 3).

v3.0 keeps the global statistics in `meta/stats.json`. v2.1 writers keep only per-episode statistics in
`meta/episodes_stats.jsonl`, and LeRobot's loader merges them (count-weighted, its `aggregate_stats`) into the
global ones, ignoring any leftover `meta/stats.json`; a v2.1 dataset without episode statistics falls back to
that file. The merge keeps LeRobot's arithmetic: the parallel-variance formula, min of mins, max of maxes,
summed counts, and (for quantiles, which v2.1 writers never record) count-weighted means.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from app.errors import DatasetError
from app.sources.json_files import read_json, read_jsonl

STATS_FILE = "meta/stats.json"
EPISODES_STATS_FILE = "meta/episodes_stats.jsonl"

Stats = dict[str, dict[str, Any]]  # feature -> stat name -> nested lists of numbers (JSON)


def load_stats(root: Path, format: str) -> tuple[Stats | None, str | None]:
    """The dataset's global statistics and the file they come from (relative to `root`); (None, None) when the
    dataset has none (a generic parquet dataset, or a LeRobot dataset without statistics files)."""
    if format == "lerobot-v2.1":
        episodes = [row.get("stats") for row in read_jsonl(root / EPISODES_STATS_FILE)]
        if episodes:
            return aggregate_stats(episodes, root / EPISODES_STATS_FILE), EPISODES_STATS_FILE
    if format.startswith("lerobot-") and (root / STATS_FILE).is_file():
        stats = read_json(root / STATS_FILE)
        _check_shape(stats, root / STATS_FILE)
        return stats, STATS_FILE
    return None, None


def aggregate_stats(episodes: list[Any], path: Path) -> Stats:
    """The count-weighted merge of per-episode statistics, features in order of first appearance."""
    per_feature: dict[str, list[dict[str, Any]]] = {}
    for number, stats in enumerate(episodes):
        if not isinstance(stats, dict):
            raise DatasetError(f"{path}: line {number + 1} has no 'stats' object")
        _check_shape(stats, path)
        for feature, values in stats.items():
            per_feature.setdefault(feature, []).append(values)
    try:
        return {feature: _merge(parts) for feature, parts in per_feature.items()}
    except (KeyError, ValueError, TypeError) as exc:
        raise DatasetError(f"{path}: episode statistics that cannot be merged ({exc!r})") from exc


def _merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    counts = np.stack([np.asarray(p["count"], dtype=np.float64) for p in parts])
    total = counts.sum(axis=0)
    means = np.stack([np.asarray(p["mean"], dtype=np.float64) for p in parts])
    weights = counts.reshape(counts.shape + (1,) * (means.ndim - counts.ndim))
    mean = (means * weights).sum(axis=0) / total
    variances = np.stack([np.asarray(p["std"], dtype=np.float64) ** 2 for p in parts])
    variance = ((variances + (means - mean) ** 2) * weights).sum(axis=0) / total
    merged: dict[str, Any] = {}
    for name in parts[0]:
        if name == "min":
            merged[name] = np.min(np.stack([np.asarray(p["min"]) for p in parts]), axis=0).tolist()
        elif name == "max":
            merged[name] = np.max(np.stack([np.asarray(p["max"]) for p in parts]), axis=0).tolist()
        elif name == "mean":
            merged[name] = mean.tolist()
        elif name == "std":
            merged[name] = np.sqrt(variance).tolist()
        elif name == "count":
            merged[name] = [int(c) for c in total.reshape(-1)]
        else:  # quantiles: count-weighted means, as LeRobot approximates them
            values = np.stack([np.asarray(p[name], dtype=np.float64) for p in parts])
            merged[name] = ((values * weights).sum(axis=0) / total).tolist()
    return merged


def _check_shape(stats: Any, path: Path) -> None:
    if not isinstance(stats, dict) or not all(isinstance(v, dict) for v in stats.values()):
        raise DatasetError(f"{path}: expected {{feature: {{stat: values}}}}")
