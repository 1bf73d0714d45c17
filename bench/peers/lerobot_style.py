"""LeRobot 0.4.4's per-sample read path with `delta_timestamps`, rebuilt on HF `datasets` (lerobot itself
cannot be installed here without pulling a CUDA torch).

Follows the LeRobot format reference, section 5: the frames are an HF dataset with LeRobot's
`hf_transform_to_torch` transform; episode bounds come from the episodes metadata as an HF dataset; per item,
the query indices are `clamp(i + k, from, to - 1)` for each offset, each windowed key is gathered with
`hf_dataset[key][indices]` and stacked, `<key>_is_pad` marks the clamped ones, and `task` is looked up in the
tasks table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import torch

from bench.datasets import EPISODES_PATH, FPS, GeneratedDataset
from bench.peers import hf


def hf_transform_to_torch(items: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """LeRobot's transform: every value of every column to a torch tensor (strings kept)."""
    for key in items:
        first = items[key][0]
        if first is None or isinstance(first, dict):
            continue  # undecoded images stay as they are
        items[key] = [x if isinstance(x, str) else torch.tensor(x) for x in items[key]]
    return items


class LeRobotStyleDataset:
    """`__getitem__(idx)` as LeRobotDataset 0.4.4 computes it for non-video datasets."""

    def __init__(self, dataset: GeneratedDataset, cache_dir: Path, delta_timestamps: dict[str, list[float]]) -> None:
        import datasets

        self.hf_dataset = hf.load(dataset, cache_dir)
        self.hf_dataset.set_transform(hf_transform_to_torch)
        self.episodes = datasets.Dataset.from_parquet(str(dataset.path / EPISODES_PATH), cache_dir=str(cache_dir))
        tasks = pd.read_parquet(dataset.path / "meta/tasks.parquet")
        self.tasks = tasks.set_index("task")
        self.delta_indices = {key: [round(d * FPS) for d in deltas] for key, deltas in delta_timestamps.items()}

    def __len__(self) -> int:
        return len(self.hf_dataset)

    def _get_query_indices(self, idx: int, ep_idx: int) -> tuple[dict[str, list[int]], dict[str, torch.Tensor]]:
        ep = self.episodes[ep_idx]
        ep_start, ep_end = ep["dataset_from_index"], ep["dataset_to_index"]
        query_indices = {
            key: [max(ep_start, min(ep_end - 1, idx + delta)) for delta in delta_idx]
            for key, delta_idx in self.delta_indices.items()
        }
        padding = {
            f"{key}_is_pad": torch.BoolTensor(
                [(idx + delta < ep_start) | (idx + delta >= ep_end) for delta in delta_idx]
            )
            for key, delta_idx in self.delta_indices.items()
        }
        return query_indices, padding

    def _query_hf_dataset(self, query_indices: dict[str, list[int]]) -> dict[str, torch.Tensor]:
        result = {}
        for key, q_idx in query_indices.items():
            try:
                result[key] = torch.stack(self.hf_dataset[key][q_idx])
            except (KeyError, TypeError, IndexError):
                result[key] = torch.stack(self.hf_dataset[q_idx][key])
        return result

    def __getitem__(self, idx: int) -> dict[str, Any]:
        item = self.hf_dataset[idx]
        ep_idx = item["episode_index"].item()
        query_indices, padding = self._get_query_indices(idx, ep_idx)
        query_result = self._query_hf_dataset(query_indices)
        item = {**item, **padding}
        for key, val in query_result.items():
            item[key] = val
        task_idx = item["task_index"].item()
        item["task"] = self.tasks.iloc[task_idx].name
        return item
