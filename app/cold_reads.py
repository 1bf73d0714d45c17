"""Rows read straight from a source parquet file, for requests that reach a segment before it is built.

Only the row groups holding the wanted rows are decoded (LeRobot writes one row group per episode), so the first
batch of a cold pick does not wait for whole files to be converted; the segment is built in the background
meanwhile. Bounded: the caller checks `row_group_bytes` against its budget first.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from app.segments import conform_batch


class ParquetRows:
    """Row-group geometry of one source file, read from its footer."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = pq.ParquetFile(path)
        metadata = self.file.metadata
        counts = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
        self.offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        self.sizes = np.array([metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups)])

    def row_groups(self, rows: np.ndarray) -> np.ndarray:
        """The row groups holding `rows` (stored positions), ascending."""
        return np.unique(np.searchsorted(self.offsets, rows, side="right") - 1)

    def row_group_bytes(self, rows: np.ndarray) -> int:
        """Uncompressed bytes that reading `rows` decodes."""
        return int(self.sizes[self.row_groups(rows)].sum())

    def take(self, rows: np.ndarray, schema: pa.Schema, columns: list[str] | None) -> pa.Table:
        """`rows` (ascending stored positions, duplicates allowed) with the dataset's unified `schema`."""
        groups = self.row_groups(rows)
        table = self.file.read_row_groups(groups.tolist(), use_threads=False)
        batches = [conform_batch(b, schema) for b in table.to_batches()]
        table = pa.Table.from_batches(batches, schema=schema)
        if columns is not None:
            table = table.select(columns)
        # stored row -> position inside the rows read: offset within its group plus the rows of earlier groups read
        group_of = np.searchsorted(self.offsets, rows, side="right") - 1
        read_before = np.cumsum(np.concatenate(([0], np.diff(self.offsets)[groups])))[:-1]
        position = read_before[np.searchsorted(groups, group_of)] + (rows - self.offsets[group_of])
        return table.take(pa.array(position))
