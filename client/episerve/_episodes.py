"""Episode selections as the server's spec grammar: comma-separated ids and inclusive ranges, e.g. `0,3-5,9`."""

from __future__ import annotations

import numbers
from collections.abc import Iterable

import numpy as np

Episodes = str | int | Iterable[int] | None


def episode_spec(episodes: Episodes) -> str | None:
    """The spec string for `episodes`: strings pass through for the server to validate; ids become ranges.

    Order and duplicates do not matter: the view is always in ascending episode order.
    """
    if episodes is None:
        return None
    if isinstance(episodes, str):
        return episodes.strip()
    if isinstance(episodes, numbers.Integral):
        episodes = [int(episodes)]
    ids = np.unique(np.fromiter((_episode_id(e) for e in episodes), dtype=np.int64))
    if len(ids) == 0:
        raise ValueError("episodes is empty; pass None for every episode")
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    runs = np.split(ids, breaks)
    return ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def _episode_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"episode ids must be integers, got {value!r}")
    if value < 0:
        raise ValueError(f"episode ids are non-negative, got {value}")
    return int(value)
