"""Anonymous memory (`RssAnon`): of a process, of a process tree, and sampled over time while work runs.

RssAnon counts heap and other private anonymous pages only; the page cache and memory-mapped files (which every
mmap-based reader touches) are excluded, so it measures what a process really allocates.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

import psutil


def rss_anon(pid: int) -> int:
    """`RssAnon` of one process, in bytes (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def tree_pids(pid: int) -> list[int]:
    """`pid` and all its descendants."""
    try:
        root = psutil.Process(pid)
        return [pid, *(child.pid for child in root.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def tree_rss_anon(pid: int) -> int:
    """`RssAnon` summed over `pid` and its descendants (e.g. a server and its worker processes)."""
    return sum(rss_anon(p) for p in tree_pids(pid))


class RssSampler:
    """Samples a process tree's RssAnon in a background thread; `peak` and `baseline` are in bytes.

    Use as a context manager around the work: the baseline is sampled on entry, the peak over the whole block.
    """

    def __init__(self, pid: int, interval_s: float = 0.02) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.baseline = 0
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._pids: list[int] = []
        self._pids_at = 0.0

    def _current(self) -> int:
        now = time.monotonic()
        if now - self._pids_at > 0.5:  # children come and go; refresh the tree now and then, not every sample
            self._pids, self._pids_at = tree_pids(self.pid), now
        return sum(rss_anon(p) for p in self._pids)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._current())
            self.samples += 1
            self._stop.wait(self.interval_s)

    def __enter__(self) -> RssSampler:
        self.baseline = self._current()
        self.peak = self.baseline
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._current())

    @property
    def growth(self) -> int:
        return self.peak - self.baseline
