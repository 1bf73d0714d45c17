"""Rows read straight from a source file, for requests that reach a segment before it is built.

Only the row groups holding the wanted rows are decoded (LeRobot writes one row group per episode), so the first
batch of a cold pick does not wait for whole files to be converted; the segment is built in the background
meanwhile. Bounded: the caller checks `row_group_bytes` against its budget first.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from app.sources import RowGroups, Source


class ColdRows:
    """Rows of one source file by stored position, decoded row group by row group."""

    def __init__(self, source: Source, rel: str) -> None:
        self.path = rel
        self.groups: RowGroups = source.row_groups(rel)

    def row_groups(self, rows: np.ndarray) -> np.ndarray:
        """The row groups holding `rows` (stored positions), ascending."""
        return np.unique(np.searchsorted(self.groups.offsets, rows, side="right") - 1)

    def row_group_bytes(self, rows: np.ndarray) -> int:
        """Uncompressed bytes that reading `rows` decodes."""
        return int(self.groups.sizes[self.row_groups(rows)].sum())

    def take(self, rows: np.ndarray, schema: pa.Schema, columns: list[str] | None) -> pa.Table:
        """`rows` (ascending stored positions, duplicates allowed) with the dataset's unified `schema`."""
        groups = self.row_groups(rows)
        table = self.groups.read(groups.tolist(), schema)
        if columns is not None:
            table = table.select(columns)
        # stored row -> position inside the rows read: offset within its group plus the rows of earlier groups read
        offsets = self.groups.offsets
        group_of = np.searchsorted(offsets, rows, side="right") - 1
        read_before = np.cumsum(np.concatenate(([0], np.diff(offsets)[groups])))[:-1]
        position = read_before[np.searchsorted(groups, group_of)] + (rows - offsets[group_of])
        return table.take(pa.array(position))
