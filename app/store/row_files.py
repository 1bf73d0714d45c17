"""The rows of a dataset's source files: each file's segment (mapped, built on demand or in the background) and,
while a segment is not built yet, the file's rows read cold (`app.store.cold_reads`) within the cold-read budgets.

In an object store, whatever reads the store for a request (building a segment, reading rows cold) is waited for
only until the request's deadline (`app.store.store_waits`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from app.settings import Settings
from app.sources import DatasetPath, Source
from app.sources.files import is_remote_path
from app.store.cold_reads import ColdRows, cold_readers
from app.store.episode_index import EpisodeIndex
from app.store.mapped_segments import Segment
from app.store.read_memory import cold_read_memory
from app.store.segment_builds import BuildProgress, ProgressCallback
from app.store.segments import SegmentStore, SourceChanged
from app.store.store_waits import on_store

RowSource = Segment | ColdRows  # where a read finds a file's rows: its segment, or (cold) the source file


class RowFiles:
    """The segments of one dataset's source files (`segments`) and cold reads of those not built yet."""

    def __init__(self, path: DatasetPath, segments: SegmentStore, limits: Settings) -> None:
        self.path, self.segments, self.limits = path, segments, limits

    @property
    def source(self) -> Source:
        source = self.segments.reader
        assert source is not None, "an index snapshot comes with its source"
        return source

    def segment(self, index: EpisodeIndex, number: int) -> Segment:
        """The segment of source file `number`, built first if needed."""
        fingerprint, schema = index.files[number], index.schema
        if not is_remote_path(self.path):
            return self.segments.open(fingerprint, schema)
        segment = self.segments.open_if_built(fingerprint, schema)  # no store thread for what is cached
        return segment or on_store(self.path, fingerprint.path, lambda: self.segments.open(fingerprint, schema))

    def mapped(self, index: EpisodeIndex, number: int) -> Segment | None:
        """The segment of source file `number` if this process has it mapped already."""
        return self.segments.opened(index.files[number])

    def built(self, index: EpisodeIndex, number: int) -> Segment | None:
        """The segment of source file `number` if it is built (mapped first if need be); None, without waiting,
        while it is not."""
        return self.segments.open_if_built(index.files[number], index.schema)

    def forget(self, segment: Segment) -> None:
        """Unmap a segment (one evicted or rebuilt by another process since), so the next read maps the file now
        at its path."""
        self.segments.forget(segment)

    def build(self, index: EpisodeIndex, number: int, progress: ProgressCallback | None = None) -> Segment:
        """Build (or open) the segment of source file `number`, reporting `progress`."""
        return self.segments.open(index.files[number], index.schema, progress)

    def sources(self, index: EpisodeIndex, files: np.ndarray, stored: np.ndarray) -> dict[int, RowSource]:
        """Per touched file, its segment; or, while the segment is not built yet, its rows read cold from the
        source (if they fit the cold-read budget), whose build `queue_builds` then queues in the background."""
        budget = self.limits.cold_read_bytes
        sources: dict[int, RowSource] = {}
        for number in np.unique(files).tolist():
            fingerprint = index.files[number]
            segment = self.segments.open_if_built(fingerprint, index.schema) if budget else None
            if segment is None and budget:
                opening = functools.partial(ColdRows, self.source, fingerprint.path, fingerprint.etag)
                try:
                    cold = on_store(self.path, fingerprint.path, opening)
                except (OSError, pa.ArrowException) as exc:
                    raise SourceChanged(fingerprint.path) from exc
                cost = cold.row_group_bytes(stored[files == number])
                if cost <= budget:
                    budget -= cost
                    sources[number] = cold
                    continue
            sources[number] = segment or self.segment(index, number)
        return sources

    def queue_builds(self, index: EpisodeIndex, numbers: Iterable[int]) -> None:
        """Queue the background builds of source files `numbers`' segments. A cold read queues them once its rows
        are read: started before, the builds' reads of the same files would compete with it for the disk or the
        store (and the first batch would wait)."""
        for number in numbers:
            self.segments.build_in_background(index.files[number], index.schema)

    def cold_take(self, index: EpisodeIndex, cold: ColdRows, rows: np.ndarray, names: list[str] | None) -> pa.Table:
        """Stored `rows` (ascending) of a file read cold, within the worker's cold-read memory budget and cores;
        `SourceChanged` when the file changed under us, `ObjectStoreError` when the store failed to answer."""
        budget = cold_read_memory(self.limits.cold_read_memory)

        def read() -> pa.Table:
            with cold_readers(), budget.reserve(cold.read_memory(rows, index.schema, names)):
                return cold.take(rows, index.schema, names)

        try:
            return on_store(self.path, cold.path, read)
        except (OSError, IndexError, pa.ArrowException) as exc:
            raise SourceChanged(cold.path) from exc

    def unbuilt_rows(self, index: EpisodeIndex, numbers: Iterable[int]) -> int:
        """Rows of the given source files whose segments are not built yet (cheap: no read)."""
        files = index.files
        return sum(files[n].rows for n in numbers if self.segments.built_size(files[n], index.schema) is None)

    def building(self) -> list[BuildProgress]:
        """Builds of these segments under way in this process."""
        return list(self.segments.building.values())

    def status(self, index: EpisodeIndex) -> dict[str, Any]:
        """Segments built / total and their bytes on disk."""
        sizes = [self.segments.built_size(fingerprint, index.schema) for fingerprint in index.files]
        built = [size for size in sizes if size is not None]
        return {"segments_built": len(built), "segments_total": len(index.files), "bytes": sum(built)}
