"""Temporal windows with LeRobot `delta_timestamps` semantics, computed for a whole batch at once.

For a view row `i` in an episode occupying view rows [lo, hi) and a frame offset `k = round(d * fps)`, the
window value is the row `clamp(i + k, lo, hi - 1)`, and `<column>_is_pad` is true where `i + k` fell outside
[lo, hi). Windows never cross episode boundaries; they may cross source files. All of it is numpy over
index arrays: one gather per windowed column, no Python loop per row or per offset.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from app.errors import InvalidInput, OverLimit

DEFAULT_TOLERANCE_S = 1e-4
PAD_SUFFIX = "_is_pad"


@dataclass(frozen=True)
class WindowRequest:
    """What a client asks for: `{column: [seconds, ...]}` and the grid tolerance."""

    delta_timestamps: Mapping[str, Sequence[float]]
    tolerance_s: float = DEFAULT_TOLERANCE_S


@dataclass(frozen=True)
class WindowSpec:
    """Frame offsets per windowed column, in the order the caller gave the columns."""

    offsets: dict[str, np.ndarray]

    @property
    def widest(self) -> int:
        return max(len(v) for v in self.offsets.values())


def parse_windows(
    delta_timestamps: Mapping[str, Sequence[float]],
    *,
    fps: float | None,
    schema: pa.Schema,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    max_offsets: int,
) -> WindowSpec:
    """Validate `{column: [seconds, ...]}` and turn it into frame offsets."""
    if not delta_timestamps:
        raise InvalidInput("delta_timestamps is empty; omit it for no windows")
    if not math.isfinite(tolerance_s) or tolerance_s < 0:
        raise InvalidInput(f"tolerance_s must be a finite number >= 0, got {tolerance_s}")
    if fps is None:
        raise InvalidInput("this dataset has no fps, so delta_timestamps cannot be converted to frames")
    offsets: dict[str, np.ndarray] = {}
    for column, deltas in delta_timestamps.items():
        if column not in schema.names:
            raise InvalidInput(f"delta_timestamps names unknown column {column!r}; available: {schema.names}")
        if column.endswith(PAD_SUFFIX) and column[: -len(PAD_SUFFIX)] in delta_timestamps:
            raise InvalidInput(f"column {column!r} would collide with the pad mask of {column[:-7]!r}")
        offsets[column] = _frame_offsets(column, deltas, fps, tolerance_s, max_offsets)
    return WindowSpec(offsets)


# Frame offsets beyond this reach past every episode: they clamp and pad exactly like any larger one, and keep
# `row + offset` far from int64 overflow (a 1e18 s offset must pad with the last frame, not wrap to the first).
MAX_FRAME_OFFSET = 2**53
# Beyond this many seconds an offset is past every episode at any fps; huge integers become this before they
# meet float64, which they would overflow.
_MAX_SECONDS = 1e300


def _frame_offsets(column: str, deltas: Sequence[float], fps: float, tolerance_s: float, limit: int) -> np.ndarray:
    if len(deltas) == 0:
        raise InvalidInput(f"delta_timestamps[{column!r}] is empty; give at least one offset")
    if len(deltas) > limit:
        raise OverLimit(f"delta_timestamps[{column!r}] has {len(deltas)} offsets; the limit is {limit}", limit)
    seconds = _as_seconds(column, deltas)
    frames = seconds * fps
    rounded = np.rint(frames)  # half-to-even, like Python's round() that LeRobot uses
    # Past 2**53 every float64 is a whole number of frames: such offsets are on the grid, however large.
    within = np.abs(frames) < MAX_FRAME_OFFSET
    off_grid = within & (np.abs(frames - rounded) / fps > tolerance_s)
    if off_grid.any():
        pairs = zip(seconds[off_grid][:5].tolist(), (rounded[off_grid][:5] / fps).tolist(), strict=True)
        shown = ", ".join(f"{d!r} (nearest valid: {nearest!r})" for d, nearest in pairs)
        raise InvalidInput(
            f"delta_timestamps[{column!r}] has offsets off the 1/{fps:g} s frame grid "
            f"(tolerance_s={tolerance_s:g}): {shown}"
        )
    return np.clip(rounded, -MAX_FRAME_OFFSET, MAX_FRAME_OFFSET).astype(np.int64)


def _as_seconds(column: str, deltas: Sequence[float]) -> np.ndarray:
    """The offsets as float64 seconds: non-finite ones refused, integers too large for a float bounded."""
    bad = [d for d in deltas if isinstance(d, float) and not math.isfinite(d)]
    if bad:
        raise InvalidInput(
            f"delta_timestamps[{column!r}] holds non-finite offsets: {bad[:5]}; offsets are finite numbers of seconds"
        )
    try:
        return np.asarray(deltas, dtype=np.float64)
    except OverflowError:  # an integer past float64's range: as far past every episode as _MAX_SECONDS
        bounded = [min(max(d, -_MAX_SECONDS), _MAX_SECONDS) for d in deltas]
        return np.asarray(bounded, dtype=np.float64)


def window_targets(
    rows: np.ndarray, episode_lo: np.ndarray, episode_hi: np.ndarray, offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(n, T) view rows each window reads, clamped into the row's episode, and the (n, T) pad mask."""
    wanted = rows[:, None] + offsets[None, :]
    lo, hi = episode_lo[:, None], episode_hi[:, None]
    return np.clip(wanted, lo, hi - 1), (wanted < lo) | (wanted >= hi)


def as_windows(values: pa.Array, width: int) -> pa.FixedSizeListArray:
    """Row-major gathered values (n * width) as a fixed-size list column of `width`."""
    return pa.FixedSizeListArray.from_arrays(values, width)


def pad_column(mask: np.ndarray) -> pa.FixedSizeListArray:
    """An (n, T) bool mask as a fixed-size list<bool>[T] column."""
    return pa.FixedSizeListArray.from_arrays(pa.array(mask.reshape(-1), type=pa.bool_()), mask.shape[1])
