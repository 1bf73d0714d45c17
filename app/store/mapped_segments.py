"""Open segments: zero-copy record batches over a memory-mapped Arrow IPC file, and the bounded LRU of those a
process keeps mapped, so huge datasets cannot exhaust file descriptors or `vm.max_map_count`.

A mapped file truncated since (by another process, or a full disk) would raise SIGBUS when a page past its new end
is read, which kills the worker: every request re-checks the segments it is about to read
(`Segment.changed_on_disk`).
"""

from __future__ import annotations

import bisect
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from app import metrics
from app.sources import SourceFingerprint

_UNKNOWN = object()  # not looked at yet (None is an answer)
_SELECTIONS_REMEMBERED = 16
V = TypeVar("V")


def _remembered(cache: dict[Any, V], key: Any, compute: Callable[[], V]) -> V:
    """`cache[key]`, computed on first use. Per-selection caches of a segment keep a few selections: a full one is
    emptied rather than grown (clients use a handful of column selections)."""
    found = cache.get(key, _UNKNOWN)
    if found is _UNKNOWN:
        found = compute()
        if len(cache) >= _SELECTIONS_REMEMBERED:
            cache.clear()
        cache[key] = found
    return found  # type: ignore[return-value]


@dataclass(eq=False)
class Segment:
    """An open, validated segment: zero-copy record batches over a memory map (one object per map: compared and
    hashed by identity)."""

    name: str
    source: SourceFingerprint
    batches: list[pa.RecordBatch]
    batch_offsets: np.ndarray  # row offset of each batch, plus the total at the end
    nbytes: int
    path: Path | None = None  # the mapped file, re-checked by `changed_on_disk`
    inode: int | None = None
    mtime_ns: int | None = None  # with `inode` and `nbytes`, tells this file from a later rebuild at the same path
    _projections: dict[tuple[str, ...], list[pa.RecordBatch]] = field(default_factory=dict, repr=False)
    _row_bytes: dict[tuple[str, ...] | None, float] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._offsets_list = self.batch_offsets.tolist()
        self._path_text = str(self.path) if self.path is not None else ""  # os.stat of a str is the cheapest

    @property
    def num_rows(self) -> int:
        return int(self.batch_offsets[-1])

    def changed_on_disk(self) -> str | None:
        """None while the mapped file may still be read; else how it changed: "truncated" in place, or "replaced"
        at its path by another file (one `stat`, about a microsecond).

        Reading a mapped page past the end of a truncated file raises SIGBUS, which kills the worker, so every
        request re-checks the segments it is about to read. Another file at the path (a rebuild in another
        process) says nothing of the one mapped here, which may have been truncated before it was rebuilt (a worker
        died reading it, and its replacement rebuilt it): that map is let go too. An unlinked file (evicted) is
        still read whole."""
        if self.path is None:
            return None
        try:
            stat = os.stat(self._path_text)
        except OSError:
            return None  # unlinked: the mapped inode lives on, untouched
        if stat.st_ino != self.inode:
            return "replaced"
        return "truncated" if stat.st_size < self.nbytes else None

    def at_path(self) -> bool:
        """Whether the file at `path` is still the one mapped here (not unlinked by an eviction, nor replaced by a
        rebuild in another process): what a reader of that path would find."""
        if self.path is None:
            return False
        try:
            stat = os.stat(self._path_text)
        except OSError:
            return False
        return (stat.st_ino, stat.st_size, stat.st_mtime_ns) == (self.inode, self.nbytes, self.mtime_ns)

    def slice(self, start: int, stop: int, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
        """Rows [start, stop) as zero-copy slices of the stored batches."""
        number = int(np.searchsorted(self.batch_offsets, start, side="right")) - 1
        while start < stop:
            offset = int(self.batch_offsets[number])
            end = min(stop, int(self.batch_offsets[number + 1]))
            piece = self.batches[number].slice(start - offset, end - start)
            yield piece.select(columns) if columns is not None else piece
            start = end
            number += 1

    def row(self, row: int, columns: list[str] | None = None) -> pa.RecordBatch:
        """One stored row as a zero-copy, one-row slice."""
        number = bisect.bisect_right(self._offsets_list, row) - 1
        return self.projected(columns)[number].slice(row - self._offsets_list[number], 1)

    def projected(self, columns: list[str] | None) -> list[pa.RecordBatch]:
        """The stored batches restricted to `columns` (zero-copy; remembered per selection)."""
        if columns is None:
            return self.batches
        return _remembered(self._projections, tuple(columns), lambda: [b.select(columns) for b in self.batches])

    def row_bytes(self, columns: list[str] | None = None) -> float:
        """Average stored bytes per row of the selected columns (remembered per selection)."""
        key = None if columns is None else tuple(columns)
        return _remembered(
            self._row_bytes, key, lambda: sum(b.nbytes for b in self.projected(columns)) / max(1, self.num_rows)
        )

    def take(self, rows: np.ndarray, columns: list[str] | None = None) -> list[pa.RecordBatch]:
        """Rows at the given positions (ascending), gathered batch by batch so no whole column is touched."""
        numbers = np.searchsorted(self.batch_offsets, rows, side="right") - 1
        bounds = np.flatnonzero(np.diff(numbers)) + 1
        pieces = []
        batches = self.projected(columns)
        for group in np.split(np.arange(len(rows)), bounds):
            number = int(numbers[group[0]])
            pieces.append(batches[number].take(pa.array(rows[group] - self.batch_offsets[number])))
        return pieces


def map_segment(path: Path, source: SourceFingerprint, schema: pa.Schema, nbytes: int) -> Segment | None:
    """The Arrow IPC file at `path` mapped as the segment of `source`, if it holds `schema` and `source.rows`
    rows; None otherwise, or when it cannot be read."""
    try:
        stat = path.stat()
        reader = pa.ipc.open_file(pa.memory_map(str(path)))
        if not reader.schema.equals(schema, check_metadata=True):
            return None
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
    except (OSError, pa.ArrowException):
        return None
    offsets = np.zeros(len(batches) + 1, dtype=np.int64)
    np.cumsum([b.num_rows for b in batches], out=offsets[1:])
    if offsets[-1] != source.rows:
        return None
    return Segment(path.stem, source, batches, offsets, nbytes, path, stat.st_ino, stat.st_mtime_ns)


class SegmentLRU:
    """Process-wide bounded map of open segments, least recently used evicted first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, Segment] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, source: SourceFingerprint) -> Segment | None:
        with self._lock:
            segment = self._items.get(key)
            if segment is None:
                return None
            if segment.source != source:
                del self._items[key]
                return None
            self._items.move_to_end(key)
            return segment

    def put(self, key: str, segment: Segment) -> None:
        with self._lock:
            self._items[key] = segment
            self._items.move_to_end(key)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)  # mapped buffers stay valid while a response still uses them
            metrics.OPEN_SEGMENTS.set(len(self._items))

    def discard(self, key: str) -> None:
        with self._lock:
            self._items.pop(key, None)
            metrics.OPEN_SEGMENTS.set(len(self._items))

    def __len__(self) -> int:
        return len(self._items)
