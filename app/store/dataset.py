"""A served dataset as the store holds it: its source, its episode index snapshot and its segments.

Every read works on one snapshot of the episode index. Source files a read touches are checked against the
snapshot's fingerprints first; when one changed, the index is reloaded and the read starts over, so a stale
row is never served. Every `rescan_interval_s`, the dataset's directories, metadata files and source files are
stat'ed again, so files added, removed or rewritten are noticed (and the index rebuilt) without a restart.
Reads that must not block (see `app.reads`) say so with `may_block=False`: then anything
that would load, map, build or reload raises `WouldBlock` before doing it.

In an object store, whatever reads the store for a request (loading or reloading the index, building a segment,
reading rows cold) is waited for only until the request's deadline (`app.store.store_waits`). A store that fails
or does not answer in time is a 503 naming the object (`ObjectStoreError`), not a changed source: the index
snapshot is kept, and a reload that fails keeps it too, so what is cached keeps serving while the store is down.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from app.errors import DatasetError, TryLater, WouldBlock
from app.settings import Settings
from app.sources import DatasetInfo, DatasetPath, Source, SourceFingerprint, open_source, stamp, watched_paths
from app.sources.decoders import DecoderPool
from app.sources.files import is_remote_path
from app.store.cold_reads import ColdRows, cold_read_memory
from app.store.episode_index import EpisodeIndex, file_identity, load_or_build_index
from app.store.frame_budget import FrameBudget
from app.store.segments import (
    BuildProgress,
    ProgressCallback,
    Segment,
    SegmentLRU,
    SegmentStore,
    SourceChanged,
    clean_temps,
    estimated_segment_bytes,
)
from app.store.store_waits import wait_on_store
from app.store.views import EpisodeView

_ATTEMPTS = 3
T = TypeVar("T")
log = logging.getLogger("episerve.cache")

RowSource = Segment | ColdRows  # where a read finds a file's rows: its segment, or (cold) the source file


class Dataset:
    """One dataset directory under a root, with its cache directory."""

    def __init__(
        self,
        dataset_id: str,
        path: DatasetPath,
        cache_dir: Path,
        episode_column: str,
        lru: SegmentLRU,
        limits: Settings,
        frame_budget: FrameBudget | None = None,
        decoders: DecoderPool | None = None,
    ) -> None:
        self.id = dataset_id
        self.path = path
        self.cache_dir = cache_dir
        self.default_episode_column = episode_column
        self.episode_column = episode_column
        self.limits = limits
        self._lock = threading.Lock()
        self._source: Source | None = None
        self._index: EpisodeIndex | None = None
        self._full_view: EpisodeView | None = None
        self._other_files: dict[str, SourceFingerprint] = {}
        self._watched: list[str] = []
        self._stamp: tuple = ()
        self._index_file: tuple[int, ...] | None = None  # `index.json` as loaded: its change is a reason to look
        self._looking = threading.Lock()
        self._looked_at = 0.0  # time.monotonic() of the last look at the files
        self.checked_at: float | None = None  # epoch seconds of the same moment
        self.segments = SegmentStore(cache_dir / "segments", lru, limits.build_batch_bytes, limits.verify_on_open)
        self.frames = SegmentStore(
            cache_dir / "frames", lru, limits.build_batch_bytes, limits.verify_on_open, builder="frames"
        )
        self.frame_budget = frame_budget or FrameBudget(cache_dir.parent, limits.video_cache_bytes, lru)
        self.decoders = decoders or DecoderPool(limits.video_decoders, limits.video_decode_threads)
        self.cleaned = clean_temps(cache_dir)  # left by interrupted writes; never another process's write under way

    @staticmethod
    def cache_key(dataset_id: str, path: DatasetPath) -> str:
        """Directory name of the dataset's cache: readable, and distinct for distinct source directories."""
        digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
        return f"{dataset_id.replace('/', '__')}-{digest}"

    # -- the index snapshot --------------------------------------------------------------------------------------

    def info(self) -> DatasetInfo:
        """What the dataset's metadata says (as of the current index)."""
        return self.source().info

    def source(self) -> Source:
        """The dataset's source, as of the current index (read with the index on first use)."""
        if self._source is None:
            self.index()
        assert self._source is not None
        return self._source

    def index(self) -> EpisodeIndex:
        """The current episode index snapshot, opened on first use, and re-checked against the files on disk
        when `rescan_interval_s` has passed since the last look."""
        index = self._index
        if index is None:
            index = self._on_store(None, self._loaded)
        return self._look_again(index) if self._look_due() else index

    def _load(self) -> None:
        """Open the source and the index (the caller holds `_lock`). The directories are stamped before they are
        listed, so a file added meanwhile is noticed at the next look."""
        self._mark_looked()
        watched = watched_paths(self.path)
        stamped = stamp(watched)
        source = open_source(self.path)
        size = self.limits.frame_size(self.id)
        if size is not None:
            source.info.videos = {key: camera.resized(*size) for key, camera in source.info.videos.items()}
        column = source.info.episode_column or self.default_episode_column
        index_path = self.cache_dir / "index.json"
        index = load_or_build_index(source, column, index_path, self._index if column == self.episode_column else None)
        self._index_file = file_identity(index_path)
        self._source, self._index, self._full_view = source, index, EpisodeView.of(index)
        self.episode_column, self._watched, self._stamp = column, watched, stamped
        self.segments.reader = self.frames.reader = source

    def _mark_looked(self) -> None:
        self._looked_at, self.checked_at = time.monotonic(), time.time()

    def _look_due(self) -> bool:
        return time.monotonic() - self._looked_at >= self.limits.rescan_interval_s

    def _look_again(self, index: EpisodeIndex) -> EpisodeIndex:
        """`index`, or a rebuilt one when files were added, removed or changed since it was read. One thread looks
        at a time, and none while the index is being read again; the others go on with the snapshot they have."""
        if not self._looking.acquire(blocking=False):
            return index
        try:
            self._mark_looked()
            unchanged = file_identity(self.cache_dir / "index.json") == self._index_file
            if unchanged and stamp(self._watched) == self._stamp and self._sources_unchanged(index):
                return index
            if self._lock.locked():  # being read again, perhaps for a request that stopped waiting for it
                return index
            log.info("dataset %s: source files, metadata or index.json changed; re-reading its index", self.id)
            try:
                return self._on_store(None, lambda: self._reloaded(index))
            except DatasetError as exc:  # e.g. a file still being written, the store down: keep the snapshot
                log.warning("dataset %s: cannot re-read its index yet: %s", self.id, exc.detail)
                return index
        finally:
            self._looking.release()

    def _sources_unchanged(self, index: EpisodeIndex) -> bool:
        try:
            self.ensure_fresh(index, range(len(index.files)))
        except SourceChanged:
            return False
        return True

    def reload(self, seen: EpisodeIndex | None = None) -> EpisodeIndex:
        """Re-read the directory and fingerprints (unless another thread already replaced `seen`). When they cannot
        be read, the error is raised and the current snapshot kept: it goes on serving what is cached."""
        return self._on_store(None, lambda: self._reloaded(seen))

    def _loaded(self) -> EpisodeIndex:
        """The index, read first unless another thread did."""
        with self._lock:
            if self._index is None:
                self._load()
            assert self._index is not None
            return self._index

    def _reloaded(self, seen: EpisodeIndex | None) -> EpisodeIndex:
        """The index read again, unless another thread already replaced `seen`. `_load` replaces the snapshot only
        once all of it was read, so a failure leaves the current one in place."""
        with self._lock:
            if seen is None or self._index is seen:
                self._load()
            assert self._index is not None
            return self._index

    def full_view(self, index: EpisodeIndex) -> EpisodeView:
        """The view of every episode of `index` (computed once per snapshot)."""
        full = self._full_view
        return full if full is not None and self._index is index else EpisodeView.of(index)

    def with_fresh_index(self, attempt: Callable[[EpisodeIndex], T], may_block: bool = True) -> T:
        """`attempt` on the current index, reloaded and retried when a source file changed under it."""
        index = self._index
        if index is None or self._look_due():
            if not may_block:
                raise WouldBlock(f"the index of dataset {self.id!r} is not loaded yet, or its files are due a look")
            index = self.index()
        for _ in range(_ATTEMPTS):
            try:
                return attempt(index)
            except SourceChanged:
                if not may_block:
                    raise WouldBlock(f"a source file of dataset {self.id!r} changed") from None
                index = self.reload(index)
        raise TryLater(f"source files of dataset {self.id!r} keep changing; retry later")

    def ensure_fresh(self, index: EpisodeIndex, files: Iterable[int]) -> None:
        """Raise `SourceChanged` when any of the source `files` is no longer what `index` fingerprinted."""
        source = self._source
        assert source is not None, "an index snapshot comes with its source"
        for number in files:
            fingerprint = index.files[number]
            if not source.is_unchanged(fingerprint):
                raise SourceChanged(fingerprint.path)

    # -- rows of the files ---------------------------------------------------------------------------------------

    def segment(self, index: EpisodeIndex, number: int, may_block: bool = True) -> Segment:
        """The segment of source file `number`, built first if needed; without `may_block`, only if this process
        has it mapped already (else `WouldBlock`)."""
        source = index.files[number]
        if may_block:
            return self._built(source, index.schema)
        segment = self.segments.opened(source)
        if segment is None:
            raise WouldBlock(f"segment of {source.path} is not mapped yet")
        return segment

    def row_sources(self, index: EpisodeIndex, files: np.ndarray, stored: np.ndarray) -> dict[int, RowSource]:
        """Per touched file, its segment; or, while the segment is not built yet, its rows read cold from the
        source (if they fit the cold-read budget), whose build `queue_builds` then queues in the background."""
        budget = self.limits.cold_read_bytes
        sources: dict[int, RowSource] = {}
        for number in np.unique(files).tolist():
            source = index.files[number]
            segment = self.segments.open_if_built(source, index.schema) if budget else None
            if segment is None and budget:
                opening = functools.partial(ColdRows, self._source, source.path, source.etag)  # type: ignore[arg-type]
                try:
                    cold = self._on_store(source.path, opening)
                except (OSError, pa.ArrowException) as exc:
                    raise SourceChanged(source.path) from exc
                cost = cold.row_group_bytes(stored[files == number])
                if cost <= budget:
                    budget -= cost
                    sources[number] = cold
                    continue
            sources[number] = segment or self._built(source, index.schema)
        return sources

    def queue_builds(self, index: EpisodeIndex, numbers: Iterable[int]) -> None:
        """Queue the background builds of source files `numbers`' segments. A cold read queues them once its rows
        are read: started before, the builds' reads of the same files would compete with it for the disk or the
        store (and the first batch would wait)."""
        for number in numbers:
            self.segments.build_in_background(index.files[number], index.schema)

    def _built(self, source: SourceFingerprint, schema: pa.Schema) -> Segment:
        """The segment of `source`, built first if needed."""
        if not is_remote_path(self.path):
            return self.segments.open(source, schema)
        segment = self.segments.open_if_built(source, schema)  # no store thread for what is cached
        return segment or self._on_store(source.path, lambda: self.segments.open(source, schema))

    def cold_take(self, index: EpisodeIndex, cold: ColdRows, rows: np.ndarray, names: list[str] | None) -> pa.Table:
        """Stored `rows` (ascending) of a file read cold, within the worker's cold-read memory budget;
        `SourceChanged` when the file changed under us, `ObjectStoreError` when the store failed to answer."""
        budget = cold_read_memory(self.limits.cold_read_memory)

        def read() -> pa.Table:
            with budget.reserve(cold.read_memory(rows)):
                return cold.take(rows, index.schema, names)

        try:
            return self._on_store(cold.path, read)
        except (OSError, IndexError, pa.ArrowException) as exc:
            raise SourceChanged(cold.path) from exc

    def _on_store(self, rel: str | None, work: Callable[[], T]) -> T:
        """`work()`, which reads the dataset's file `rel` (None: its metadata and files): for a dataset in an
        object store, waited for only until the request's deadline (see `app.store.store_waits`)."""
        if not is_remote_path(self.path):
            return work()
        return wait_on_store(str(self.path if rel is None else self.path / rel), work)

    def file_fingerprint(self, rel: str) -> SourceFingerprint:
        """The fingerprint of a file of the dataset that is not a data file (a camera's video), remembered while
        the file stays unchanged."""
        source = self.source()
        known = self._other_files.get(rel)
        if known is None or not source.is_unchanged(known):
            known = self._other_files[rel] = source.fingerprint(rel)[0]
        return known

    def frame_segment(self, rel: str, schema: pa.Schema, build: bool, may_block: bool = True) -> Segment | None:
        """The decoded-frame segment of video file `rel` if it is built; else None (decode on demand), and with
        `build` its build queued in the background if the video cache budget has room for it. The request that
        finds a video cold is answered by decoding on demand, not after decoding the whole file. Without
        `may_block`, only a segment this process has mapped already (else `WouldBlock`)."""
        source = self.file_fingerprint(rel)
        if not may_block:
            mapped = self.frames.opened(source)
            if mapped is None:
                raise WouldBlock(f"the decoded-frame segment of {rel} is not mapped yet")
            return self._used_frames(mapped)
        segment = self.frames.open_if_built(source, schema)
        if segment is None:
            if build and not self.frames.queued(rel) and self._admit_frames(source, schema):
                self.frames.build_in_background(source, schema)
            return None
        return self._used_frames(segment)

    def build_frame_segment(self, rel: str, schema: pa.Schema) -> Segment | None:
        """The decoded-frame segment of video file `rel`, built now if it is not (None if it is larger than the
        whole video cache budget)."""
        source = self.file_fingerprint(rel)
        segment = self.frames.open_if_built(source, schema)
        if segment is None:
            if not self._admit_frames(source, schema):
                return None
            segment = self.frames.open(source, schema)
        return self._used_frames(segment)

    def _admit_frames(self, source: SourceFingerprint, schema: pa.Schema) -> bool:
        """Make room in the video cache budget for the decoded-frame segment of `source` (False: it never fits)."""
        arrow = self.frames.paths(source.path).arrow
        return self.frame_budget.admit(arrow, estimated_segment_bytes(schema, source.rows))

    def forget_frames(self, segment: Segment) -> None:
        """Unmap a decoded-frame segment this process holds (e.g. one evicted or rebuilt by another process since),
        so the next request maps the file now at its path."""
        self.frames.lru.discard(str(segment.path))

    @property
    def cache_root(self) -> Path:
        """The cache directory all datasets share (this dataset's lies in its `datasets/`)."""
        return self.cache_dir.parent.parent

    def _used_frames(self, segment: Segment) -> Segment:
        self.frame_budget.touch(self.frames.paths(segment.source.path).arrow)
        return segment

    # -- the cache -----------------------------------------------------------------------------------------------

    def build(self, number: int, progress: ProgressCallback | None = None) -> Segment:
        """Build (or open) the segment of source file `number` of the current index."""
        index = self.index()
        return self.segments.open(index.files[number], index.schema, progress)

    def unbuilt_rows(self, numbers: Iterable[int]) -> int:
        """Rows of the given source files whose segments are not built yet (cheap: no read)."""
        index = self.index()
        return sum(
            index.files[n].rows for n in numbers if self.segments.built_size(index.files[n], index.schema) is None
        )

    def builds_in_progress(self) -> list[BuildProgress]:
        """Builds of this dataset's segments under way in this process."""
        return list(self.segments.building.values())

    def cache_status(self) -> dict[str, Any]:
        """Segments built / total and their bytes on disk, and the decoded-frame segments of its cameras."""
        index = self.index()
        sizes = [self.segments.built_size(fp, index.schema) for fp in index.files]
        built = [size for size in sizes if size is not None]
        status: dict[str, Any] = {"segments_built": len(built), "segments_total": len(index.files), "bytes": sum(built)}
        if self.info().videos:
            sizes = self.frames.published_sizes()
            status["frame_segments"] = {
                "built": len(sizes),
                "bytes": sum(sizes),
                "budget_bytes": self.frame_budget.limit,
            }
        return status
