"""What the soak watches on the server side: its memory over time, its worker processes, and its log.

- `MemoryCurve` samples the RssAnon of the server and its supervised workers twice a second and keeps the peak
  of every 10 s window (the curve) and of the whole run.
- `WorkerWatch` notes every worker process it sees, so that a worker that died and was replaced counts even when
  nothing logged it.
- `logged_deaths` and `server_5xx` read the server's log: the supervisor's line for each worker death, and the
  access lines (JSON) of answers with a 5xx status.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from pathlib import Path

import orjson

WINDOW_S = 10.0
SAMPLE_S = 0.5
DEATH = re.compile(r"worker (\d+) (killed by \w+[^;]*|exited with status \d+|stopped answering[^;]*); starting another")


def children(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return []


def rss_anon_tree(pid: int) -> int:
    """RssAnon of `pid` and its descendants, in bytes."""
    total = 0
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                total = int(line.split()[1]) * 1024
                break
    return total + sum(rss_anon_tree(child) for child in children(pid))


class MemoryCurve:
    """The server's RssAnon: the peak of each `WINDOW_S` window (`windows`, bytes), the overall `peak` and the
    first sample (`baseline`)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.windows: list[int] = []
        self.peak = self.baseline = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> MemoryCurve:
        self.baseline = self.peak = rss_anon_tree(self.pid)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        window_end, current = time.monotonic() + WINDOW_S, 0
        while not self._stop.wait(SAMPLE_S):
            value = rss_anon_tree(self.pid)
            self.peak, current = max(self.peak, value), max(current, value)
            if time.monotonic() >= window_end:
                self.windows.append(current)
                window_end, current = window_end + WINDOW_S, 0
        if current:
            self.windows.append(current)

    def thirds(self) -> tuple[int, int] | None:
        """Peaks of the second and the last third of the windows (None with fewer than 6 windows: a minute)."""
        count = len(self.windows)
        if count < 6:
            return None
        return max(self.windows[count // 3 : 2 * count // 3]), max(self.windows[2 * count // 3 :])


class WorkerWatch:
    """The server's worker processes seen so far (polled every 0.1 s), and those alive now."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def workers(self) -> set[int]:
        """The children of the server's fork server (the server's other child is multiprocessing's resource
        tracker, which has none)."""
        return {worker for child in children(self.pid) for worker in children(child)}

    def start(self) -> WorkerWatch:
        self.seen |= self.workers()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.seen |= self.workers()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.seen |= self.workers()

    @property
    def gone(self) -> int:
        """Workers seen that are no longer alive."""
        return len(self.seen - self.workers())


def logged_deaths(log: str) -> list[tuple[int, str]]:
    """(pid, cause) of every worker death the supervisor logged."""
    return [(int(pid), cause) for pid, cause in DEATH.findall(log)]


def server_5xx(log: str) -> int:
    """Answers with a 5xx status in the server's JSON access log."""
    count = 0
    for line in log.splitlines():
        if '"episerve.access"' not in line:
            continue
        with contextlib.suppress(orjson.JSONDecodeError):
            status = orjson.loads(line).get("status")
            count += isinstance(status, int) and status >= 500
    return count
