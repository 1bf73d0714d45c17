"""Episode selections as the server's spec grammar: comma-separated ids and inclusive ranges, e.g. `0,3-5,9`.

The one place the client writes (`episode_spec`) and reads (`episode_count`) that grammar.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Iterable

import numpy as np

Episodes = str | int | Iterable[int] | None

_TERM = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?")  # one id, or an inclusive range `first-last`


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
    return _format([(int(run[0]), int(run[-1])) for run in np.split(ids, breaks)])


def episode_count(spec: str) -> int:
    """How many episode ids the spec string names (each once, however often it is named), without listing them."""
    count, reached = 0, -1  # ids up to `reached` are counted
    for first, last in sorted(_ranges(spec)):
        if last > reached:
            count += last - max(first, reached + 1) + 1
            reached = last
    return count


def _ranges(spec: str) -> list[tuple[int, int]]:
    """The inclusive ranges of a spec string, as named (the server has checked the spec: ValueError if invalid)."""
    ranges = []
    for term in spec.split(","):
        match = _TERM.fullmatch(term)
        if match is None:
            raise ValueError(f"invalid term {term.strip()!r} in episodes spec {spec!r}")
        first = int(match.group(1))
        ranges.append((first, int(match.group(2) or first)))
    return ranges


def _format(ranges: list[tuple[int, int]]) -> str:
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in ranges)


def _episode_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"episode ids must be integers, got {value!r}")
    if value < 0:
        raise ValueError(f"episode ids are non-negative, got {value}")
    return int(value)
