"""Which rows each shard of an epoch delivers, and in which order: a pure function of the plan's fields.

The view is cut into contiguous chunks of `chunk_rows`. Each epoch orders the chunks (a permutation seeded by
`(seed, epoch)` when shuffling) and deals them round-robin to the ranks, and each rank's chunks round-robin to its
DataLoader workers (so what a rank reads does not depend on its number of workers). A shuffled chunk's rows are
permuted too, seeded by `(seed, epoch, chunk)`. Shards are disjoint and together cover the view exactly once, and
every process can recompute any shard's order without talking to the others — which is what resuming needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EpochPlan:
    """The chunking and order of one epoch over a view of `total_rows` rows."""

    total_rows: int
    chunk_rows: int
    shuffle: bool
    seed: int
    epoch: int

    @property
    def num_chunks(self) -> int:
        return -(-self.total_rows // self.chunk_rows)

    def chunk_order(self) -> np.ndarray:
        """Chunk ids in the order they are dealt to shards."""
        if not self.shuffle:
            return np.arange(self.num_chunks)
        return np.random.default_rng([self.seed, self.epoch, 0]).permutation(self.num_chunks)

    def chunks(self, rank: int, world_size: int, worker: int = 0, num_workers: int = 1) -> np.ndarray:
        """The chunks a rank (or one of its DataLoader workers) reads, in order."""
        return self.chunk_order()[rank::world_size][worker::num_workers]

    def chunk_span(self, chunk: int) -> tuple[int, int]:
        """View rows `[start, stop)` of a chunk."""
        start = int(chunk) * self.chunk_rows
        return start, min(start + self.chunk_rows, self.total_rows)

    def row_order(self, chunk: int) -> np.ndarray | None:
        """The order a chunk's rows are delivered in (positions within the chunk), or None for stored order."""
        if not self.shuffle:
            return None
        start, stop = self.chunk_span(chunk)
        return np.random.default_rng([self.seed, self.epoch, 1, int(chunk)]).permutation(stop - start)

    def rows(self, rank: int, world_size: int, worker: int = 0, num_workers: int = 1) -> int:
        """How many rows a rank (or one of its DataLoader workers) delivers in this epoch."""
        chunks = self.chunks(rank, world_size, worker, num_workers)
        return sum(stop - start for start, stop in map(self.chunk_span, chunks))


def delivered_per_worker(rows_per_worker: Sequence[int], unit: int, consumed: int) -> list[int]:
    """Rows each DataLoader worker had delivered when the loader had handed out `consumed` rows in all.

    torch's DataLoader (with the default `in_order=True`) takes items from its workers round-robin by worker id,
    skipping workers that are exhausted: in round `r` every worker with more than `r` items delivers its item
    `r`. Each worker's item is `unit` rows (its last may be shorter). `consumed` must fall between two items.
    """
    rows = np.asarray(rows_per_worker, dtype=np.int64)
    if consumed < 0 or consumed > int(rows.sum()):
        raise ValueError(f"consumed={consumed} is outside this rank's epoch of {int(rows.sum())} rows")

    def after_rounds(rounds: int) -> np.ndarray:
        return np.minimum(rows, rounds * unit)

    # The last complete round, by bisection over the number of rounds.
    low, high = 0, max(1, -(-int(rows.max(initial=0)) // unit))
    while low < high:
        middle = (low + high + 1) // 2
        if int(after_rounds(middle).sum()) <= consumed:
            low = middle
        else:
            high = middle - 1
    delivered = after_rounds(low)
    remaining = consumed - int(delivered.sum())
    for worker in range(len(rows)):
        if remaining == 0:
            break
        item = int(min(unit, rows[worker] - delivered[worker]))
        if item <= 0:
            continue
        if item > remaining:
            raise ValueError(f"consumed={consumed} does not fall between two items of {unit} rows")
        delivered[worker] += item
        remaining -= item
    if remaining:
        raise ValueError(f"consumed={consumed} does not fall between two items of {unit} rows")
    return delivered.tolist()
