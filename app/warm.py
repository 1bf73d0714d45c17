"""Cache warm-up, verification and clean-up: build the segments an episode selection needs, check segments on
disk, remove cached data (`clear`) or what no longer serves anything (`prune`).

Plain functions for the CLI, plus a small per-process registry of background warm-up jobs for the API.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock, Timeout

from app.dataset import Dataset
from app.episode_spec import EpisodeRanges
from app.errors import EpiserveError
from app.segments import ProgressCallback, Removed, SegmentStore, clean_temps

log = logging.getLogger("episerve.cache")


def segments_needed(dataset: Dataset, episodes: EpisodeRanges | None) -> list[int]:
    """Source file numbers holding rows of the selected episodes."""
    index = dataset.index()
    view = dataset.resolve(index, episodes)
    return sorted(set(np.unique(view.run_file).tolist()))


def warm(
    dataset: Dataset,
    episodes: EpisodeRanges | None = None,
    progress: ProgressCallback | None = None,
    on_segment: Callable[[], None] | None = None,
) -> int:
    """Build every segment the selection needs, `build_threads` at a time; return how many this call built.

    `progress` and `on_segment` are called one at a time, whichever build thread reports."""
    index = dataset.index()
    needed = segments_needed(dataset, episodes)
    before = dataset.segments.builds
    reporting = threading.Lock()

    def report(rows: int, nbytes: int) -> None:
        with reporting:
            progress(rows, nbytes)  # type: ignore[misc]

    def build(number: int) -> None:
        dataset.segments.open(index.files[number], index.schema, report if progress is not None else None)
        if on_segment is not None:
            with reporting:
                on_segment()

    threads = min(dataset.limits.build_threads, len(needed))
    if threads <= 1:
        for number in needed:
            build(number)
    else:
        # Parquet decoding releases the GIL, so builds of different files run side by side.
        with ThreadPoolExecutor(threads, thread_name_prefix="episerve-warm-build") as pool:
            futures = [pool.submit(build, number) for number in needed]
            try:
                for future in futures:
                    future.result()
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
    return dataset.segments.builds - before


@dataclass
class VerifyReport:
    """What `verify` found for one dataset."""

    dataset: str
    checked: int = 0
    absent: int = 0
    damaged: dict[str, str] = field(default_factory=dict)
    rebuilt: list[str] = field(default_factory=list)


def verify(dataset: Dataset, rebuild: bool = False) -> VerifyReport:
    """Check every segment on disk against its sidecar (size, checksum, schema, rows); optionally rebuild."""
    index = dataset.index()
    report = VerifyReport(dataset.id)
    for source in index.files:
        if not dataset.segments.paths(source.path).arrow.exists():
            report.absent += 1
            continue
        report.checked += 1
        problem = dataset.segments.verify(source, index.schema)
        if problem is None:
            continue
        report.damaged[source.path] = problem
        if rebuild:
            dataset.segments.discard(source)
            dataset.segments.open(source, index.schema)
            report.rebuilt.append(source.path)
    return report


@dataclass
class WarmJob:
    """A background warm-up of one dataset, as `GET /cache` reports it."""

    state: str  # running, done, failed
    segments_total: int
    segments_done: int = 0
    started: float = field(default_factory=time.time)
    finished: float | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Warmer:
    """Runs warm-ups in a background thread; one job per dataset at a time."""

    def __init__(self, threads: int = 1) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="episerve-warm")
        self._jobs: dict[str, WarmJob] = {}
        self._lock = threading.Lock()

    def job(self, dataset_id: str) -> WarmJob | None:
        return self._jobs.get(dataset_id)

    def start(self, dataset: Dataset, episodes: EpisodeRanges | None) -> WarmJob:
        """Start warming (or return the job already running for this dataset)."""
        needed = segments_needed(dataset, episodes)  # validates the selection before anything runs
        with self._lock:
            running = self._jobs.get(dataset.id)
            if running is not None and running.state == "running":
                return running
            job = self._jobs[dataset.id] = WarmJob("running", len(needed))
        self._pool.submit(self._run, dataset, episodes, job)
        return job

    @staticmethod
    def _run(dataset: Dataset, episodes: EpisodeRanges | None, job: WarmJob) -> None:
        def segment_done() -> None:
            job.segments_done += 1

        try:
            warm(dataset, episodes, on_segment=segment_done)
            job.state = "done"
        except Exception as exc:  # reported through GET /cache; the server keeps running
            log.exception("warming %s failed", dataset.id)
            job.state, job.error = "failed", str(exc)
        finally:
            job.finished = time.time()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


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
        _remove_segments(directory, set(), cleanup)
        cleanup.removed += clean_temps(directory)
        cleanup.removed += _remove_file(directory / "index.json")
    return cleanup


def prune(cache_root: Path, datasets: list[Dataset]) -> Cleanup:
    """Remove what serves nothing any more: caches of datasets no root offers, segments of source files that are
    gone or changed (or whose sidecar is missing or stale), and temps of interrupted writes."""
    cleanup = Cleanup()
    current = {dataset.cache_dir.name: dataset for dataset in datasets}
    directories = sorted(p for p in (cache_root / "datasets").glob("*") if p.is_dir())
    for directory in directories:
        dataset = current.get(directory.name)
        if dataset is None:
            orphan = clear([directory])
            cleanup.removed += orphan.removed
            cleanup.skipped += orphan.skipped
            _remove_directory(directory, cleanup)
            continue
        cleanup.removed += dataset.cleaned + clean_temps(directory)
        try:
            index = dataset.index()
        except EpiserveError as exc:  # cannot tell which segments are current: keep them all
            cleanup.unreadable[dataset.id] = exc.detail
            continue
        valid = {
            SegmentStore.segment_name(source.path)
            for source in index.files
            if dataset.segments.built_size(source, index.schema) is not None
        }
        _remove_segments(directory, valid, cleanup)
    return cleanup


def _remove_segments(directory: Path, keep: set[str], cleanup: Cleanup) -> None:
    """Remove the segments of `directory` (arrow, sidecar, build temp) except those named in `keep`."""
    segments = directory / "segments"
    names = {p.name.removesuffix(".arrow") for p in segments.glob("*.arrow")}
    names |= {p.name.removesuffix(".json") for p in segments.glob("*.json")}
    for name in sorted(names - keep):
        try:
            with FileLock(segments / f"{name}.lock", timeout=0):
                for suffix in (".json", ".arrow", ".arrow.tmp"):
                    cleanup.removed += _remove_file(segments / f"{name}{suffix}")
        except Timeout:
            cleanup.skipped.append(segments / f"{name}.arrow")


def _remove_directory(directory: Path, cleanup: Cleanup) -> None:
    """Remove an orphaned dataset cache: its lock files, then the directories if nothing else is left."""
    segments = directory / "segments"
    if any(p.name.endswith(".arrow") for p in cleanup.skipped if p.parent == segments):
        return
    for lock in segments.glob("*.lock"):
        cleanup.removed += _remove_file(lock)
    for path in (segments, directory):
        try:
            path.rmdir()
        except OSError:
            return


def _remove_file(path: Path) -> list[Removed]:
    try:
        nbytes = path.stat().st_size
        path.unlink()
    except FileNotFoundError:
        return []
    return [Removed(path, nbytes)]
