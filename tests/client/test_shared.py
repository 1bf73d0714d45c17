"""Batches cross from DataLoader workers to the main process as one block (inside the pickle when small, in
shared memory when large), and arrive intact."""

from __future__ import annotations

import copy
import io
import pickle
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch.utils.data import DataLoader

import episerve
from episerve._tensor_batch import INLINE_BLOCK_BYTES, TensorBatch, shared_empty
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


def large_batch() -> TensorBatch:
    """A batch whose block is too large to travel inside the pickle."""
    rows = INLINE_BLOCK_BYTES // 64 + 1
    return TensorBatch(
        state=torch.arange(rows * 14, dtype=torch.float32).reshape(rows, 14),
        frame=torch.arange(rows, dtype=torch.int64),
        task=["pick"] * rows,
    )


def worker_pickle(batch: TensorBatch) -> bytes:
    buffer = io.BytesIO()
    ForkingPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(batch)
    return buffer.getvalue()


def assert_received_intact(received: dict, batch: TensorBatch) -> None:
    assert type(received) is dict and list(received) == list(batch)
    assert len(storages(received)) == 1
    for name, value in batch.items():
        if isinstance(value, torch.Tensor):
            assert received[name].dtype == value.dtype and received[name].shape == value.shape
            assert torch.equal(received[name], value), name
        else:
            assert received[name] == value


def test_small_batches_travel_inside_the_pickle_as_one_block_of_views_with_every_value_intact() -> None:
    batch = sample_batch()
    data = worker_pickle(batch)
    received = pickle.loads(data)
    assert_received_intact(received, batch)
    assert not received["state"].is_shared()  # the bytes came with the pickle: no shared-memory file
    received["state"] += 1  # views are disjoint and writable: writing one column leaves its neighbours alone
    assert torch.equal(received["state"], batch["state"] + 1)
    assert torch.equal(received["done"], batch["done"]) and torch.equal(received["half"], batch["half"])


def test_large_batches_go_to_shared_memory_as_one_block() -> None:
    batch = large_batch()
    data = worker_pickle(batch)
    received = pickle.loads(data)
    assert_received_intact(received, batch)
    assert received["state"].is_shared()
    tensor_bytes = batch["state"].nbytes + batch["frame"].nbytes
    assert len(data) < tensor_bytes // 4  # only a descriptor and the layout (and the list) are pickled
    received["frame"] += 1
    assert torch.equal(received["frame"], batch["frame"] + 1) and torch.equal(received["state"], batch["state"])


def test_a_tensor_already_in_shared_memory_travels_as_it_is_and_the_rest_as_one_block() -> None:
    frames = shared_empty(torch, (4, 3, 8, 8), torch.float32)
    frames.copy_(torch.rand(4, 3, 8, 8))
    batch = TensorBatch(frames=frames, state=torch.arange(8.0).reshape(4, 2), index=torch.arange(4))
    received = pickle.loads(worker_pickle(batch))
    assert list(received) == ["frames", "state", "index"]
    assert all(torch.equal(received[k], v) for k, v in batch.items())
    assert received["frames"].untyped_storage().size() == frames.nbytes  # its own storage, not packed
    assert received["state"].untyped_storage().data_ptr() == received["index"].untyped_storage().data_ptr()


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


class _LargeBatches:
    """A map-style dataset whose batches are too large to travel inside the pickle."""

    def __len__(self) -> int:
        return 4

    def __getitems__(self, indices: list[int]) -> TensorBatch:
        batch = large_batch()
        batch["frame"] += 1000 * indices[0]
        return batch


def test_dataloader_hands_large_batches_over_in_shared_memory_intact() -> None:
    loader = DataLoader(_LargeBatches(), batch_size=1, num_workers=2, collate_fn=lambda batch: batch)
    firsts = []
    for batch in loader:
        assert type(batch) is dict and len(storages(batch)) == 1 and batch["state"].is_shared()
        expected = large_batch()
        first = int(batch["frame"][0])
        assert torch.equal(batch["frame"], expected["frame"] + first)
        assert torch.equal(batch["state"], expected["state"]) and batch["task"] == expected["task"]
        firsts.append(first)
    assert sorted(firsts) == [0, 1000, 2000, 3000]


