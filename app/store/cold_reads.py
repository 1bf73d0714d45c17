"""Rows read straight from a source file, for requests that reach a segment before it is built.

Only the row groups holding the wanted rows are decoded (LeRobot writes one row group per episode), one at a time
from local files and a few neighbours at a time from an object store (`RowGroups.read_plan`), so the first batch
of a cold pick does not wait for whole files to be converted; the segment is built in the
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
from app.sources.source import SourceReplaced, conform_batch
from app.store.segments import SourceChanged

_DECODE_FACTOR = 5


class ColdRows:
    """Rows of one source file by stored position, decoded row group by row group."""

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

    def read_memory(self, rows: np.ndarray) -> int:
        """Memory that reading `rows` takes at its peak, estimated: one read of the plan at a time, decoding peaks
        at about five times the uncompressed size read (measured: column chunks as read, pages, decoded arrays),
        plus what the read fetches besides (an object's bytes between the wanted row groups)."""
        plan = self.groups.read_plan(self.row_groups(rows))
        costs = (_DECODE_FACTOR * int(self.groups.sizes[g].sum()) + self.groups.fetched_bytes(g) for g in plan)
        return max(costs, default=0)

    def take(self, rows: np.ndarray, schema: pa.Schema, columns: list[str] | None) -> pa.Table:
        """`rows` (ascending stored positions, duplicates allowed) with the dataset's unified `schema`.

        Row groups are read as the plan groups them and only the wanted rows of each read are kept, so the peak
        memory is about one read's decoded row groups whatever the number of groups touched."""
        wanted = schema if columns is None else pa.schema([schema.field(c) for c in columns], metadata=schema.metadata)
        offsets = self.groups.offsets
        group_of = np.searchsorted(offsets, rows, side="right") - 1
        pieces: list[pa.RecordBatch] = []
        for groups in self.groups.read_plan(np.unique(group_of)) if len(rows) else []:
            chosen = np.isin(group_of, groups)
            counts = offsets[np.array(groups) + 1] - offsets[groups]
            starts = dict(zip(groups, np.concatenate(([0], np.cumsum(counts)[:-1])).tolist(), strict=True))
            first_in_read = np.array([starts[g] for g in group_of[chosen].tolist()], dtype=np.int64)
            with _replaced_is_changed():
                table = self.groups.read(groups, wanted)
            picked = table.take(pa.array(rows[chosen] - offsets[group_of[chosen]] + first_in_read))
            del table
            pieces.extend(conform_batch(b, wanted) for b in picked.combine_chunks().to_batches())
        return pa.Table.from_batches(pieces, schema=wanted)


@contextlib.contextmanager
def _replaced_is_changed() -> Iterator[None]:
    """An object found re-uploaded since the index fingerprinted it (its ETag checked on every read) is a changed
    source: the index is rebuilt and the read starts over, so no row of another version is ever served."""
    try:
        yield
    except SourceReplaced as exc:
        raise SourceChanged(exc.detail) from exc


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
