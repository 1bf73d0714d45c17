"""Backoff for background builds that fail: while a file's segment cannot be built (its object store down, the
file unreadable), requests that find it cold must not queue its build again each time.

After a failed build of a source file, no new background build of it is queued until a delay has passed: 1 s,
doubling with each failure in a row up to 30 s. The first successful build clears it. Requests meanwhile are
answered as without the segment (decoded on demand, read cold, or a 503 naming the cause).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

FIRST_DELAY_S = 1.0
MAX_DELAY_S = 30.0


class BuildBackoff:
    """Per source file path: failures in a row, and when the next background build may be queued."""

    def __init__(
        self, first: float = FIRST_DELAY_S, limit: float = MAX_DELAY_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.first, self.limit, self.clock = first, limit, clock
        self._lock = threading.Lock()
        self._failures: dict[str, tuple[int, float]] = {}  # path -> (failures in a row, not before this time)

    def waiting(self, path: str) -> bool:
        """Whether a build of `path` failed lately and its backoff has not passed yet."""
        with self._lock:
            entry = self._failures.get(path)
        return entry is not None and self.clock() < entry[1]

    def failed(self, path: str) -> float:
        """Note a failed build of `path`; returns the seconds before the next one may be queued."""
        with self._lock:
            count = self._failures.get(path, (0, 0.0))[0] + 1
            delay = min(self.limit, self.first * 2 ** (count - 1))
            self._failures[path] = (count, self.clock() + delay)
        return delay

    def succeeded(self, path: str) -> None:
        with self._lock:
            self._failures.pop(path, None)
