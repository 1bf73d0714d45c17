"""Row values an answer has not copied into place yet, so that they go to the socket straight from the memory map.

A take of camera frames from decoded-frame segments would copy every frame out of the map into the answer's
column, only for the kernel to copy it once more into the socket: for 64 frames of 224x224 pixels that copy took
a third of the server's CPU time for the request. Instead the column is allocated and left unfilled, and each
row's source (a view of the map) is remembered here. The encoder (`app.reads.arrow_ipc.encode_stream`) asks for
the pieces of every buffer it sends and gets those rows from where they lie. Anything else that reads the
answer's data makes the copies first (`make`), so an unfilled row is never read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class _Target:
    """A column's values buffer (rows of `row_bytes`) and the sources of its unfilled rows."""

    array: np.ndarray
    address: int
    row_bytes: int
    sources: dict[int, np.ndarray]  # row -> the row's value, C-contiguous, `row_bytes` long

    def copy_rows(self) -> None:
        for row, source in self.sources.items():
            self.array[row] = source


class PendingCopies:
    """The unfilled rows of an answer's fixed-width columns, and where their values are."""

    def __init__(self) -> None:
        self._targets: list[_Target] = []
        self._made = False

    def __bool__(self) -> bool:
        return bool(self._targets) and not self._made

    @property
    def nbytes(self) -> int:
        """Bytes of the rows still pending: sent from their sources, they take no memory of the answer's (their
        room in its buffers is allocated and never written)."""
        if self._made:
            return 0
        return sum(len(target.sources) * target.row_bytes for target in self._targets)

    def add(self, target: np.ndarray, rows: np.ndarray, sources: Sequence[np.ndarray]) -> None:
        """`target[rows[i]]` is to hold `sources[i]`. `target` is C-contiguous, one row per item of its first axis,
        and each source has the shape and dtype of one row. Rows of a target added before (frames of another
        video file of the same camera column) join its pending rows: a buffer sent is looked up once."""
        if not target.flags.c_contiguous:
            raise ValueError("a target of pending copies must be C-contiguous")
        row_bytes = target[0].nbytes
        if any(source.nbytes != row_bytes or not source.flags.c_contiguous for source in sources):
            raise ValueError("every source of a pending copy must be one contiguous row of its target")
        pending = dict(zip(rows.tolist(), sources, strict=True))
        address = target.ctypes.data
        for known in self._targets:
            if known.address == address and known.array.nbytes == target.nbytes:  # more rows of the same buffer
                known.sources.update(pending)
                return
        self._targets.append(_Target(target, address, row_bytes, pending))

    def make(self) -> None:
        """Copy every pending row into place (once); from then on the answer's buffers hold all their data."""
        if not self._made:
            for target in self._targets:
                target.copy_rows()
            self._made = True

    def pieces(self, address: int, size: int) -> list[memoryview] | None:
        """The bytes `[address, address + size)` of a buffer about to be sent, as pieces to send in order, the
        pending rows taken from their sources; None when that range holds no pending row (send it as it is)."""
        if self._made:
            return None
        for target in self._targets:
            start = address - target.address
            if start >= 0 and start + size <= target.array.nbytes:
                return _pieces(target, start, start + size)
        return None


def _pieces(target: _Target, start: int, stop: int) -> list[memoryview] | None:
    """Bytes [start, stop) of `target`: runs of filled rows as views of the target, pending rows from their
    sources (each cut to the range)."""
    whole = memoryview(target.array.reshape(-1).view(np.uint8))
    width = target.row_bytes
    first, last = start // width, (stop - 1) // width
    pieces: list[memoryview] = []
    run_start = start  # the start of the current run of filled bytes
    for row in range(first, last + 1):
        source = target.sources.get(row)
        if source is None:
            continue
        low, high = max(start, row * width), min(stop, (row + 1) * width)
        if run_start < low:
            pieces.append(whole[run_start:low])
        pieces.append(memoryview(source.reshape(-1).view(np.uint8))[low - row * width : high - row * width])
        run_start = high
    if run_start == start:
        return None  # no pending row in the range
    if run_start < stop:
        pieces.append(whole[run_start:stop])
    return pieces
