"""`RemoteLeRobotDataset` returns what `LeRobotDataset` returns: every key of every sample equals a reference
implementation of LeRobot's rules (format reference, section 5) that reads the parquet and mp4 files directly —
dtypes, shapes, values, key order and `task` — for v2.1 and v3.0, parquet images and video cameras, all rows,
unsorted picks and windows at both episode edges; batches through DataLoader workers equal the stacked samples;
the metadata and statistics equal the files'."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, default_collate

import episerve
from app.demo import IMAGE
from app.demo_cameras import TOP_CAMERA, WRIST_CAMERA
from episerve.lerobot import RemoteLeRobotDataset, collate
from tests.support import ServerProcess
from tests.video_oracle import frames_for_rows

FORMATS = {"cams-v3": "v3.0", "cams-v21": "v2.1"}
WINDOWS = {
    "action": [-2 / 30, 0.0, 1 / 30, 3 / 30],
    "observation.state": [-1 / 30, 0.0],
    TOP_CAMERA: [-1 / 30, 0.0, 2 / 30],
    IMAGE: [-1 / 30, 0.0],
    WRIST_CAMERA: [0.0],
}


@pytest.fixture(scope="module")
def camera_server(video_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess([video_root], tmp_path_factory.mktemp("lerobot-cache"), workers=2) as running:
        yield running


# ----------------------------------------------------------------------------------------------------
# The reference: LeRobot's rules over the files themselves


class LeRobotReference:
    """`LeRobotDataset.__getitem__` written out plainly: the data files in sorted path order filtered to the
    episodes, windows clamped to the episode, videos decoded by the test's own PyAV oracle, values through
    `torch.tensor` (floats float32, integers int64), images through Pillow and `ToTensor`'s arithmetic."""

    def __init__(self, root: Path, episodes: list[int] | None = None, delta_timestamps: dict | None = None) -> None:
        self.root = root
        self.info = json.loads((root / "meta/info.json").read_text())
        files = sorted((root / "data").glob("*/*.parquet"))
        table = pa.concat_tables([pq.read_table(f) for f in files])
        if episodes is not None:
            keep = np.isin(table["episode_index"].to_numpy(), episodes)
            table = table.filter(pa.array(keep))
        self.rows = table.to_pylist()
        self.columns = table.column_names
        features = self.info["features"]
        self.video_keys = [k for k, f in features.items() if f["dtype"] == "video"]
        self.camera_keys = [k for k, f in features.items() if f["dtype"] in ("image", "video")]
        self.hf_columns = [k for k in features if k not in self.video_keys]
        self.fps = self.info["fps"]
        self.delta_indices = {k: [round(d * self.fps) for d in v] for k, v in (delta_timestamps or {}).items()}
        self.tasks = _tasks(root, self.info["codebase_version"])
        episode_of = np.array([row["episode_index"] for row in self.rows])
        self.bounds = {
            int(e): (int(np.flatnonzero(episode_of == e)[0]), int(np.flatnonzero(episode_of == e)[-1]) + 1)
            for e in np.unique(episode_of)
        }

    def __len__(self) -> int:
        return len(self.rows)

    def item(self, idx: int, image_transforms: Callable | None = None) -> dict[str, Any]:
        row = self.rows[idx]
        item = {name: self._value(name, row[name]) for name in self.hf_columns}
        episode = row["episode_index"]
        start, end = self.bounds[episode]
        positions: dict[str, list[int]] = {}
        if self.delta_indices:
            padding = {}
            for key, deltas in self.delta_indices.items():
                positions[key] = [max(start, min(end - 1, idx + k)) for k in deltas]
                padding[f"{key}_is_pad"] = torch.BoolTensor([not start <= idx + k < end for k in deltas])
            item = {**item, **padding}
            for key, picked in positions.items():
                if key not in self.video_keys:
                    item[key] = torch.stack([self._value(key, self.rows[p][key]) for p in picked])
        videos = {}
        for key in self.video_keys:
            picked = positions.get(key, [idx])
            frames = frames_for_rows(self.root, key, [(episode, self.rows[p]["frame_index"]) for p in picked])
            decoded = torch.from_numpy(frames).permute(0, 3, 1, 2).to(torch.float32) / 255
            videos[key] = decoded.squeeze(0)
        item = {**videos, **item}
        if image_transforms is not None:
            for key in self.camera_keys:
                item[key] = image_transforms(item[key])
        item["task"] = self.tasks[item["task_index"].item()]
        return item

    def _value(self, name: str, value: Any) -> Any:
        if self.info["features"].get(name, {}).get("dtype") == "image":
            pixels = np.array(Image.open(io.BytesIO(value["bytes"])).convert("RGB"))
            return torch.from_numpy(pixels).permute(2, 0, 1).contiguous().to(torch.float32).div(255)
        return torch.tensor(value)


