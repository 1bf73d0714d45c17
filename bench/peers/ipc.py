"""A dataset converted once into one uncompressed Arrow IPC file and read through a memory map: the local ceiling.

`MmapTable` answers the same two questions as the server (a contiguous range, rows by index) the fastest way
pyarrow allows: zero-copy slices, and takes grouped by record batch so no whole column is materialised.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

BATCH_BYTES = 8 * 1024 * 1024
SLICE_TAKE_MAX_ROWS = 4096  # above this, per-row slices cost more than batch-wise takes even for wide rows


def convert(files: Sequence[Path], out: Path) -> Path:
    """Write `files` (parquet, one schema) as one IPC file of ~8 MB record batches, unless it exists."""
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    schema = pq.read_schema(files[0])
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        for path in files:
            parquet = pq.ParquetFile(path)
            meta = parquet.metadata
            per_row = max(
                1, sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)) // meta.num_rows
            )
            for batch in parquet.iter_batches(batch_size=max(1, BATCH_BYTES // per_row)):
                writer.write_batch(batch)
    tmp.rename(out)
    return out


class MmapTable:
    """Record batches of an IPC file, memory-mapped."""

    def __init__(self, path: Path) -> None:
        reader = pa.ipc.open_file(pa.memory_map(str(path)))
        self.schema = reader.schema
        self.batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        self.offsets = np.concatenate([[0], np.cumsum([b.num_rows for b in self.batches])]).astype(np.int64)

    @property
    def wide(self) -> bool:
        """Whether rows hold variable-size binary data (encoded images)."""
        return any(_holds_binary(field.type) for field in self.schema)

    @property
    def num_rows(self) -> int:
        return int(self.offsets[-1])

    def slice(self, start: int, stop: int, columns: Sequence[str] | None = None) -> pa.Table:
        """Rows [start, stop), zero-copy."""
        first = int(np.searchsorted(self.offsets, start, side="right")) - 1
        pieces = []
        while start < stop:
            end = min(stop, int(self.offsets[first + 1]))
            pieces.append(self.batches[first].slice(start - int(self.offsets[first]), end - start))
            start, first = end, first + 1
        table = pa.Table.from_batches(pieces, self.schema)
        return table.select(list(columns)) if columns is not None else table

    def take(self, indices: Sequence[int] | np.ndarray, columns: Sequence[str] | None = None) -> pa.Table:
        """Rows at `indices`, in that order, by whichever of the two strategies is faster for this data."""
        rows = np.asarray(indices, dtype=np.int64)
        if self.wide and len(rows) <= SLICE_TAKE_MAX_ROWS:
            return self._take_by_slices(rows, columns)
        return self._take_by_batches(rows, columns)

    def _take_by_slices(self, rows: np.ndarray, columns: Sequence[str] | None) -> pa.Table:
        """One zero-copy slice per row, concatenated once in request order: cheapest for wide (binary) rows,
        where batch-wise takes cost a call per touched batch plus a second copy to restore the order."""
        numbers = np.searchsorted(self.offsets, rows, side="right") - 1
        local = rows - self.offsets[numbers]
        pieces = [self.batches[n].slice(r, 1) for n, r in zip(numbers.tolist(), local.tolist(), strict=True)]
        table = pa.Table.from_batches([pa.concat_batches(pieces)]) if pieces else self.schema.empty_table()
        return table.select(list(columns)) if columns is not None else table

    def _take_by_batches(self, rows: np.ndarray, columns: Sequence[str] | None) -> pa.Table:
        """Sorted, taken batch by batch (no whole column is touched), then put back in request order."""
        order = np.argsort(rows, kind="stable")
        ordered = rows[order]
        numbers = np.searchsorted(self.offsets, ordered, side="right") - 1
        bounds = np.flatnonzero(np.diff(numbers)) + 1
        pieces = []
        for group in np.split(np.arange(len(ordered)), bounds):
            number = int(numbers[group[0]])
            batch = self.batches[number]
            if columns is not None:
                batch = batch.select(list(columns))
            pieces.append(batch.take(pa.array(ordered[group] - self.offsets[number])))
        schema = self.schema if columns is None else pa.schema([self.schema.field(c) for c in columns])
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        return pa.Table.from_batches(pieces, schema).take(pa.array(inverse))


def _holds_binary(kind: pa.DataType) -> bool:
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return True
    return pa.types.is_struct(kind) and any(_holds_binary(kind.field(i).type) for i in range(kind.num_fields))