def test_large_slices_of_a_shared_array_become_views_of_its_shared_tensor_and_copies_do_not() -> None:
    from episerve._output_torch import SharedArray, TorchFormatter

    tensor = shared_empty(torch, (8, 3, 4, 5), torch.uint8)
    frames = tensor.numpy().view(SharedArray)
    frames.shared = tensor
    frames[...] = np.arange(frames.size, dtype=np.uint64).reshape(frames.shape) % 251
    joined = np.concatenate([frames[:2], frames[6:]])
    batch = TorchFormatter().format({"view": frames[2:6], "joined": joined, "small": frames[7:], "index": np.arange(4)})
    assert batch["view"].is_shared() and batch["view"].untyped_storage().data_ptr() == tensor.data_ptr()
    assert not batch["joined"].is_shared()
    assert not batch["small"].is_shared()  # under half of the allocation: copied, not the whole of it sent along
    received = pickle.loads(worker_pickle(batch))
    assert np.array_equal(received["view"].numpy(), frames[2:6])
    assert np.array_equal(received["joined"].numpy(), np.concatenate([frames[:2], frames[6:]]))
    assert np.array_equal(received["small"].numpy(), frames[7:])
    assert received["index"].tolist() == [0, 1, 2, 3]


def test_a_single_small_tensor_and_empty_batches_travel_intact() -> None:
    for batch in (
        TensorBatch(index=torch.arange(3)),
        TensorBatch(index=torch.empty(0, dtype=torch.int64)),
        TensorBatch(state=torch.empty(0, 6), index=torch.empty(0, dtype=torch.int64), task=[]),
    ):
        received = pickle.loads(worker_pickle(batch))
        assert list(received) == list(batch)
        for name, value in batch.items():
            if isinstance(value, torch.Tensor):
                assert received[name].dtype == value.dtype and torch.equal(received[name], value)
            else:
                assert received[name] == value


class _FilledFrames:
    """A map-style dataset whose batches carry a large column written straight into shared memory (as the client
    writes camera frames), filled with the batch's first index, and a large packed block (`state`)."""

    def __len__(self) -> int:
        return 48

    def __getitems__(self, indices: list[int]) -> TensorBatch:
        frames = shared_empty(torch, (4, 3, 128, 128), torch.uint8)
        frames.fill_(indices[0] % 251)
        rows = INLINE_BLOCK_BYTES // 64 + 1
        state = torch.full((rows, 16), float(indices[0]))
        return TensorBatch(frames=frames, state=state, index=torch.tensor(indices))


def shared_memory_file(tensor: torch.Tensor) -> int:
    """The inode of the shared-memory file a tensor lies in (the same for a block that is used again)."""
    import os

    fd, _ = tensor.untyped_storage()._share_fd_cpu_()
    return os.fstat(fd).st_ino


def intact(batch: dict) -> bool:
    first = int(batch["index"][0])
    return bool((batch["frames"] == first % 251).all()) and bool((batch["state"] == first).all())


def test_workers_write_later_batches_into_blocks_the_main_process_has_dropped() -> None:
    loader = DataLoader(_FilledFrames(), batch_size=1, num_workers=2, collate_fn=lambda batch: batch)
    files, firsts = set(), []
    for batch in loader:  # each batch is dropped when the next one arrives
        assert intact(batch)
        files |= {shared_memory_file(batch["frames"]), shared_memory_file(batch["state"])}
        firsts.append(int(batch["index"][0]))
    assert sorted(firsts) == list(range(48))
    assert len(files) <= 96 // 3  # 96 blocks handed over in a third as many files or fewer


