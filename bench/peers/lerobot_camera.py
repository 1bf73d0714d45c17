"""P10's peer: LeRobot 0.4.4's per-sample path over a camera dataset with action windows.

Per sample, as `LeRobotDataset.__getitem__` does (format reference, section 5): the row's columns as tensors
(`hf_transform_to_torch`), the action window `clamp(i + k, from, to - 1)` with its `action_is_pad`, the camera
frame decoded by the pyav backend (`bench.peers.camera_decode.decode_one`: open the file, seek to the keyframe
before the frame, decode forward, close) and converted to float32 in [0, 1], then `task`. The rows, episode
bounds and tasks are numpy arrays loaded once (LeRobot reads them from its HF dataset per sample), which makes
the peer faster than LeRobot, not slower. torch's default collate stacks the samples.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow.parquet as pq

from bench.camera_datasets import CAMERA, CameraDataset
from bench.datasets import ACTION, EPISODES_PATH, FPS, STATE
from bench.peers.camera_decode import decode_one, row_locations

SCALARS = ("timestamp", "frame_index", "episode_index", "index", "task_index")


class LeRobotStyleCameraSamples:
    """Map-style dataset: `[i]` is LeRobot's sample dict for row `i` with `delta_timestamps` windows."""

    def __init__(self, dataset: CameraDataset, delta_timestamps: dict[str, list[float]]) -> None:
        self.root = dataset.path
        self.files, self.file_of_row, self.time_of_row = row_locations(dataset)
        data = pq.read_table(sorted((dataset.path / "data").rglob("*.parquet"))[0])
        self.columns = {
            name: np.stack(data[name].to_numpy(zero_copy_only=False))
            if name in (STATE, ACTION)
            else data[name].to_numpy()
            for name in (STATE, ACTION, *SCALARS)
        }
        episodes = pq.read_table(dataset.path / EPISODES_PATH).to_pylist()
        self.bounds = {e["episode_index"]: (e["dataset_from_index"], e["dataset_to_index"]) for e in episodes}
        tasks = pq.read_table(dataset.path / "meta/tasks.parquet").to_pylist()
        self.tasks = {t["task_index"]: t["task"] for t in tasks}
        self.delta_indices = {key: [round(d * FPS) for d in deltas] for key, deltas in delta_timestamps.items()}

    def __len__(self) -> int:
        return len(self.time_of_row)

    def __getitem__(self, idx: int) -> dict[str, Any]:
        import torch

        item = {name: torch.tensor(values[idx].tolist()) for name, values in self.columns.items()}
        start, end = self.bounds[int(self.columns["episode_index"][idx])]
        for key, deltas in self.delta_indices.items():
            picked = [max(start, min(end - 1, idx + k)) for k in deltas]
            item[f"{key}_is_pad"] = torch.BoolTensor([not start <= idx + k < end for k in deltas])
            item[key] = torch.stack([torch.tensor(self.columns[key][p].tolist()) for p in picked])
        pixels = decode_one(self.root / self.files[self.file_of_row[idx]], float(self.time_of_row[idx]))
        frame = torch.from_numpy(pixels).permute(2, 0, 1).to(torch.float32) / 255
        item = {CAMERA: frame, **item}
        item["task"] = self.tasks[int(self.columns["task_index"][idx])]
        return item