def _tasks(root: Path, version: str) -> dict[int, str]:
    if version == "v2.1":
        lines = (root / "meta/tasks.jsonl").read_text().splitlines()
        return {json.loads(line)["task_index"]: json.loads(line)["task"] for line in lines}
    table = pq.read_table(root / "meta/tasks.parquet").to_pylist()
    return {row["task_index"]: row["task"] for row in table}


@cache
def reference(root: Path, episodes: tuple[int, ...] | None = None, windows: bool = False) -> LeRobotReference:
    return LeRobotReference(root, None if episodes is None else list(episodes), WINDOWS if windows else None)


def assert_same_sample(got: dict[str, Any], expected: dict[str, Any], where: str) -> None:
    assert list(got) == list(expected), where
    for key, value in expected.items():
        if isinstance(value, str):
            assert got[key] == value, f"{where}: {key}"
            continue
        assert isinstance(got[key], torch.Tensor), f"{where}: {key}"
        assert got[key].dtype == value.dtype, f"{where}: {key}: {got[key].dtype} != {value.dtype}"
        assert got[key].shape == value.shape, f"{where}: {key}: {tuple(got[key].shape)} != {tuple(value.shape)}"
        assert torch.equal(got[key], value), f"{where}: {key}"


def halve_and_flip(frames: torch.Tensor) -> torch.Tensor:
    """An image transform (module level, so DataLoader workers can unpickle it)."""
    return frames.flip(-1) * 0.5


# ----------------------------------------------------------------------------------------------------
# Samples


@pytest.mark.parametrize("name", FORMATS)
def test_every_row_equals_lerobots_sample(video_root: Path, camera_server: ServerProcess, name: str) -> None:
    expected = reference(video_root / name)
    ds = RemoteLeRobotDataset(camera_server.url, name)
    assert len(ds) == len(expected)
    for start in range(0, len(ds), 128):
        batch = ds.__getitems__(list(range(start, min(start + 128, len(ds)))))
        for offset, sample in enumerate(batch):
            assert_same_sample(sample, expected.item(start + offset), f"{name} row {start + offset}")


@pytest.mark.parametrize("name", FORMATS)
def test_single_samples_by_index_equal_lerobots(video_root: Path, camera_server: ServerProcess, name: str) -> None:
    expected = reference(video_root / name)
    ds = RemoteLeRobotDataset(camera_server.url, name)
    picks = [0, len(ds) - 1, -1, -len(ds), *np.random.default_rng(0).integers(0, len(ds), 12).tolist()]
    for index in picks:
        assert_same_sample(ds[index], expected.item(index % len(ds)), f"{name}[{index}]")
    with pytest.raises(IndexError):
        ds[len(ds)]


@pytest.mark.parametrize("name", FORMATS)
def test_unsorted_pick_with_windows_at_both_episode_edges_equals_lerobots(
    video_root: Path, camera_server: ServerProcess, name: str
) -> None:
    expected = reference(video_root / name, (2, 4, 6), windows=True)
    ds = RemoteLeRobotDataset(camera_server.url, name, episodes=[6, 2, 4], delta_timestamps=WINDOWS)
    assert len(ds) == len(expected)
    edges = sorted({p for lo, hi in expected.bounds.values() for p in (lo, lo + 1, lo + 2, hi - 3, hi - 2, hi - 1)})
    shuffled = np.random.default_rng(1).permutation(len(ds))[:20].tolist()
    for picks in (edges, shuffled):
        for position, sample in zip(picks, ds.__getitems__(picks), strict=True):
            assert_same_sample(sample, expected.item(position), f"{name} row {position}")
    sample = ds[edges[0]]
    assert sample[TOP_CAMERA].shape == (3, 3, 64, 96)
    assert sample[WRIST_CAMERA].shape == (3, 48, 64)  # a one-frame video window is squeezed, as LeRobot does
    assert sample[IMAGE].shape == (2, 3, 16, 16)
    assert sample["action_is_pad"].tolist() == [True, False, False, False]


def test_image_transforms_apply_to_every_camera_key(video_root: Path, camera_server: ServerProcess) -> None:
    expected = reference(video_root / "cams-v3", (1, 3), windows=True)
    ds = RemoteLeRobotDataset(
        camera_server.url, "cams-v3", episodes=[3, 1], delta_timestamps=WINDOWS, image_transforms=halve_and_flip
    )
    for position in (0, 5, len(ds) - 1):
        assert_same_sample(ds[position], expected.item(position, halve_and_flip), f"row {position}")
    plain = RemoteLeRobotDataset(camera_server.url, "cams-v3", episodes=[3, 1], delta_timestamps=WINDOWS)
    assert not torch.equal(ds[0][TOP_CAMERA], plain[0][TOP_CAMERA])
    assert torch.equal(ds[0]["action"], plain[0]["action"])


