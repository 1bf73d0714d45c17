"""`EpisodeIterableDataset`: disjoint shards across workers and ranks, seeded epochs, exact resume, and an epoch
that survives a server restart."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch.utils.data import DataLoader

import episerve
from tests.client.helpers import (
    DEMO,
    PinnedPortServer,
    assert_batch_equals_view,
    consume_then_save,
    exactly_once,
    iterate_rank,
    load_then_finish,
    positions_by_index,
    run_in_process,
)

SHUFFLED = {"chunk_rows": 150, "batch_size": 32, "shuffle": True, "seed": 7}


def test_samples_stream_in_view_order_with_oracle_values(url: str, demo_view: pa.Table) -> None:
    dataset = episerve.EpisodeIterableDataset(url, DEMO, chunk_rows=700, prefetch=2)
    samples = list(dataset)
    assert [int(s["index"]) for s in samples] == demo_view["index"].to_pylist()
    first = samples[0]
    assert first["observation.state"].shape == (6,) and isinstance(first["observation.image"], bytes)
    batch = episerve.collate(samples[:50])
    assert batch["action"].shape == (50, 6)
    assert_batch_equals_view(batch, demo_view, positions_by_index(demo_view))


def test_batches_are_cut_across_chunks_and_equal_the_oracle(url: str, demo_view: pa.Table) -> None:
    dataset = episerve.EpisodeIterableDataset(url, DEMO, chunk_rows=100, batch_size=64, shuffle=True)
    positions = positions_by_index(demo_view)
    sizes, seen = [], []
    for batch in DataLoader(dataset, batch_size=None):
        assert_batch_equals_view(batch, demo_view, positions)
        sizes.append(len(batch["index"]))
        seen.append(batch["index"].numpy())
    assert sizes[:-1] == [64] * (len(sizes) - 1) and 0 < sizes[-1] <= 64
    assert exactly_once(seen, demo_view["index"].to_numpy())


def test_two_ranks_with_two_workers_each_cover_the_view_exactly_once(url: str, demo_view: pa.Table) -> None:
    ranks = [run_in_process(iterate_rank, url, rank, 2, [0, 1, 0], SHUFFLED) for rank in range(2)]
    for epoch in (0, 1):
        streams = [stream for result in ranks for stream in result[epoch].values()]
        assert len(streams) == 4 and all(streams)
        assert exactly_once(streams, demo_view["index"].to_numpy())
    for result in ranks:
        assert result[0] != result[1], "two epochs gave the same order"
    # each rank's epoch 0 was read twice, by separate dataset objects: the same order both times
    again = run_in_process(iterate_rank, url, 0, 2, [0], SHUFFLED)
    assert again[0] == ranks[0][0]


def test_different_seeds_give_different_orders(url: str) -> None:
    def order(seed: int) -> list[int]:
        dataset = episerve.EpisodeIterableDataset(url, DEMO, columns=["index"], chunk_rows=200, shuffle=True, seed=seed)
        return [int(sample["index"]) for sample in dataset]

    assert order(1) != order(2)
    assert sorted(order(1)) == sorted(order(2))


@pytest.mark.parametrize("batches", [5, -3], ids=["early", "near-the-end"])
def test_resume_in_a_new_process_delivers_exactly_the_rest(url: str, demo_view: pa.Table, batches: int) -> None:
    total_batches = -(-demo_view.num_rows // SHUFFLED["batch_size"])  # workers' partial batches add at most 2
    stop_after = batches if batches > 0 else total_batches + batches
    seen, state = run_in_process(consume_then_save, url, SHUFFLED, 4, stop_after)
    assert state["epoch"] == 4 and state["consumed"] == len(seen) > 0
    rest = run_in_process(load_then_finish, url, SHUFFLED, state)
    assert rest
    assert exactly_once([seen, rest], demo_view["index"].to_numpy())


def test_resume_without_workers_counts_what_it_delivered(url: str, demo_view: pa.Table) -> None:
    options = {"columns": ["index"], "chunk_rows": 120, "shuffle": True, "seed": 3}
    dataset = episerve.EpisodeIterableDataset(url, DEMO, **options)
    dataset.set_epoch(2)
    stream = iter(dataset)
    seen = [int(next(stream)["index"]) for _ in range(333)]
    state = dataset.state_dict()
    assert state["consumed"] == 333
    resumed = episerve.EpisodeIterableDataset(url, DEMO, **options)
    resumed.load_state_dict(state)
    rest = [int(sample["index"]) for sample in resumed]
    assert exactly_once([seen, rest], demo_view["index"].to_numpy())
    resumed.set_epoch(3)
    assert len(list(resumed)) == demo_view.num_rows


def test_state_from_a_different_setup_is_refused(url: str) -> None:
    state = episerve.EpisodeIterableDataset(url, DEMO, chunk_rows=100).state_dict(consumed=0)
    with pytest.raises(ValueError, match="chunk_rows"):
        episerve.EpisodeIterableDataset(url, DEMO, chunk_rows=200).load_state_dict(state)


def test_state_dict_with_workers_needs_the_consumed_count(url: str) -> None:
    dataset = episerve.EpisodeIterableDataset(url, DEMO, chunk_rows=100)
    with pytest.raises(ValueError, match="consumed"):
        dataset.state_dict()


def test_epoch_survives_a_server_restart_without_losing_or_repeating_rows(
    datasets_root: Path, tmp_path: Path, demo_view: pa.Table
) -> None:
    server = PinnedPortServer([datasets_root], tmp_path / "cache").start()
    port = server.port
    retries = episerve.Retries(attempts=60, backoff=0.05, max_backoff=0.5, deadline=60)
    try:
        dataset = episerve.EpisodeIterableDataset(
            server.url, DEMO, columns=["index", "action"], chunk_rows=100, batch_size=50, prefetch=1, retries=retries
        )
        loader = DataLoader(dataset, batch_size=None, num_workers=2)
        seen, arrivals, restarter = [], [], None
        for number, batch in enumerate(loader):
            seen.append(batch["index"].numpy())
            arrivals.append(time.monotonic())
            if number == 10:
                server.stop(signal.SIGKILL)
                restarter = threading.Thread(target=lambda: (time.sleep(0.5), server.start()))
                restarter.start()
        assert restarter is not None
        restarter.join()
        assert server.port == port
        assert max(np.diff(arrivals[10:])) >= 0.5, "the loader never waited for the restarted server"
        assert exactly_once(seen, demo_view["index"].to_numpy())
        # the map-style dataset rides through a restart too
        mapped = episerve.EpisodeDataset(server.url, DEMO, columns=["index"], retries=retries)
        server.stop(signal.SIGKILL)
        restarter = threading.Thread(target=lambda: (time.sleep(0.5), server.start()))
        restarter.start()
        assert mapped.__getitems__([3, 1]).data["index"].tolist() == demo_view["index"].to_numpy()[[3, 1]].tolist()
        restarter.join()
    finally:
        server.stop()


def test_windows_plumb_through_as_fixed_size_lists(url: str) -> None:
    windows = {"action": [0.0, 1 / 30, 2 / 30], "observation.state": [-1 / 30, 0.0]}
    mapped = episerve.EpisodeDataset(url, DEMO, columns=["action", "observation.state"], delta_timestamps=windows)
    batch = mapped.__getitems__([0, 5]).data
    assert batch["action"].shape == (2, 3, 6) and batch["observation.state"].shape == (2, 2, 6)
    assert batch["action_is_pad"].dtype == torch.bool and batch["action_is_pad"].shape == (2, 3)
    assert batch["observation.state_is_pad"][0].tolist() == [True, False]
    streamed = next(iter(episerve.EpisodeIterableDataset(url, DEMO, columns=["action"], delta_timestamps=windows)))
    assert streamed["action"].shape == (3, 6) and streamed["action_is_pad"].shape == (3,)
    assert np.array_equal(streamed["action"][0].numpy(), batch["action"][0, 0].numpy())
