"""Cache clean-up: remove cached data (`clear`) or what no longer serves anything (`prune`), safely beside
running servers."""

from __future__ import annotations

import contextlib
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock, Timeout

from app.errors import ProblemError
from app.store.dataset import Dataset
from app.store.segment_files import FRAME_STORE, HOT_FRAME_STORE, STORE_DIRS, Removed, clean_temps, remove_file
from app.store.segments import SegmentStore
from app.store.verify import built_frame_segments


@dataclass
class Cleanup:
    """What `clear` or `prune` removed, and what they left because a build held it."""

    removed: list[Removed] = field(default_factory=list)
    skipped: list[Path] = field(default_factory=list)  # segments being built right now
    unreadable: dict[str, str] = field(default_factory=dict)  # dataset id -> why its cache was left alone

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.removed)


def clear(dataset_dirs: list[Path]) -> Cleanup:
    """Remove every cached segment and the episode index of these dataset cache directories.

    Safe beside running servers: a segment is removed under its file lock, so one being built is skipped, and a
    worker that has the old file mapped keeps reading it (an unlinked file lives on until unmapped); the lock
    files themselves stay, since another process may be waiting on one."""
    cleanup = Cleanup()
    for directory in dataset_dirs:
        for store in STORE_DIRS:
            _remove_segments(directory / store, set(), cleanup)
        cleanup.removed += clean_temps(directory)
        cleanup.removed += remove_file(directory / "index.json")
    return cleanup


def prune(cache_root: Path, datasets: list[Dataset], kept: Collection[Path] = ()) -> Cleanup:
    """Remove what serves nothing any more: caches of datasets no root offers, segments of source files that are
    gone or changed (or whose sidecar is missing or stale), and temps of interrupted writes. The cache directories
    `kept` (of Hub datasets, which this process does not open: that would ask the Hub) keep all but their temps."""
    cleanup = Cleanup()
    current = {dataset.cache_dir.name: dataset for dataset in datasets}
    kept_names = {directory.name for directory in kept}
    directories = sorted(p for p in (cache_root / "datasets").glob("*") if p.is_dir())
    for directory in directories:
        dataset = current.get(directory.name)
        if dataset is None and directory.name in kept_names:
            cleanup.removed += clean_temps(directory)
            continue
        if dataset is None:
            orphan = clear([directory])
            cleanup.removed += orphan.removed
            cleanup.skipped += orphan.skipped
            _remove_directory(directory, cleanup)
            continue
        cleanup.removed += dataset.cleaned + clean_temps(directory)
        try:
            index = dataset.index()
        except ProblemError as exc:  # cannot tell which segments are current: keep them all
            cleanup.unreadable[dataset.id] = exc.detail
            continue
        valid = {
            SegmentStore.segment_name(source.path)
            for source in index.files
            if dataset.segments.built_size(source, index.schema) is not None
        }
        _remove_segments(directory / "segments", valid, cleanup)
        _remove_segments(directory / FRAME_STORE, _current_frame_segments(dataset, hot=False), cleanup)
        _remove_segments(directory / HOT_FRAME_STORE, _current_frame_segments(dataset, hot=True), cleanup)
    return cleanup


def _current_frame_segments(dataset: Dataset, hot: bool) -> set[str]:
    """Names of the decoded-frame segments (with `hot`, hot pixel segments) built for the dataset's current video
    files under its current tier (none of the hot ones when the server keeps no hot layer)."""
    store = dataset.hot_frames if hot else dataset.frames
    current: set[str] = set()
    for rel, schema in built_frame_segments(dataset, hot) if store is not None else []:
        with contextlib.suppress(ProblemError):  # a video gone or unreadable: its frames serve nothing
            if store.built_size(store.file_fingerprint(rel), schema) is not None:
                current.add(SegmentStore.segment_name(rel))
    return current


def _remove_segments(store: Path, keep: set[str], cleanup: Cleanup) -> None:
    """Remove the segments of a segment store directory (arrow, sidecar, build temp) except those named in
    `keep`."""
    names = {p.name.removesuffix(".arrow") for p in store.glob("*.arrow")}
    names |= {p.name.removesuffix(".json") for p in store.glob("*.json")}
    for name in sorted(names - keep):
        try:
            with FileLock(store / f"{name}.lock", timeout=0):
                for suffix in (".json", ".arrow", ".arrow.tmp"):
                    cleanup.removed += remove_file(store / f"{name}{suffix}")
        except Timeout:
            cleanup.skipped.append(store / f"{name}.arrow")


def _remove_directory(directory: Path, cleanup: Cleanup) -> None:
    """Remove an orphaned dataset cache: its lock files, then the directories if nothing else is left."""
    stores = [directory / name for name in STORE_DIRS]
    if any(p.name.endswith(".arrow") for p in cleanup.skipped if p.parent in stores):
        return
    for lock in (lock for store in stores for lock in store.glob("*.lock")):
        cleanup.removed += remove_file(lock)
    for path in [*stores, directory]:
        try:
            path.rmdir()
        except FileNotFoundError:
            continue
        except OSError:
            return
