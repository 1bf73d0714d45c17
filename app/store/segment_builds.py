"""Builds under way: their progress, and the background builder threads (one per process and kind of segment),
which a stopping server gives up between two batches."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass


@dataclass
class BuildProgress:
    """A build under way in this process."""

    source: str
    rows_total: int
    rows_done: int = 0
    bytes_done: int = 0
    started: float = 0.0


ProgressCallback = Callable[[int, int], None]  # (rows, bytes) written by the latest batch


class BuildStopped(Exception):
    """A background build given up between two batches because the process is stopping (nothing is published,
    and its temporary file is removed)."""


STOPPING = threading.Event()
_BUILDERS: dict[str, ThreadPoolExecutor] = {}
_BUILDERS_LOCK = threading.Lock()


def background_builds(builder: str) -> ThreadPoolExecutor:
    """One builder thread per process and kind of segment: background builds queue up instead of competing for
    the CPU, and a long decode of a video never holds up the conversion of a parquet file."""
    with _BUILDERS_LOCK:
        executor = _BUILDERS.get(builder)
        if executor is None:
            executor = _BUILDERS[builder] = ThreadPoolExecutor(1, thread_name_prefix=f"episerve-build-{builder}")
        return executor


def stop_background_builds() -> None:
    """Give up this process's background builds, queued or under way (at the next batch), so that stopping the
    server does not wait for a whole video to decode; a later request queues them again."""
    STOPPING.set()
    with _BUILDERS_LOCK:
        executors = list(_BUILDERS.values())
    for executor in executors:
        executor.shutdown(wait=False, cancel_futures=True)


def unless_stopping(rows: int, nbytes: int) -> None:
    if STOPPING.is_set():
        raise BuildStopped
