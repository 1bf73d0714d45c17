"""Rows read straight from a source file, for requests that reach a segment before it is built.

Only the row groups holding the wanted rows are read (LeRobot writes one row group per episode), so the first batch
of a cold pick does not wait for whole files to be converted; the segment is built in the background meanwhile. A
read holds a bounded piece, whatever the size of a row group: a local file's row groups are decoded one at a time
in batches of about `PIECE_BYTES`, and so is an object's row group larger than 16 MiB decoded
(`app.sources.parquet.REMOTE_READ_BYTES`), its column chunks fetched by ranged GETs of a bounded buffer; an
object's smaller row groups are read a few neighbours at a time, fetched together and decoded whole, at most 16 MiB
at once (`RowGroups.read_plan`, `RowGroups.streams`). Bounded twice: per request, the caller checks
`row_group_bytes` against `EPISERVE_COLD_READ_BYTES` first; per worker, `ColdReadMemory` is the memory concurrent
cold reads and segment builds may hold at once, `EPISERVE_COLD_READ_MEMORY`: each reserves its estimated peak
(`ColdRows.read_memory`, `build_memory`) before it reads, more wait their turn, and the memory is handed back to
the OS when the last one ends.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from app.sources import RowGroups, Source
from app.sources.source import SourceReplaced
from app.store.segments import SourceChanged

PIECE_BYTES = 1024 * 1024  # decoded bytes of a row group a cold read holds at once (measured fastest, too)
_DECODE_FACTOR = 3  # a batch decoded: its arrays, their levels and builders' growth, over its uncompressed bytes
_COLUMN_READ_BYTES = 2 * 1024 * 1024  # per column read: its buffered chunk and a decompressed page
_ALLOCATOR_SLACK = 2  # resident memory over Arrow's own count of what a read holds (the allocator's free pages)


class ColdRows:
    """Rows of one source file by stored position, decoded a bounded piece of a row group at a time."""

    def __init__(self, source: Source, rel: str, etag: str = "") -> None:
        self.path = rel
        with _replaced_is_changed():
            self.groups: RowGroups = source.row_groups(rel, etag)

    def row_groups(self, rows: np.ndarray) -> np.ndarray:
        """The row groups holding `rows` (stored positions), ascending."""
        return np.unique(np.searchsorted(self.groups.offsets, rows, side="right") - 1)

    def row_group_bytes(self, rows: np.ndarray) -> int:
        """Uncompressed bytes that reading `rows` decodes."""
        return int(self.groups.sizes[self.row_groups(rows)].sum())

    def read_memory(self, rows: np.ndarray, schema: pa.Schema, columns: list[str] | None) -> int:
        """Resident memory that reading `rows` of `columns` takes at its peak, estimated from the file's metadata:
        the wanted rows copied out, plus the largest read of the plan: its batch of decoded rows (`PIECE_BYTES`,
        or the read's whole row groups when the source decodes them whole) three times over, a buffered column
        chunk and a page per column, all twice (measured: Arrow counts half of what a read keeps resident), and
        what it fetches besides (from an object: the ranges of row groups fetched whole, gaps included, or the
        column chunks' buffers of a streamed row group)."""
        names = schema.names if columns is None else columns
        group_of = np.searchsorted(self.groups.offsets, rows, side="right") - 1
        kept, largest = 0, 0
        for groups in self.groups.read_plan(np.unique(group_of)):
            decoded, count = self.groups.decoded_bytes(groups, names), self._rows_in(groups)
            per_row = decoded / max(1, count)
            kept += int(np.isin(group_of, groups).sum() * per_row)
            streams = self.groups.streams(groups)
            batch = min(decoded, max(PIECE_BYTES, int(per_row) + 1)) if streams else decoded
            held = _DECODE_FACTOR * batch + _COLUMN_READ_BYTES * len(names)
            largest = max(largest, _ALLOCATOR_SLACK * held + self.groups.fetched_bytes(groups, names))
        return kept + largest

    def take(self, rows: np.ndarray, schema: pa.Schema, columns: list[str] | None) -> pa.Table:
        """`rows` (ascending stored positions, duplicates allowed) with the dataset's unified `schema`.

        Row groups are read as the plan groups them, in batches of about `PIECE_BYTES` decoded (an object's small
        row groups read together: decoded whole), and only the wanted rows of each batch are kept: the peak memory
        is about one batch (or one such read) and the rows kept, whatever the size of a row group and the number
        of groups touched."""
        wanted = schema if columns is None else pa.schema([schema.field(c) for c in columns], metadata=schema.metadata)
        offsets = self.groups.offsets
        group_of = np.searchsorted(offsets, rows, side="right") - 1
        pieces: list[pa.RecordBatch] = []
        for groups in self.groups.read_plan(np.unique(group_of)) if len(rows) else []:
            chosen = np.isin(group_of, groups)
            counts = offsets[np.array(groups) + 1] - offsets[groups]
            starts = dict(zip(groups, np.concatenate(([0], np.cumsum(counts)[:-1])).tolist(), strict=True))
            first_in_read = np.array([starts[g] for g in group_of[chosen].tolist()], dtype=np.int64)
            positions = rows[chosen] - offsets[group_of[chosen]] + first_in_read
            per_row = self.groups.decoded_bytes(groups, wanted.names) / max(1, int(counts.sum()))
            batch_rows = max(1, int(PIECE_BYTES // max(per_row, 1.0)))
            with _replaced_is_changed():
                pieces.extend(self.groups.take(groups, wanted, positions, batch_rows))
        return pa.Table.from_batches(pieces, schema=wanted)

    def _rows_in(self, groups: list[int]) -> int:
        offsets = self.groups.offsets
        return int((offsets[np.array(groups) + 1] - offsets[groups]).sum())


@contextlib.contextmanager
def _replaced_is_changed() -> Iterator[None]:
    """An object found re-uploaded since the index fingerprinted it (its ETag checked on every read) is a changed
    source: the index is rebuilt and the read starts over, so no row of another version is ever served."""
    try:
        yield
    except SourceReplaced as exc:
        raise SourceChanged(exc.detail) from exc


@functools.cache
def cold_readers() -> threading.BoundedSemaphore:
    """The cold reads a worker decodes at once: one per core it may run on. Each decodes whole row groups up to its
    last wanted row, the CPU the background builds need to end the cold reads of their files; more at once only
    make every read and build slower (8 files of one 24 MB row group, 32 clients: 48 answers in 20 s, the builds
    unfinished, against thousands with the cores' worth)."""
    return threading.BoundedSemaphore(max(1, len(os.sched_getaffinity(0))))