def test_image_transforms_set_after_construction_apply_too(camera_server: ServerProcess) -> None:
    constructed = RemoteLeRobotDataset(camera_server.url, "cams-v3", episodes=[1], image_transforms=halve_and_flip)
    ds = RemoteLeRobotDataset(camera_server.url, "cams-v3", episodes=[1])
    ds.image_transforms = halve_and_flip
    assert ds.image_transforms is halve_and_flip
    assert torch.equal(ds[2][TOP_CAMERA], constructed[2][TOP_CAMERA])


def test_lerobot_samples_are_an_output_of_the_registry() -> None:
    from episerve._columns import table_columns
    from episerve._outputs import formatter

    output = formatter(
        "lerobot",
        video_keys=["cam"],
        image_keys=[],
        stored=["action", "task_index"],
        windows={"cam": [0.0]},
        tasks={1: "stack"},
    )
    frames = np.arange(2 * 1 * 4 * 5 * 3, dtype=np.uint8).reshape(2, 1, 4, 5, 3)
    table = pa.table(
        {
            "cam": pa.FixedShapeTensorArray.from_numpy_ndarray(frames),
            "action": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(12, dtype=np.float64)), 6),
            "task_index": pa.array([1, 1], pa.int32()),
            "cam_is_pad": pa.array([[False], [True]], pa.list_(pa.bool_(), 1)),
        }
    )
    batch = output.format(table_columns(table, empty=output.empty, frames=output.frames))
    assert list(batch) == ["cam", "action", "task_index", "cam_is_pad", "task"]
    assert batch["cam"].dtype == torch.float32 and batch["cam"].shape == (2, 3, 4, 5)  # one-frame window squeezed
    assert torch.equal(batch["cam"][1, 2], torch.from_numpy(frames[1, 0, :, :, 2]).float() / 255)
    assert batch["action"].dtype == torch.float32 and batch["action"].shape == (2, 6)
    assert batch["task_index"].dtype == torch.int64
    assert batch["cam_is_pad"].tolist() == [[False], [True]]
    assert batch["task"] == ["stack", "stack"]


# ----------------------------------------------------------------------------------------------------
# Batches through DataLoader workers


@pytest.mark.parametrize(
    ("collate_fn", "transforms"),
    [(collate, None), (RemoteLeRobotDataset.collate, halve_and_flip), (None, None)],
    ids=["collate", "method-with-transforms", "default"],
)
def test_dataloader_batches_equal_the_stacked_samples(
    camera_server: ServerProcess, collate_fn: Callable | None, transforms: Callable | None
) -> None:
    ds = RemoteLeRobotDataset(
        camera_server.url, "cams-v3", episodes=[0, 5, 7], delta_timestamps=WINDOWS, image_transforms=transforms
    )
    order = np.random.default_rng(2).permutation(len(ds)).tolist()[:60]
    loader = DataLoader(ds, batch_size=16, sampler=order, num_workers=2, collate_fn=collate_fn)
    batches = list(loader)
    assert len(batches) == 4
    for number, batch in enumerate(batches):
        stacked = default_collate([ds[i] for i in order[number * 16 : (number + 1) * 16]])
        assert list(batch) == list(stacked)
        for key, value in stacked.items():
            if isinstance(value, torch.Tensor):
                assert batch[key].dtype == value.dtype and torch.equal(batch[key], value), key
            else:
                assert list(batch[key]) == value, key


def test_the_batch_path_keeps_batches_whole(camera_server: ServerProcess) -> None:
    ds = RemoteLeRobotDataset(camera_server.url, "cams-v21", delta_timestamps={"action": [0.0, 1 / 30]})
    batch = collate(ds.__getitems__([3, 1, 2]))
    assert type(batch).__name__ == "TensorBatch"
    assert batch["action"].shape == (3, 2, 6)
    assert batch[TOP_CAMERA].shape == (3, 3, 64, 96) and batch[TOP_CAMERA].dtype == torch.float32
    assert batch["index"].tolist() == [3, 1, 2]
    assert len(batch["task"]) == 3 and all(isinstance(t, str) for t in batch["task"])


# ----------------------------------------------------------------------------------------------------
# Metadata


