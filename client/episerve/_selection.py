"""What a read asks for (`Selection`: a dataset view, its columns and windows) and what comes back (`Pages`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from episerve._episodes import Episodes, episode_spec

DeltaTimestamps = Mapping[str, Sequence[float]]
Size = tuple[int, int]
ImageSize = Size | Mapping[str, Size]  # (height, width) for every camera, or per camera


def parse_image_size(value: Any) -> Size | dict[str, Size] | None:
    """`value` as an image size: None, `(height, width)` (two positive integers), or a mapping of camera names to
    such pairs. Raises ValueError for anything else."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return {_camera_name(key): _size(size, f" of {key!r}") for key, size in value.items()}
    return _size(value, "")


def _camera_name(key: Any) -> str:
    if not isinstance(key, str) or not key:
        raise ValueError(f"an image size per camera maps camera names to (height, width), got the key {key!r}")
    return key


def _size(value: Any, of: str) -> Size:
    pair = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else None
    if pair is None or len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in pair):
        raise ValueError(f"an image size{of} is (height, width), two positive integers; got {value!r}")
    return int(pair[0]), int(pair[1])


@dataclass(frozen=True)
class Selection:
    """A dataset view and the columns read from it.

    `episodes` is the spec string sent to the server (`None`: every episode), `columns` the columns in the order
    wanted (`None`: all), `delta_timestamps` the temporal windows (`{column: [seconds...]}`), `tolerance_s`
    how far an offset may be from a multiple of the frame period, and `frame_size` the (height, width) camera
    frames are wanted at when not the size the server serves them at (for every camera, or per camera).
    """

    dataset_id: str
    episodes: str | None = None
    columns: tuple[str, ...] | None = None
    delta_timestamps: dict[str, list[float]] | None = None
    tolerance_s: float | None = None
    frame_size: Size | dict[str, Size] | None = None

    @classmethod
    def of(
        cls,
        dataset_id: str,
        episodes: Episodes = None,
        columns: Sequence[str] | None = None,
        delta_timestamps: DeltaTimestamps | None = None,
        tolerance_s: float | None = None,
        frame_size: ImageSize | None = None,
    ) -> Selection:
        """A selection from the loose arguments the client methods and datasets accept."""
        windows = None
        if delta_timestamps is not None:
            windows = {column: [float(d) for d in deltas] for column, deltas in delta_timestamps.items()}
        return cls(
            dataset_id,
            episode_spec(episodes),
            tuple(columns) if columns is not None else None,
            windows,
            tolerance_s,
            parse_image_size(frame_size),
        )


@dataclass(frozen=True)
class ArrowBody:
    """One decoded Arrow response and the buffer its columns point into (writable when the client owns it).

    `arrays`: columns of the table already as the arrays `episerve._columns.table_columns` would make of them,
    lying in the same memory (rows read by reference are gathered into arrays first)."""

    table: pa.Table
    buffer: pa.Buffer
    arrays: Mapping[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class Pages:
    """The Arrow bodies of one logical read, in order, and the length of the view they come from."""

    bodies: list[ArrowBody]
    total_rows: int

    @property
    def table(self) -> pa.Table:
        tables = [body.table for body in self.bodies]
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables)

    @property
    def arrays(self) -> Mapping[str, np.ndarray]:
        """The columns of `table` already converted (see `ArrowBody.arrays`; none when there are several pages)."""
        return self.bodies[0].arrays if len(self.bodies) == 1 else {}

    @property
    def buffers(self) -> list[pa.Buffer]:
        """The response buffers, for converting columns without copying them."""
        return [body.buffer for body in self.bodies]
