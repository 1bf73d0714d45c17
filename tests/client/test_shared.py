"""Batches cross from DataLoader workers to the main process as one shared block, and arrive intact."""

from __future__ import annotations

import copy
import io
import pickle
from multiprocessing.reduction import ForkingPickler

import pyarrow as pa
import torch
from torch.utils.data import DataLoader

import episerve
from episerve._shared import TensorBatch
from tests.client.helpers import DEMO, assert_batch_equals_view, exactly_once, positions_by_index


def storages(batch: dict) -> set[int]:
    return {v.untyped_storage().data_ptr() for v in batch.values() if isinstance(v, torch.Tensor)}


def sample_batch() -> TensorBatch:
    return TensorBatch(
        state=torch.arange(12, dtype=torch.float32).reshape(3, 4),
        done=torch.tensor([True, False, True]),
        task=["pick", "place", "push"],
        empty=torch.empty(0, 5, dtype=torch.int64),
        half=torch.tensor([0.5, 1.5, 2.5], dtype=torch.float16),
        strided=torch.arange(20, dtype=torch.int16).reshape(4, 5).t(),  # not contiguous
        scalar=torch.tensor(7, dtype=torch.int32),
    )


def test_workers_pickle_a_batch_as_one_block_of_views_with_every_value_intact() -> None:
    batch = sample_batch()
    buffer = io.BytesIO()
    ForkingPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(batch)
    received = pickle.loads(buffer.getvalue())
    assert type(received) is dict and list(received) == list(batch)
    assert len(storages(received)) == 1
    for name, value in batch.items():
        if isinstance(value, torch.Tensor):
            assert received[name].dtype == value.dtype and received[name].shape == value.shape
            assert torch.equal(received[name], value), name
        else:
            assert received[name] == value
    received["state"] += 1  # views are disjoint: writing one column leaves its neighbours alone
    assert torch.equal(received["done"], batch["done"]) and torch.equal(received["half"], batch["half"])


def test_copies_stay_batches_and_plain_pickles_carry_the_values() -> None:
    batch = sample_batch()
    shallow = copy.copy(batch)
    assert type(shallow) is TensorBatch and shallow["state"] is batch["state"]
    deep = copy.deepcopy(batch)
    assert type(deep) is TensorBatch and deep["state"] is not batch["state"]
    assert torch.equal(deep["strided"], batch["strided"])
    restored = pickle.loads(pickle.dumps(batch))
    assert all(torch.equal(restored[k], v) for k, v in batch.items() if isinstance(v, torch.Tensor))
    single = TensorBatch(index=torch.arange(3), note=["a", "b", "c"])
    unpacked = pickle.loads(pickle.dumps(single))  # one tensor: nothing to pack
    assert type(unpacked) is dict and unpacked["index"].tolist() == [0, 1, 2] and unpacked["note"] == ["a", "b", "c"]


def test_dataloader_batches_arrive_in_one_storage_equal_to_the_oracle(url: str, demo_view: pa.Table) -> None:
    positions = positions_by_index(demo_view)
    mapped = DataLoader(
        episerve.EpisodeDataset(url, DEMO),
        batch_size=32,
        shuffle=True,
        num_workers=2,
        collate_fn=episerve.collate,
    )
    iterable = episerve.EpisodeIterableDataset(url, DEMO, batch_size=32, shuffle=True, chunk_rows=100)
    streamed = DataLoader(iterable, batch_size=None, num_workers=2)
    for loader in (mapped, streamed):
        seen = []
        for batch in loader:
            assert type(batch) is dict and len(storages(batch)) == 1
            assert_batch_equals_view(batch, demo_view, positions)
            seen.append(batch["index"].numpy())
        assert exactly_once(seen, demo_view["index"].to_numpy())
