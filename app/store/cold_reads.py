"""Rows read straight from a source file, for requests that reach a segment before it is built.

Only the row groups holding the wanted rows are decoded (LeRobot writes one row group per episode), one at a time,
so the first batch of a cold pick does not wait for whole files to be converted; the segment is built in the
background meanwhile. Bounded twice: per request, the caller checks `row_group_bytes` against
`EPISERVE_COLD_READ_BYTES` first; per worker, `ColdReadMemory` lets concurrent cold reads decode at most
`EPISERVE_COLD_READ_MEMORY` bytes of row groups at once (more wait their turn), and hands the decoded memory back
to the OS when the last one ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import threading
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from app.sources import RowGroups, Source
from app.sources.source import conform_batch

_DECODE_FACTOR = 5


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

    def read_memory(self, rows: np.ndarray) -> int:
        """Memory that reading `rows` takes at its peak, estimated: one row group at a time is read, and decoding
        one peaks at about five times its uncompressed size (measured: column chunks as read, pages, decoded arrays)."""
        return _DECODE_FACTOR * int(self.groups.sizes[self.row_groups(rows)].max(initial=0))

    def take(self, rows: np.ndarray, schema: pa.Schema, columns: list[str] | None) -> pa.Table:
        """`rows` (ascending stored positions, duplicates allowed) with the dataset's unified `schema`.

        Row groups are read one at a time and only the wanted rows of each are kept, so the peak memory is about
        one decoded row group whatever the number of groups touched."""
        wanted = schema if columns is None else pa.schema([schema.field(c) for c in columns], metadata=schema.metadata)
        offsets = self.groups.offsets
        group_of = np.searchsorted(offsets, rows, side="right") - 1
        bounds = np.flatnonzero(np.diff(group_of)) + 1
        pieces: list[pa.RecordBatch] = []
        for positions in np.split(rows, bounds) if len(rows) else []:
            group = int(group_of[np.searchsorted(rows, positions[0])])
            table = self.groups.read(group, wanted)
            picked = table.take(pa.array(positions - offsets[group]))
            del table
            pieces.extend(conform_batch(b, wanted) for b in picked.combine_chunks().to_batches())
        return pa.Table.from_batches(pieces, schema=wanted)


class ColdReadMemory:
    """A byte budget shared by a worker's concurrent cold reads: `reserve` waits until the bytes are free.

    A read larger than the whole budget reserves all of it (it runs alone). Each read hands its decoded memory
    back to the OS when it ends (the last one in flight trims the C heap too): otherwise a burst of cold reads
    leaves the worker holding its peak for good."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.in_use = 0
        self.waits = 0  # reads that had to wait for others (for tests and tuning)
        self._condition = threading.Condition()

    @contextlib.contextmanager
    def reserve(self, nbytes: int) -> Iterator[None]:
        """Hold `nbytes` (at most the whole budget) of the budget for the duration of the block."""
        nbytes = min(nbytes, self.capacity)
        with self._condition:
            if self.in_use + nbytes > self.capacity:
                self.waits += 1
                self._condition.wait_for(lambda: self.in_use + nbytes <= self.capacity)
            self.in_use += nbytes
        try:
            yield
        finally:
            with self._condition:
                self.in_use -= nbytes
                idle = self.in_use == 0
                self._condition.notify_all()
            release_free_memory(trim=idle)


@functools.cache
def cold_read_memory(capacity: int) -> ColdReadMemory:
    """The process-wide budget for this capacity (one per worker process in practice)."""
    return ColdReadMemory(capacity)


def release_free_memory(trim: bool) -> None:
    """Return free memory to the OS: Arrow's pool, and with `trim` glibc's heap (numpy, Python) as well.

    Arrow's default pool (mimalloc) keeps freed pages in per-thread heaps, and releasing collects only the
    calling thread's heap: each thread that decoded calls this itself."""
    pa.default_memory_pool().release_unused()
    trim_heap = _malloc_trim() if trim else None
    if trim_heap is not None:
        trim_heap(0)


@functools.cache
def _malloc_trim() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None
