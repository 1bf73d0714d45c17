"""The memory budget of a worker's reads from source files (`EPISERVE_COLD_READ_MEMORY`): cold reads of rows and
segment builds reserve their estimated peak on it before they read, so however many run at once, together they hold
about the budget; more wait their turn. Each hands its memory back to the OS when it ends."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import threading
from collections import deque
from collections.abc import Iterator

import pyarrow as pa


class ColdReadMemory:
    """A byte budget shared by a worker's concurrent cold reads and builds: `reserve` waits until the bytes are free.

    First come, first served: a reservation waits behind those that came before it, so a build (which ends the
    cold reads of its file) is not starved by a stream of smaller reads. A reservation larger than the whole budget
    takes all of it (it runs alone). Each hands its memory back to the OS when it ends (the last one in flight
    trims the C heap too): otherwise a burst of cold reads leaves the worker holding its peak for good."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.in_use = 0
        self.waits = 0  # reservations that had to wait for others (for tests and tuning)
        self._condition = threading.Condition()
        self._line: deque[object] = deque()  # reservations waiting, in order of arrival

    @contextlib.contextmanager
    def reserve(self, nbytes: int) -> Iterator[None]:
        """Hold `nbytes` (at most the whole budget) of the budget for the duration of the block."""
        nbytes = min(nbytes, self.capacity)
        ticket = object()
        with self._condition:
            self._line.append(ticket)
            if not self._turn(ticket, nbytes):
                self.waits += 1
                self._condition.wait_for(lambda: self._turn(ticket, nbytes))
            self._line.popleft()
            self.in_use += nbytes
            self._condition.notify_all()  # the next in line may fit as well
        try:
            yield
        finally:
            with self._condition:
                self.in_use -= nbytes
                idle = self.in_use == 0
                self._condition.notify_all()
            release_free_memory(trim=idle)

    def _turn(self, ticket: object, nbytes: int) -> bool:
        return self._line[0] is ticket and self.in_use + nbytes <= self.capacity


@functools.cache
def cold_read_memory(capacity: int) -> ColdReadMemory:
    """The process-wide budget for this capacity (one per worker process in practice)."""
    return ColdReadMemory(capacity)


def release_free_memory(trim: bool) -> None:
    """Return free memory to the OS: Arrow's pool, and with `trim` glibc's heap (numpy, Python) as well.

    Arrow's default pool (mimalloc) keeps freed pages in per-thread heaps, and releasing collects only the
    calling thread's heap: each thread that decoded calls this itself."""
    pa.default_memory_pool().release_unused()
    trim_heap = _malloc_trim() if trim else None
    if trim_heap is not None:
        trim_heap(0)


@functools.cache
def _malloc_trim() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None
