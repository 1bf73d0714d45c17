"""The epoch plan and the resume arithmetic, checked against straightforward simulations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from episerve._sharding import EpochPlan, delivered_per_worker


def simulate_round_robin(rows_per_worker: list[int], unit: int) -> list[list[int]]:
    """Per-worker delivered rows after each item the DataLoader hands out, as torch's in-order loader does."""
    items = [[min(unit, rows - start) for start in range(0, rows, unit)] for rows in rows_per_worker]
    delivered = [0] * len(rows_per_worker)
    history = [list(delivered)]
    for round_ in range(max((len(i) for i in items), default=0)):
        for worker, sizes in enumerate(items):
            if round_ < len(sizes):
                delivered[worker] += sizes[round_]
                history.append(list(delivered))
    return history


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.integers(0, 40), min_size=1, max_size=5), unit=st.integers(1, 9))
def test_delivered_per_worker_matches_round_robin(rows: list[int], unit: int) -> None:
    for state in simulate_round_robin(rows, unit):
        assert delivered_per_worker(rows, unit, sum(state)) == state


def test_consumed_between_items_is_refused() -> None:
    with pytest.raises(ValueError, match="between two items"):
        delivered_per_worker([10, 10], 4, 3)


@settings(max_examples=100, deadline=None)
@given(
    total=st.integers(0, 2000),
    chunk=st.integers(1, 300),
    world=st.integers(1, 4),
    workers=st.integers(1, 3),
    shuffle=st.booleans(),
    epoch=st.integers(0, 5),
)
def test_shards_partition_the_view(total: int, chunk: int, world: int, workers: int, shuffle: bool, epoch: int) -> None:
    plan = EpochPlan(total, chunk, shuffle, seed=11, epoch=epoch)
    rows = []
    for rank in range(world):
        rank_rows = 0
        for worker in range(workers):
            for c in plan.chunks(rank, world, worker, workers):
                start, stop = plan.chunk_span(c)
                order = plan.row_order(c)
                rows.append(np.arange(start, stop)[order] if order is not None else np.arange(start, stop))
            rank_rows += plan.rows(rank, world, worker, workers)
        assert rank_rows == plan.rows(rank, world)  # what a rank reads does not depend on its workers
    combined = np.concatenate(rows) if rows else np.empty(0, np.int64)
    assert np.array_equal(np.sort(combined), np.arange(total))


def test_shuffled_order_depends_on_seed_and_epoch_only() -> None:
    first = EpochPlan(10_000, 100, True, seed=1, epoch=0)
    assert np.array_equal(first.chunk_order(), EpochPlan(10_000, 100, True, seed=1, epoch=0).chunk_order())
    assert not np.array_equal(first.chunk_order(), EpochPlan(10_000, 100, True, seed=1, epoch=1).chunk_order())
    assert not np.array_equal(first.row_order(3), EpochPlan(10_000, 100, True, seed=2, epoch=0).row_order(3))
