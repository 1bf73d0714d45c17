"""LeRobot's samples of a mixture: the LeRobot output (`episerve._output_lerobot`) with each component's tasks
and the mixture's additions.

Keys in this order: LeRobot's (video keys, stored columns, `<key>_is_pad` masks, `task`), then the mixture's
masks and flags (`<name>_is_real`, `<camera>_is_missing`, bool) and `dataset_index` (int64, 0-d per sample, the
component's place in the mixture), where `MultiLeRobotDataset` puts it: last. `task` is the task string of the
sample's own component (`task_index` is the component's own index).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from episerve._columns import Columns
from episerve._mixture_schema import DATASET_INDEX
from episerve._output_lerobot import LeRobotFormatter
from episerve._output_torch import torch_module
from episerve._tensor_batch import TensorBatch


class LeRobotMixtureFormatter(LeRobotFormatter):
    """LeRobot's batch dict from a mixture batch's columns; `tasks[k]` names component `k`'s `task_index`es."""

    def __init__(
        self,
        *,
        video_keys: Sequence[str],
        image_keys: Sequence[str],
        stored: Sequence[str],
        windows: Mapping[str, Sequence[float]] | None,
        tasks: Sequence[Mapping[int, str]],
        image_transforms: Callable[[Any], Any] | None = None,
    ) -> None:
        super().__init__(
            video_keys=video_keys,
            image_keys=image_keys,
            stored=stored,
            windows=windows,
            tasks={},  # tasks are per component: named below
            image_transforms=image_transforms,
        )
        self.component_tasks = [dict(names) for names in tasks]

    def format(self, columns: Columns) -> TensorBatch:
        batch = super().format(columns)
        components = np.asarray(columns[DATASET_INDEX]).reshape(-1)
        if "task_index" in columns and any(self.component_tasks):
            pairs = zip(components.tolist(), np.asarray(columns["task_index"]).reshape(-1).tolist(), strict=True)
            batch["task"] = [self.component_tasks[k].get(i, "") for k, i in pairs]
        torch = torch_module()
        for name, values in columns.items():
            if name not in batch and name != DATASET_INDEX:  # the mixture's masks and flags
                batch[name] = torch.from_numpy(np.ascontiguousarray(values))
        batch[DATASET_INDEX] = torch.from_numpy(components.astype(np.int64))
        return batch
