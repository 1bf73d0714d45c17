"""The mixture plan: weights in every prefix, draws without replacement per pass, random access without replay."""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from episerve._plan import PERIOD, MixturePlan, permutation, quotas, schedule

PREFIXES = 100_000


def weight_sets() -> list[list[float]]:
    rng = np.random.default_rng(11)
    sets: list[list[float]] = [[1.0], [1, 1], [1, 2, 3], [0.5, 0.3, 0.2], [0.98, 0.01, 0.01], [1 / 3, 2 / 3]]
    sets += [[0.9, *[0.1 / 9] * 9], [1000, 1, 1, 1], [0.123456789, 1.0, 0.3333], [7, 11, 13, 17, 19, 23]]
    for size in range(2, 13):
        for _ in range(6):
            sets.append(rng.dirichlet(np.full(size, rng.choice([0.2, 1.0, 5.0]))).tolist())
    return sets


def assert_within_one(plan: MixturePlan, prefixes: int) -> None:
    components = plan.components(np.arange(prefixes))
    counts = np.zeros((prefixes + 1, len(plan.quota)), dtype=np.int64)
    counts[np.arange(1, prefixes + 1), components] = 1
    np.cumsum(counts, axis=0, out=counts)
    n = np.arange(prefixes + 1, dtype=np.int64)[:, None]
    quota, period = np.asarray(plan.quota, dtype=np.int64), plan.period
    low, high = n * quota // period, -(-n * quota // period)  # floor and ceil of n * w_k, exactly
    assert (counts >= low).all() and (counts <= high).all()
    np.testing.assert_array_equal(plan.counts(n[:, 0]), counts)


@pytest.mark.parametrize("weights", weight_sets(), ids=lambda w: f"K{len(w)}")
def test_every_component_fills_its_share_of_every_prefix_within_one(weights: list[float]) -> None:
    plan = MixturePlan(quotas(weights), (1,) * len(weights), seed=len(weights), epoch_size=PREFIXES)
    assert_within_one(plan, PREFIXES)


def test_integer_and_simple_weights_are_honoured_exactly_not_rounded() -> None:
    assert quotas([1, 2, 3]) == (1, 2, 3)
    assert quotas([2, 2]) == (1, 1)
    assert quotas([0.1, 0.9]) == (1, 9)
    assert quotas([0.5, 0.3, 0.2]) == (5, 3, 2)
    rounded = quotas([0.123456789, 1.0])
    assert sum(rounded) <= PERIOD and abs(rounded[0] / sum(rounded) - 0.123456789 / 1.123456789) < 1 / PERIOD


@pytest.mark.parametrize("weights", [[0.0, 1.0], [-1.0, 2.0], [float("nan")], []])
def test_weights_must_be_positive(weights: list[float]) -> None:
    with pytest.raises(ValueError):
        quotas(weights)


def test_the_seed_changes_the_interleaving_not_the_shares() -> None:
    first, second = schedule((1, 1, 1, 1), 0).component, schedule((1, 1, 1, 1), 1).component
    assert sorted(first.tolist()) == sorted(second.tolist()) == [0, 1, 2, 3]
    orders = {tuple(schedule((1, 1, 1, 1), seed).component.tolist()) for seed in range(20)}
    assert len(orders) > 5


@pytest.mark.parametrize("size", [1, 2, 3, 5, 16, 17, 100, 1023, 4097])
def test_each_pass_is_a_permutation_of_the_component(size: int) -> None:
    for pass_ in range(3):
        assert sorted(permutation(size, seed=5, component=2, pass_=pass_).tolist()) == list(range(size))
    if size > 16:
        assert permutation(size, 5, 2, 0).tolist() != permutation(size, 5, 2, 1).tolist()


def test_a_small_component_cycles_through_fresh_shuffles_without_replacement_per_pass() -> None:
    sizes = (7, 50, 1000)
    plan = MixturePlan(quotas([5, 3, 1]), sizes, seed=3, epoch_size=900)
    component, row = plan.locate(0, np.arange(900))
    small = row[component == 0]
    passes = [small[i : i + 7] for i in range(0, len(small) - 6, 7)]
    assert len(passes) > 10
    for drawn in passes:
        assert sorted(drawn.tolist()) == list(range(7))
    assert len({tuple(p.tolist()) for p in passes}) > 1


def test_a_large_component_is_subsampled_differently_each_epoch_and_covered_before_repeating() -> None:
    plan = MixturePlan(quotas([1, 1]), (10, 1000), seed=9, epoch_size=200)
    epochs = []
    for epoch in range(10):
        component, row = plan.locate(epoch, np.arange(200))
        epochs.append(row[component == 1])
    assert all(len(rows) == 100 for rows in epochs)
    assert epochs[0].tolist() != epochs[1].tolist()
    assert sorted(np.concatenate(epochs).tolist()) == list(range(1000))  # ten epochs: one full pass


def test_locate_is_a_pure_function_of_the_position() -> None:
    plan = MixturePlan(quotas([3, 1, 2]), (11, 40, 7), seed=1, epoch_size=5000)
    whole = plan.locate(4, np.arange(5000))
    rng = np.random.default_rng(0)
    picked = rng.permutation(5000)[:300]
    parts = plan.locate(4, picked)
    np.testing.assert_array_equal(parts[0], whole[0][picked])
    np.testing.assert_array_equal(parts[1], whole[1][picked])
    again = MixturePlan(quotas([3, 1, 2]), (11, 40, 7), seed=1, epoch_size=5000).locate(4, picked)
    np.testing.assert_array_equal(again[1], parts[1])
    assert not np.array_equal(plan.locate(5, picked)[1], parts[1])


@settings(max_examples=40, deadline=None)
@given(
    weights=st.lists(st.integers(1, 50), min_size=1, max_size=6),
    sizes=st.lists(st.integers(1, 30), min_size=6, max_size=6),
    epoch_size=st.integers(1, 400),
)
def test_draws_of_each_component_are_without_replacement_per_pass(
    weights: list[int], sizes: list[int], epoch_size: int
) -> None:
    plan = MixturePlan(quotas(weights), tuple(sizes[: len(weights)]), seed=2, epoch_size=epoch_size)
    drawn: list[list[int]] = [[] for _ in weights]
    for epoch in range(3):
        component, row = plan.locate(epoch, np.arange(epoch_size))
        for k, r in zip(component.tolist(), row.tolist(), strict=True):
            drawn[k].append(r)
    for k, rows in enumerate(drawn):
        size = plan.sizes[k]
        for start in range(0, len(rows) - size + 1, size):
            assert sorted(rows[start : start + size]) == list(range(size))


def test_resuming_deep_in_a_billion_position_epoch_costs_no_replay() -> None:
    sizes = (10**8, 3 * 10**8, 6 * 10**8)
    tracemalloc.start()
    began = time.perf_counter()
    plan = MixturePlan(quotas([0.5, 0.3, 0.2]), sizes, seed=4, epoch_size=10**9)
    component, row = plan.locate(2, np.arange(10**8, 10**8 + 256))
    elapsed = time.perf_counter() - began
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert elapsed < 2.0 and peak < 100 * 2**20
    assert ((row >= 0) & (row < np.asarray(sizes)[component])).all()
