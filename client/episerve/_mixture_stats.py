"""A mixture's feature statistics: each component's, renamed by its feature map, and their merge.

The merge is LeRobot's `aggregate_stats` (every feature any component has; count-weighted means; pooled variances
`sum(n_k (std_k^2 + (mean_k - mean)^2)) / sum(n_k)`; element-wise min and max; summed counts), with one addition for
vectors padded to the mixture's width: each dimension is merged over the components for which it is real, so a
padded dimension's statistics are those of the components that have it (the zeros of padding never count), while
`count` stays the rows of every component that has the feature. Counts are the datasets' own (the statistics
files cover whole datasets, not episode picks), not the mixture's weights, as LeRobot merges them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from episerve._client import Client
from episerve._mixture import Component

Stats = dict[str, dict[str, np.ndarray]]
_NAMES = ("min", "max", "mean", "std")


def component_stats(client: Client, components: Sequence[Component]) -> list[Stats | None]:
    """Each component's statistics as numpy arrays, keyed by the mixture's names (None: it has none)."""
    result: list[Stats | None] = []
    for component in components:
        raw = client.stats(component.dataset)
        if raw is None:
            result.append(None)
            continue
        result.append({component.name_of(key): _arrays(values) for key, values in raw.items()})
    return result


def merge_stats(parts: Sequence[Stats | None]) -> Stats:
    """The merged statistics of `parts` (see the module docstring); components without statistics are left out."""
    present = [part for part in parts if part is not None]
    names = list(dict.fromkeys(name for part in present for name in part))
    return {name: _merge_feature([part[name] for part in present if name in part]) for name in names}


def _merge_feature(items: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    counts = np.asarray([float(np.asarray(item["count"]).reshape(-1)[0]) for item in items])
    shapes = [np.shape(item["mean"]) for item in items]
    if len(set(shapes)) == 1:
        width = None
        real = np.ones((len(items), *shapes[0]), dtype=bool)
    else:  # vectors of different widths: pad to the widest, marking what is real
        if any(len(shape) != 1 for shape in shapes):
            raise ValueError(f"statistics of shapes {shapes} cannot be merged")
        width = max(shape[0] for shape in shapes)
        real = np.stack([np.arange(width) < shape[0] for shape in shapes])
    stacked = {stat: np.stack([_pad(np.asarray(i[stat], dtype=np.float64), width) for i in items]) for stat in _NAMES}
    weights = counts.reshape(-1, *([1] * (stacked["mean"].ndim - 1))) * real
    total = weights.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = (weights * np.where(real, stacked["mean"], 0.0)).sum(axis=0) / total
        spread = np.where(real, stacked["std"] ** 2 + (stacked["mean"] - mean) ** 2, 0.0)
        variance = (weights * spread).sum(axis=0) / total
    return {
        "min": np.where(real, stacked["min"], np.inf).min(axis=0),
        "max": np.where(real, stacked["max"], -np.inf).max(axis=0),
        "mean": mean,
        "std": np.sqrt(variance),
        "count": np.asarray([int(counts.sum())]),
    }


def _pad(values: np.ndarray, width: int | None) -> np.ndarray:
    if width is None or values.shape[0] == width:
        return values
    return np.concatenate([values, np.zeros(width - values.shape[0])])


def _arrays(values: dict[str, Any]) -> dict[str, np.ndarray]:
    return {stat: np.asarray(value) for stat, value in values.items()}
