"""What a read asks for (`Selection`: a dataset view, its columns and windows) and what comes back (`Pages`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from episerve._episodes import Episodes, episode_spec

DeltaTimestamps = Mapping[str, Sequence[float]]


@dataclass(frozen=True)
class Selection:
    """A dataset view and the columns read from it.

    `episodes` is the spec string sent to the server (`None`: every episode), `columns` the columns in the order
    wanted (`None`: all), `delta_timestamps` the temporal windows (`{column: [seconds...]}`) and `tolerance_s`
    how far an offset may be from a multiple of the frame period.
    """

    dataset_id: str
    episodes: str | None = None
    columns: tuple[str, ...] | None = None
    delta_timestamps: dict[str, list[float]] | None = None
    tolerance_s: float | None = None

    @classmethod
    def of(
        cls,
        dataset_id: str,
        episodes: Episodes = None,
        columns: Sequence[str] | None = None,
        delta_timestamps: DeltaTimestamps | None = None,
        tolerance_s: float | None = None,
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
        )


@dataclass(frozen=True)
class ArrowBody:
    """One decoded Arrow response and the buffer its columns point into (writable when the client owns it)."""

    table: pa.Table
    buffer: pa.Buffer


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
    def buffers(self) -> list[pa.Buffer]:
        """The response buffers, for converting columns without copying them."""
        return [body.buffer for body in self.bodies]
