"""Large answers read piece by piece: rows of a take (with their camera frames and windows) computed a few MiB at a
time, each piece only when the encoder is ready to send it, so an answer never holds more than one piece of
anonymous memory, whatever its size and however slowly its client reads.

`RowPieces` cuts the rows asked for into pieces of about `PIECE_BYTES`: the first from a guess of the bytes a row
holds, each next one from the bytes per row the pieces before it actually held.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from app.reads.pending_copies import PendingCopies

PIECE_BYTES = 4 * 1024 * 1024  # rows computed at once for a large answer


@dataclass(frozen=True)
class Piece:
    """Record batches (of `schema`) of some rows of an answer, and the frame copies they leave `pending` (see
    `app.reads.pending_copies`)."""

    schema: pa.Schema
    batches: list[pa.RecordBatch]
    pending: PendingCopies | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of the piece's buffers (the pending frames' included: their room is allocated)."""
        return sum(batch.get_total_buffer_size() for batch in self.batches)

    def held_bytes(self, codec: str | None) -> int:
        """Memory the piece holds until it is sent: its buffers, less the pending frames when it is sent
        uncompressed (they go to the socket from the maps; compressing copies them into place first)."""
        pending = self.pending.nbytes if self.pending is not None and codec is None else 0
        return self.nbytes - pending


class RowPieces:
    """The pieces of an answer over `rows`, computed by `compute` (rows -> piece) in request order; `row_bytes`:
    the guessed bytes of one row, which sizes the first piece; `read_ahead`: whether a piece is worth computing
    while the one before is sent (camera frames, decoded or gathered; stored rows are a copy from the maps, which
    reading ahead would only hold in memory longer)."""

    def __init__(
        self, rows: np.ndarray, row_bytes: float, compute: Callable[[np.ndarray], Piece], read_ahead: bool = False
    ) -> None:
        self.rows, self.compute, self.read_ahead = rows, compute, read_ahead
        self.row_bytes = max(1.0, row_bytes)
        self.done = 0  # rows computed so far

    @property
    def remaining(self) -> int:
        return len(self.rows) - self.done

    def next_rows(self) -> int:
        """How many rows the next piece holds."""
        return int(min(self.remaining, max(1, PIECE_BYTES // self.row_bytes)))

    def next_piece(self) -> Piece:
        """The next piece (call only while `remaining`); it sizes the one after."""
        count = self.next_rows()
        piece = self.compute(self.rows[self.done : self.done + count])
        self.done += count
        self.row_bytes = max(1.0, piece.nbytes / count)
        return piece

    def __iter__(self) -> Iterator[Piece]:
        while self.remaining:
            yield self.next_piece()