@pytest.mark.parametrize("name", FORMATS)
def test_metadata_equals_the_dataset_files(video_root: Path, camera_server: ServerProcess, name: str) -> None:
    root = video_root / name
    info = json.loads((root / "meta/info.json").read_text())
    ds = RemoteLeRobotDataset(camera_server.url, name, episodes=[4, 1])
    meta = ds.meta
    assert meta.fps == ds.fps == info["fps"] and isinstance(meta.fps, int)
    assert meta.features == ds.features == info["features"]
    assert meta.camera_keys == ds.camera_keys == [IMAGE, TOP_CAMERA, WRIST_CAMERA]
    assert meta.video_keys == [TOP_CAMERA, WRIST_CAMERA] and meta.image_keys == [IMAGE]
    assert meta.tasks == _tasks(root, info["codebase_version"])
    assert (meta.total_episodes, meta.total_frames, meta.total_tasks) == (
        info["total_episodes"],
        info["total_frames"],
        info["total_tasks"],
    )
    assert meta.shapes["action"] == (6,) and meta.names["action"] == info["features"]["action"]["names"]
    rows = reference(root).rows
    for episode, entry in meta.episodes.items():
        indices = [r["index"] for r in rows if r["episode_index"] == episode]
        tasks = {meta.tasks[r["task_index"]] for r in rows if r["episode_index"] == episode}
        assert (entry["length"], entry["dataset_from_index"], entry["dataset_to_index"]) == (
            len(indices),
            indices[0],
            indices[-1] + 1,
        )
        assert set(entry["tasks"]) == tasks
    assert ds.episodes == [4, 1] and ds.num_episodes == 2
    from_generator = RemoteLeRobotDataset(camera_server.url, name, episodes=(e for e in [4, 1]))
    assert from_generator.episodes == [4, 1] and len(from_generator) == len(ds)
    assert ds.num_frames == len(ds) == meta.episodes[1]["length"] + meta.episodes[4]["length"]


def test_stats_equal_the_v30_stats_file(video_root: Path, camera_server: ServerProcess) -> None:
    on_disk = json.loads((video_root / "cams-v3/meta/stats.json").read_text())
    stats = RemoteLeRobotDataset(camera_server.url, "cams-v3").meta.stats
    assert list(stats) == list(on_disk)
    for feature, values in on_disk.items():
        assert list(stats[feature]) == list(values)
        for stat, value in values.items():
            assert isinstance(stats[feature][stat], torch.Tensor)
            assert torch.equal(stats[feature][stat], torch.tensor(value)), (feature, stat)
    assert stats[TOP_CAMERA]["mean"].shape == (3, 1, 1)


def test_stats_of_v21_are_its_episode_stats_merged_as_lerobot_does(
    video_root: Path, camera_server: ServerProcess
) -> None:
    lines = (video_root / "cams-v21/meta/episodes_stats.jsonl").read_text().splitlines()
    episodes = [json.loads(line)["stats"] for line in lines]
    stats = RemoteLeRobotDataset(camera_server.url, "cams-v21").meta.stats
    assert set(stats) == set(episodes[0])
    for feature, merged in stats.items():
        parts = [e[feature] for e in episodes]
        counts = np.array([p["count"] for p in parts], dtype=np.float64)
        means = np.array([p["mean"] for p in parts])
        while counts.ndim < means.ndim:
            counts = counts[..., None]
        mean = (means * counts).sum(axis=0) / counts.sum(axis=0)
        variance = ((np.array([p["std"] for p in parts]) ** 2 + (means - mean) ** 2) * counts).sum(axis=0)
        std = np.sqrt(variance / counts.sum(axis=0))
        torch.testing.assert_close(merged["mean"], torch.tensor(mean, dtype=torch.float32))
        torch.testing.assert_close(merged["std"], torch.tensor(std, dtype=torch.float32))
        assert torch.equal(merged["min"], torch.tensor(np.min([p["min"] for p in parts], axis=0).tolist()))
        assert torch.equal(merged["max"], torch.tensor(np.max([p["max"] for p in parts], axis=0).tolist()))
        assert merged["count"].tolist() == [int(sum(p["count"][0] for p in parts))]


def test_mistakes_fail_at_construction(camera_server: ServerProcess) -> None:
    with pytest.raises(episerve.NotFound):
        RemoteLeRobotDataset(camera_server.url, "cams-v3", episodes=[2, 99])
    with pytest.raises(episerve.InvalidRequest, match=r"0\.033"):
        RemoteLeRobotDataset(camera_server.url, "cams-v3", delta_timestamps={"action": [0.0, 0.033]})
    with pytest.raises(episerve.NotFound):
        RemoteLeRobotDataset(camera_server.url, "nope")


def test_importing_without_torch_names_the_extra() -> None:
    code = "import sys; sys.modules['torch'] = None; import episerve.lerobot"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "pip install 'episerve[torch]'" in result.stderr
