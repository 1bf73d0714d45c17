"""Cache warm-up: build the segments of chosen source files, with progress, in the foreground (CLI) or as
background jobs (one per dataset at a time, reported by `GET /cache`). Where the dataset's files are fetched as reads
need them (from the Hub), the chosen files are fetched first (`fetch_files`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

from app.store.dataset import Dataset
from app.store.segment_builds import ProgressCallback

log = logging.getLogger("episerve.cache")


def fetch_files(
    dataset: Dataset, files: list[int], progress: Callable[[int, int], None] | None = None
) -> tuple[int, int]:
    """Fetch the source `files` not there yet where the dataset's files are fetched as reads need them, and wait for
    them, calling `progress(bytes done, bytes)`; then read the index again if it held any of them as absent, so they
    are built from their own fingerprints: (files, bytes) fetched."""
    if not dataset.supply.fetches:
        return 0, 0
    index = dataset.index()
    fetched = dataset.supply.fetch_now([index.files[number].path for number in files], progress)
    if any(index.files[number].absent for number in files):
        dataset.reload(index)
    return fetched


def warm(
    dataset: Dataset,
    files: list[int] | None = None,
    progress: ProgressCallback | None = None,
    on_segment: Callable[[], None] | None = None,
) -> int:
    """Build the segments of source `files` (all when None), `build_threads` at a time; return how many this
    call built. `progress` and `on_segment` are called one at a time, whichever build thread reports."""
    if files is None:
        files = list(range(len(dataset.index().files)))
    fetch_files(dataset, files)
    before = dataset.segments.builds
    reporting = threading.Lock()

    def report(rows: int, nbytes: int) -> None:
        with reporting:
            progress(rows, nbytes)  # type: ignore[misc]

    def build(number: int) -> None:
        dataset.build(number, report if progress is not None else None)
        if on_segment is not None:
            with reporting:
                on_segment()

    threads = min(dataset.limits.build_threads, len(files))
    if threads <= 1:
        for number in files:
            build(number)
    else:
        # Parquet decoding releases the GIL, so builds of different files run side by side.
        with ThreadPoolExecutor(threads, thread_name_prefix="episerve-warm-build") as pool:
            futures = [pool.submit(build, number) for number in files]
            try:
                for future in futures:
                    future.result()
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
    return dataset.segments.builds - before


def warm_videos(
    dataset: Dataset, videos: list[tuple[str, pa.Schema]], on_segment: Callable[[], None] | None = None
) -> tuple[int, int]:
    """Build the decoded-frame segments of video files (path, frame schema), one at a time (the decoder uses
    the cores); return how many this call built, and how many are larger than the whole video cache budget."""
    before, too_large = dataset.frames.builds, 0
    for path, schema in videos:
        if dataset.frames.build_now(path, schema) is None:
            too_large += 1
        if on_segment is not None:
            on_segment()
    return dataset.frames.builds - before, too_large


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

    def start(self, dataset: Dataset, files: list[int]) -> WarmJob:
        """Start warming the segments of source `files` (or return the job already running for this dataset)."""
        with self._lock:
            running = self._jobs.get(dataset.id)
            if running is not None and running.state == "running":
                return running
            job = self._jobs[dataset.id] = WarmJob("running", len(files))
        self._pool.submit(self._run, dataset, files, job)
        return job

    @staticmethod
    def _run(dataset: Dataset, files: list[int], job: WarmJob) -> None:
        def segment_done() -> None:
            job.segments_done += 1

        try:
            warm(dataset, files, on_segment=segment_done)
            job.state = "done"
        except Exception as exc:  # reported through GET /cache; the server keeps running
            log.exception("warming %s failed", dataset.id)
            job.state, job.error = "failed", str(exc)
        finally:
            job.finished = time.time()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
