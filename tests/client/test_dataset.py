"""`EpisodeDataset` through a real torch DataLoader: every row once, values equal to the oracle, one request per
batch, images decoded, numpy output without torch."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, default_collate

import episerve
from episerve._columns import table_columns
from episerve._outputs import to_output
from tests.client.helpers import DEMO, assert_batch_equals_view, exactly_once, positions_by_index
from tests.support import oracle


def test_dataloader_epoch_with_workers_yields_every_row_once_equal_to_the_oracle(url: str, demo_view: pa.Table) -> None:
    dataset = episerve.EpisodeDataset(url, DEMO)
    assert len(dataset) == demo_view.num_rows
    loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=2, collate_fn=episerve.collate)
    positions = positions_by_index(demo_view)
    seen = []
    for batch in loader:
        assert batch["observation.state"].shape == (len(batch["index"]), 6)
        assert batch["observation.state"].dtype == torch.float32
        assert batch["index"].dtype == torch.int64 and batch["index"].ndim == 1
        assert_batch_equals_view(batch, demo_view, positions)
        seen.append(batch["index"].numpy())
    assert exactly_once(seen, demo_view["index"].to_numpy())


def test_samples_are_dicts_of_tensors_and_negative_indices_count_from_the_end(url: str, demo_path: Path) -> None:
    view = oracle(demo_path, [7, 3])
    dataset = episerve.EpisodeDataset(url, DEMO, episodes=[7, 3], columns=["action", "index", "observation.image"])
    last = dataset[-1]
    assert set(last) == {"action", "index", "observation.image"}
    assert last["action"].shape == (6,) and last["index"].shape == ()
    assert int(last["index"]) == view["index"][-1].as_py()
    np.testing.assert_array_equal(last["action"].numpy(), np.asarray(view["action"][-1].as_py(), np.float32))
    assert last["observation.image"] == view["observation.image"][-1].as_py()["bytes"]


def test_getitems_is_one_request_returning_the_batch_whole(url: str, demo_view: pa.Table) -> None:
    dataset = episerve.EpisodeDataset(url, DEMO, columns=["index", "action"])
    batch = dataset.__getitems__([5, 0, 5, -1])
    assert isinstance(batch, episerve.Batch) and len(batch) == 4
    assert episerve.collate(batch) is batch.data
    assert batch.data["index"].tolist() == demo_view["index"].to_numpy()[[5, 0, 5, -1]].tolist()
    assert batch.data["action"].shape == (4, 6)
    # torch's default collate still works on it, sample by sample
    stacked = default_collate(batch)
    assert torch.equal(stacked["action"], batch.data["action"])


def test_transform_applies_per_sample_and_collate_stacks_them_again(url: str) -> None:
    def double(sample: dict) -> dict:
        return {**sample, "action": sample["action"] * 2}

    plain = episerve.EpisodeDataset(url, DEMO, columns=["action"])
    doubled = episerve.EpisodeDataset(url, DEMO, columns=["action"], transform=double)
    batch = next(iter(DataLoader(doubled, batch_size=8, collate_fn=episerve.collate)))
    assert torch.equal(batch["action"], plain.__getitems__(list(range(8))).data["action"] * 2)


def test_decoded_images_are_uint8_chw_equal_to_pillow(url: str, demo_view: pa.Table) -> None:
    dataset = episerve.EpisodeDataset(url, DEMO, columns=["observation.image", "index"], decode_images=True)
    indices = [0, 17, len(dataset) - 1]
    images = dataset.__getitems__(indices).data["observation.image"]
    assert images.dtype == torch.uint8 and images.shape == (3, 3, 16, 16)
    for row, position in enumerate(indices):
        blob = demo_view["observation.image"][position].as_py()["bytes"]
        want = np.asarray(Image.open(io.BytesIO(blob))).transpose(2, 0, 1)
        np.testing.assert_array_equal(images[row].numpy(), want)
    assert dataset[1]["observation.image"].shape == (3, 16, 16)


def test_dataset_pickles_without_connections(url: str) -> None:
    dataset = episerve.EpisodeDataset(url, DEMO, columns=["index"])
    dataset[0]
    copy = pickle.loads(pickle.dumps(dataset))
    assert copy.client._transport is None
    assert len(copy) == len(dataset) and int(copy[3]["index"]) == int(dataset[3]["index"])


def test_fixed_size_lists_convert_zero_copy_to_numpy(url: str, demo_view: pa.Table) -> None:
    client = episerve.Client(url)
    pages = client.read_take(
        episerve.Selection.of(DEMO, columns=["observation.state", "timestamp", "index"]), [4, 1, 9]
    )
    columns = to_output(table_columns(pages.table, buffers=pages.buffers), "numpy")
    state = columns["observation.state"]
    assert isinstance(state, np.ndarray) and state.shape == (3, 6) and state.dtype == np.float32
    want = np.stack(demo_view["observation.state"].to_numpy(zero_copy_only=False)[[4, 1, 9]])
    np.testing.assert_array_equal(state, want)
    # the arrays are views of the response buffer, not copies
    (buffer,) = pages.buffers
    assert buffer.address <= state.ctypes.data < buffer.address + buffer.size
    assert state.flags.writeable


def test_nested_fixed_size_lists_become_windows_of_vectors() -> None:
    steps = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(2 * 3 * 4, dtype=np.float32)), 4)
    windows = pa.FixedSizeListArray.from_arrays(steps, 3)
    pads = pa.FixedSizeListArray.from_arrays(pa.array([False, True, False, True, True, False]), 3)
    table = pa.table({"action": windows, "action_is_pad": pads, "task": ["a", "b"]})
    columns = to_output(table_columns(table), "torch")
    assert columns["action"].shape == (2, 3, 4)
    assert torch.equal(columns["action"].flatten(), torch.arange(24, dtype=torch.float32))
    assert columns["action_is_pad"].dtype == torch.bool and columns["action_is_pad"].shape == (2, 3)
    assert columns["task"] == ["a", "b"]


def test_fixed_size_lists_of_a_sliced_array_keep_their_rows() -> None:
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(12, dtype=np.int32)), 3).slice(1, 2)
    columns = table_columns(pa.table({"v": vectors}))
    np.testing.assert_array_equal(columns["v"], [[3, 4, 5], [6, 7, 8]])


def test_variable_lists_keep_their_rows_when_a_null_list_spans_values() -> None:
    # Arrow lets a null list's offsets span values; they belong to no row, and the rows after it stay aligned
    lists = pa.ListArray.from_arrays(
        pa.array([0, 2, 4, 5], pa.int32()), pa.array([1.0, 2.0, 3.0, 4.0, 5.0]), mask=pa.array([False, True, False])
    )
    for array, expected in ((lists, [[1.0, 2.0], None, [5.0]]), (lists.slice(1), [None, [5.0]])):
        rows = table_columns(pa.table({"v": array}))["v"]
        assert [None if row is None else row.tolist() for row in rows] == expected


def test_null_fixed_size_lists_arrive_as_none_next_to_their_neighbours_values(url: str, datasets_root: Path) -> None:
    view = oracle(datasets_root / "nullable", None)
    dataset = episerve.EpisodeDataset(url, "nullable", output="numpy")
    order = [10, 1, 0, 4, 7, 11]
    samples = dataset.__getitems__(order)
    batch = episerve.collate(samples)
    expected = view["pose"].to_pylist()
    for row, position in enumerate(order):
        got = batch["pose"][row]
        if expected[position] is None:
            assert got is None
        else:
            np.testing.assert_array_equal(got, np.asarray(expected[position], dtype=np.float32))
    assert batch["step"].tolist() == view["step"].to_numpy()[order].tolist()
    assert [sample["pose"] is None for sample in samples] == [expected[p] is None for p in order]


def test_null_numbers_and_flags_read_as_pyarrow_gives_them(url: str, datasets_root: Path) -> None:
    view = oracle(datasets_root / "nullable", None)
    order = [2, 0, 6, 11, 10]
    columns = episerve.Client(url).take("nullable", order, columns=["reading", "count", "flag"])
    converted = table_columns(columns)
    for name in ("reading", "count", "flag"):
        expected = view[name].take(order).to_numpy(zero_copy_only=False)
        assert converted[name].dtype == expected.dtype, name
        np.testing.assert_array_equal(converted[name], expected)
    assert converted["count"].dtype == np.float64 and np.isnan(converted["count"][0])
    assert converted["flag"].tolist() == [None, True, None, False, None]


def test_without_torch_samples_are_numpy_arrays(url: str) -> None:
    code = (
        "import sys\nsys.modules['torch'] = None\nimport numpy as np, episerve\n"
        f"ds = episerve.EpisodeDataset({url!r}, {DEMO!r}, columns=['action', 'index', 'task_index'])\n"
        "batch = episerve.collate(ds.__getitems__([0, 1, 2]))\n"
        "assert isinstance(batch['action'], np.ndarray) and batch['action'].shape == (3, 6), batch\n"
        "sample = ds[2]\n"
        "assert isinstance(sample['action'], np.ndarray) and sample['action'].shape == (6,)\n"
        "stacked = episerve.collate([ds[0], ds[1]])\n"
        "assert isinstance(stacked['action'], np.ndarray) and stacked['action'].shape == (2, 6)\n"
        "print(int(sample['index']))"
    )
    assert run_fresh(code) == "2"


def test_reading_every_column_kind_leaves_pandas_unimported(url: str) -> None:
    """pyarrow's `to_numpy` imports pandas (~0.3 s and ~35 MB in every fresh DataLoader worker); ours does not."""
    windows = {"observation.state": [-1 / 30, 0.0]}
    code = (
        "import sys, episerve\n"
        f"ds = episerve.EpisodeDataset({url!r}, {DEMO!r}, delta_timestamps={windows!r})\n"
        "batch = ds.__getitems__([0, 5, 9]).data\n"
        f"stream = episerve.EpisodeIterableDataset({url!r}, {DEMO!r}, batch_size=4, chunk_rows=16, shuffle=True)\n"
        "first = next(iter(stream))\n"
        "assert batch['observation.state_is_pad'][0].tolist() == [True, False], batch\n"
        "assert isinstance(batch['observation.image'][0], bytes) and isinstance(first['observation.image'][0], bytes)\n"
        f"nullable = episerve.EpisodeDataset({url!r}, 'nullable').__getitems__([1, 2, 3]).data\n"
        "assert nullable['pose'][0] is None and nullable['flag'][1] is None, nullable\n"
        "print('pandas' in sys.modules)"
    )
    assert run_fresh(code) == "False"


def run_fresh(code: str) -> str:
    """What `code` prints in a fresh interpreter (which must exit cleanly)."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=os.environ)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.parametrize("output", ["numpy", "torch"])
def test_output_can_be_chosen_explicitly(url: str, output: str) -> None:
    dataset = episerve.EpisodeDataset(url, DEMO, columns=["action"], output=output)
    value = dataset[0]["action"]
    assert isinstance(value, np.ndarray if output == "numpy" else torch.Tensor)


def test_spawned_workers_receive_a_pickled_dataset_and_connect_themselves(url: str, demo_view: pa.Table) -> None:
    dataset = episerve.EpisodeDataset(url, DEMO, columns=["index", "action"])
    dataset[0]  # the parent holds an open connection, which must not travel
    loader = DataLoader(
        dataset, batch_size=100, num_workers=1, multiprocessing_context="spawn", collate_fn=episerve.collate
    )
    batches = list(loader)
    assert exactly_once([b["index"].numpy() for b in batches], demo_view["index"].to_numpy())
