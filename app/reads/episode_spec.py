"""Parse episode selections (`"0,3-5,9"` or a list of ints) and resolve them against a dataset's episodes.

Selections are kept as merged inclusive ranges, so `0-1000000000` costs nothing until it is intersected with
the episodes that exist.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np

from app.errors import DoesNotExist, InvalidInput, OverLimit

EpisodeRanges = list[tuple[int, int]]

_TERM = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")
_MAX_NAMED_MISSING = 20
_MAX_NAMED_RANGES = 5  # beyond this many runs of ids, an error names their count and span instead
MAX_EPISODE_ID = 2**62
# Longer digit strings are past MAX_EPISODE_ID; checked before int(), which refuses 4,300 digits and more.
_MAX_ID_DIGITS = len(str(MAX_EPISODE_ID))


def parse_episode_spec(spec: str, max_chars: int) -> EpisodeRanges:
    """Parse comma-separated non-negative integers and inclusive ranges `a-b` into merged ranges."""
    if len(spec) > max_chars:
        raise OverLimit(
            f"episodes spec is {len(spec)} characters long; the limit is {max_chars} (send long lists in a POST body)",
            max_chars,
        )
    if not spec.strip():
        raise InvalidInput("episodes spec is empty; omit it to select every episode")
    ranges: EpisodeRanges = []
    for term in spec.split(","):
        match = _TERM.match(term)
        if match is None:
            raise InvalidInput(
                f"invalid term {term.strip()!r} in episodes spec: expected a non-negative integer "
                "or an inclusive range like '3-7'"
            )
        first = _episode_id(match.group(1))
        last = _episode_id(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise InvalidInput(f"invalid range {term.strip()!r} in episodes spec: end is before start")
        ranges.append((first, last))
    return merge_ranges(ranges)


def _episode_id(digits: str) -> int:
    """A term's number, refused beyond MAX_EPISODE_ID (without converting thousands of digits)."""
    value = int(digits) if len(digits.lstrip("0")) <= _MAX_ID_DIGITS else None
    if value is None or value > MAX_EPISODE_ID:
        shown = digits if len(digits) <= 30 else f"{digits[:20]}... ({len(digits)} digits)"
        raise InvalidInput(f"episode id {shown} in episodes spec is too large; the largest is {MAX_EPISODE_ID}")
    return value


def ranges_from_ids(ids: Iterable[int]) -> EpisodeRanges:
    """Turn episode ids (any order, duplicates allowed, all >= 0) into merged ranges."""
    values = sorted(set(ids))
    if values and values[0] < 0:
        raise InvalidInput(f"episode ids must be non-negative, got {values[0]}")
    return merge_ranges([(v, v) for v in values])


def merge_ranges(ranges: Sequence[tuple[int, int]]) -> EpisodeRanges:
    """Sort and merge overlapping or adjacent inclusive ranges."""
    merged: EpisodeRanges = []
    for first, last in sorted(ranges):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


def format_ranges(ranges: Sequence[tuple[int, int]]) -> str:
    """The inverse of `parse_episode_spec`: `[(0, 0), (3, 5)]` -> `"0,3-5"`."""
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def resolve_episodes(ranges: EpisodeRanges, known: np.ndarray) -> np.ndarray:
    """The selected episode ids, ascending. `known` is the sorted array of existing ids.

    Raises DoesNotExist naming the missing ids (as ranges) and the episodes there are when any selected id does
    not exist.
    """
    missing: EpisodeRanges = []
    chunks: list[np.ndarray] = []
    for first, last in ranges:
        lo = int(np.searchsorted(known, first, side="left"))
        hi = int(np.searchsorted(known, last, side="right"))
        present = known[lo:hi]
        chunks.append(present)
        if len(present) != last - first + 1:
            missing.extend(_gaps(first, last, present))
            if len(missing) > _MAX_NAMED_MISSING:
                break
    if missing:
        named = format_ranges(missing[:_MAX_NAMED_MISSING])
        more = " and more" if len(missing) > _MAX_NAMED_MISSING else ""
        raise DoesNotExist(f"episodes not in this dataset: {named}{more}; {describe_episodes(known)}")
    if not chunks:
        return np.empty(0, dtype=np.int64)
    return np.concatenate(chunks).astype(np.int64, copy=False)


def describe_episodes(known: np.ndarray) -> str:
    """The episodes there are, for an error message: their ranges, or their count and span when there are many
    gaps (`known` is the sorted array of existing ids)."""
    if len(known) == 0:
        return "it has no episodes"
    breaks = np.flatnonzero(np.diff(known) != 1)
    if len(breaks) >= _MAX_NAMED_RANGES:
        return f"it has {len(known)} episodes from {int(known[0])} to {int(known[-1])}, with gaps"
    starts = [int(known[0]), *known[breaks + 1].tolist()]
    stops = [*known[breaks].tolist(), int(known[-1])]
    return f"its episodes are {format_ranges(list(zip(starts, stops, strict=True)))}"


def _gaps(first: int, last: int, present: np.ndarray) -> EpisodeRanges:
    """Inclusive ranges of [first, last] not covered by the sorted ids `present`."""
    gaps: EpisodeRanges = []
    cursor = first
    for value in present.tolist():
        if value > cursor:
            gaps.append((cursor, value - 1))
            if len(gaps) > _MAX_NAMED_MISSING:
                return gaps
        cursor = value + 1
    if cursor <= last:
        gaps.append((cursor, last))
    return gaps
