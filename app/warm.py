"""Cache warm-up and verification: build the segments an episode selection needs, check segments on disk.

Plain functions for the CLI, plus a small per-process registry of background warm-up jobs for the API.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from app.dataset import Dataset
from app.episode_index import verify_persisted_index
from app.episode_spec import EpisodeRanges
from app.layouts import read_layout
from app.segments import ProgressCallback

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
    index_problem: str | None = None  # what was wrong with index.json (it is always rebuilt)


def verify(dataset: Dataset, rebuild: bool = False) -> VerifyReport:
    """Check the persisted episode index against the sources (rebuilt when damaged: a damaged index is never
    served), then every segment on disk against its sidecar (size, checksum, schema, rows); optionally rebuild."""
    report = VerifyReport(dataset.id, index_problem=_verify_index(dataset))
    index = dataset.index()
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


def _verify_index(dataset: Dataset) -> str | None:
    """What is wrong with the dataset's `index.json` (then deleted, so loading rebuilds it), or None."""
    layout = read_layout(dataset.path)
    column = layout.episode_column or dataset.default_episode_column
    path = dataset.cache_dir / "index.json"
    problem = verify_persisted_index(dataset.path, layout, column, path)
    if problem is not None:
        path.unlink(missing_ok=True)
        dataset.reload()
    return problem


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