def test_blocks_the_main_process_holds_are_never_written_again() -> None:
    loader = DataLoader(_FilledFrames(), batch_size=1, num_workers=2, collate_fn=lambda batch: batch)
    held, views, files = [], [], set()
    for number, batch in enumerate(loader):
        files.add(shared_memory_file(batch["frames"]))
        if number % 3 == 0:
            held.append(batch)  # the whole batch
        elif number % 3 == 1:
            views.append((int(batch["index"][0]), batch["frames"][2:].numpy()))  # only a numpy view of a part
    assert all(intact(batch) for batch in held)
    assert all((view == first % 251).all() for first, view in views)
    assert len(files) >= len(held) + len(views)  # every block still held is its own


def test_reuse_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPISERVE_REUSE_SHARED_MEMORY", "0")
    loader = DataLoader(_FilledFrames(), batch_size=1, num_workers=2, collate_fn=lambda batch: batch)
    files = set()
    for batch in loader:
        assert intact(batch)
        files.add(shared_memory_file(batch["frames"]))
    assert len(files) == 48


def _frames_and_index(batch: TensorBatch) -> tuple[torch.Tensor, torch.Tensor]:
    return batch["frames"], batch["index"]


def test_blocks_sent_outside_a_tensor_batch_are_never_written_again() -> None:
    """A collate_fn (or transform) that hands out a pooled block's tensors in a plain tuple sends them without a
    ticket: the worker cannot tell when the main process is done with them, so it must not write them again."""
    loader = DataLoader(_FilledFrames(), batch_size=1, num_workers=2, collate_fn=_frames_and_index)
    held = []
    for frames, index in loader:
        assert (frames == int(index[0]) % 251).all()  # not overwritten while on its way
        held.append((int(index[0]), frames))
    assert sorted(first for first, _ in held) == list(range(48))
    assert all((frames == first % 251).all() for first, frames in held)


class _FramesOfWorker(_FilledFrames):
    def __getitems__(self, indices: list[int]) -> TensorBatch:
        import os

        batch = _FilledFrames.__getitems__(self, indices)
        batch["worker"] = torch.tensor(os.getpid())
        return batch


def test_ended_workers_leave_no_blocks_behind_with_the_file_system_strategy() -> None:
    """Under "file_system" a block lives in /dev/shm until every process holding it lets go; a worker ends with
    `os._exit`, so its pool must let go of its blocks before."""
    import os

    strategy = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy("file_system")
    try:
        loader = DataLoader(_FramesOfWorker(), batch_size=1, num_workers=2, collate_fn=lambda batch: batch)
        first_workers = {int(batch["worker"]) for batch in loader}
        for batch in loader:  # new workers; the main process forgets the first ones' control blocks
            assert intact(batch)
        del batch
    finally:
        torch.multiprocessing.set_sharing_strategy(strategy)
    left = [name for name in os.listdir("/dev/shm") if any(name.startswith(f"torch_{pid}_") for pid in first_workers)]
    assert len(first_workers) == 2 and left == []


class _ReportingFrames(_FilledFrames):
    """`_FilledFrames` whose batches also say how many of their worker's pooled blocks were free."""

    def __getitems__(self, indices: list[int]) -> TensorBatch:
        from episerve import _shared_blocks

        batch = super().__getitems__(indices)
        batch["idle_blocks"] = torch.tensor(_shared_blocks._pool.idle_blocks())
        return batch


def test_a_burst_of_held_batches_leaves_at_most_a_few_free_blocks_behind() -> None:
    from episerve._shared_blocks import KEPT_FREE

    loader = DataLoader(_ReportingFrames(), batch_size=1, num_workers=2, collate_fn=lambda batch: batch)
    held, idle_later = [], []
    for number, batch in enumerate(loader):
        assert intact(batch)
        if number < 16:
            held.append(batch)  # each worker's 8 slots fill up with blocks the main process holds
        elif number == 16:
            assert all(intact(batch) for batch in held)
            held.clear()  # all released at once
        elif number > 24:
            idle_later.append(int(batch["idle_blocks"]))
    assert idle_later and max(idle_later) <= KEPT_FREE
