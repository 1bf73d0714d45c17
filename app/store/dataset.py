"""A served dataset as the store holds it: its source and its episode index snapshot, kept fresh; the rows of its
files (`app.store.row_files`) and its decoded-frame cache (`app.store.frame_cache`) are objects it holds.

Every read works on one snapshot of the episode index. Source files a read touches are checked against the
snapshot's fingerprints first; when one changed, the index is reloaded and the read starts over, so a stale
row is never served. Every `rescan_interval_s`, the dataset's directories, metadata files and source files are
stat'ed again, so files added, removed or rewritten are noticed (and the index rebuilt) without a restart.
A read that must not block (see `app.reads.view_read`) asks only for what is at hand: the current snapshot when
it needs neither loading nor a look (`current_index`), and segments this process has mapped.

In an object store, whatever reads the store for a request (loading or reloading the index here; building a
segment or reading rows cold in `RowFiles`) is waited for only until the request's deadline
(`app.store.store_waits`). A store that fails or does not answer in time is a 503 naming the object
(`ObjectStoreError`), not a changed source: the index snapshot is kept, and a reload that fails keeps it too, so
what is cached keeps serving while the store is down.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from app.errors import DatasetError, TryLater
from app.settings import Settings
from app.sources import DatasetInfo, DatasetPath, Source, open_source, stamp, watched_paths
from app.sources.decoders import DecoderPool
from app.sources.files import ALL_THERE, FileSupply
from app.sources.frame_tiers import hot_tier, parse_tier
from app.sources.source import VideoFeature
from app.store.episode_index import EpisodeIndex, file_identity, load_or_build_index
from app.store.frame_budget import FrameBudget
from app.store.frame_cache import FrameCache, HotFrameCache
from app.store.mapped_segments import Segment, SegmentLRU
from app.store.read_memory import cold_read_memory
from app.store.row_files import RowFiles
from app.store.segment_builds import ProgressCallback
from app.store.segment_files import FRAME_STORE, HOT_FRAME_STORE, clean_temps
from app.store.segments import SegmentStore, SourceChanged
from app.store.store_waits import on_store
from app.store.views import EpisodeView

_ATTEMPTS = 3
T = TypeVar("T")
log = logging.getLogger("episerve.cache")


@dataclass(frozen=True)
class SharedCaches:
    """What every dataset of a process shares: the LRU of mapped segments, the video cache budget, the hot pixel
    budget (None: no hot layer), the decoders."""

    lru: SegmentLRU
    frame_budget: FrameBudget
    decoders: DecoderPool
    hot_budget: FrameBudget | None = None

    @classmethod
    def of(cls, settings: Settings) -> SharedCaches:
        lru = SegmentLRU(settings.max_open_segments)
        datasets = settings.cache_dir / "datasets"
        budget = FrameBudget(datasets, settings.video_cache_bytes, lru, FRAME_STORE)
        hot_bytes = settings.video_hot_bytes
        min_idle_s = settings.video_hot_min_idle_s
        hot = FrameBudget(datasets, hot_bytes, lru, HOT_FRAME_STORE, min_idle_s) if hot_bytes else None
        return cls(lru, budget, DecoderPool(settings.video_decoders, settings.video_decode_threads), hot)


class Dataset:
    """One dataset directory under a root, with its cache directory."""

    def __init__(
        self, dataset_id: str, path: DatasetPath, cache_dir: Path, limits: Settings, shared: SharedCaches
    ) -> None:
        self.id = dataset_id
        self.path = path
        self.cache_dir = cache_dir
        self.default_episode_column = limits.episode_column
        self.episode_column = limits.episode_column
        self.limits = limits
        self.supply: FileSupply = ALL_THERE  # how its files come to be there (a Hub dataset fetches as reads need)
        self._lock = threading.Lock()
        self._source: Source | None = None
        self._index: EpisodeIndex | None = None
        self._full_view: EpisodeView | None = None
        self._watched: list[str] = []
        self._stamp: tuple = ()
        self._index_file: tuple[int, ...] | None = None  # `index.json` as loaded: its change is a reason to look
        self._looking = threading.Lock()
        self._looked_at = 0.0  # time.monotonic() of the last look at the files
        self.checked_at: float | None = None  # epoch seconds of the same moment
        batch_bytes, verify, lru = limits.build_batch_bytes, limits.verify_on_open, shared.lru
        memory = cold_read_memory(limits.cold_read_memory)
        self.segments = SegmentStore(cache_dir / "segments", lru, batch_bytes, verify, memory=memory)
        self.rows = RowFiles(path, self.segments, limits)
        self.frames = FrameCache(cache_dir / FRAME_STORE, lru, shared.frame_budget, batch_bytes, verify)
        # The hot pixels over an encoded tier's segments (`app.sources.frame_tiers.HotPixels`), if configured.
        self.hot_frames = (
            None
            if shared.hot_budget is None
            else HotFrameCache(cache_dir / HOT_FRAME_STORE, self.frames, shared.hot_budget)
        )
        self.decoders = shared.decoders
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
            index = on_store(self.path, None, self._loaded)
        return self._look_again(index) if self._look_due() else index

    def _load(self) -> None:
        """Open the source and the index (the caller holds `_lock`). The directories are stamped before they are
        listed, so a file added meanwhile is noticed at the next look."""
        self._mark_looked()
        watched = watched_paths(self.path)
        stamped = stamp(watched)
        source = open_source(self.path, self.supply)
        size = self.limits.frame_size(self.id)
        if size is not None:
            source.info.videos = {key: camera.resized(*size) for key, camera in source.info.videos.items()}
        tier = parse_tier(self.limits.frame_tier(self.id))
        source.info.videos = {key: replace(camera, tier=tier) for key, camera in source.info.videos.items()}
        column = source.info.episode_column or self.default_episode_column
        index_path = self.cache_dir / "index.json"
        index = load_or_build_index(source, column, index_path, self._index if column == self.episode_column else None)
        self._index_file = file_identity(index_path)
        self._source, self._index, self._full_view = source, index, EpisodeView.of(index)
        self.episode_column, self._watched, self._stamp = column, watched, stamped
        self.segments.reader = self.frames.reader = source
        if self.hot_frames is not None:
            self.hot_frames.reader = source

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
                return on_store(self.path, None, lambda: self._reloaded(index))
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
        return on_store(self.path, None, lambda: self._reloaded(seen))

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

    def current_index(self) -> EpisodeIndex | None:
        """The current snapshot if it is at hand: loaded, and not due a look at the files (else None)."""
        index = self._index
        return None if index is None or self._look_due() else index

    def with_fresh_index(self, attempt: Callable[[EpisodeIndex], T]) -> T:
        """`attempt` on the current index, reloaded and retried when a source file changed under it."""
        index = self.index()
        for _ in range(_ATTEMPTS):
            try:
                return attempt(index)
            except SourceChanged:
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

    # -- the cache -----------------------------------------------------------------------------------------------

    def build(self, number: int, progress: ProgressCallback | None = None) -> Segment:
        """Build (or open) the segment of source file `number` of the current index."""
        return self.rows.build(self.index(), number, progress)

    def cache_status(self) -> dict[str, Any]:
        """Segments built / total and their bytes on disk, and the decoded-frame segments of its cameras."""
        index = self.index()
        status = self.rows.status(index)
        cameras = list(self.info().videos.values())
        if cameras:
            status["frame_segments"] = self.frames.status(cameras, index.total_rows)
            status["frame_segments"]["hot"] = self.hot_status(cameras)
        return status

    def hot_status(self, cameras: list[VideoFeature]) -> dict[str, Any] | None:
        """The hot pixel segments over the cameras' encoded tier (built, bytes, the hot budget); None when the
        server keeps no hot layer or no camera has an encoded tier."""
        if self.hot_frames is None or not any(hot_tier(camera.tier) for camera in cameras):
            return None
        sizes = self.hot_frames.published_sizes()
        return {"built": len(sizes), "bytes": sum(sizes), "budget_bytes": self.hot_frames.budget.limit}
