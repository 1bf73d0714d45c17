"""The LeRobot output: each sample as `LeRobotDataset.__getitem__` returns it (`episerve.lerobot` describes it).

Camera keys (video frames and parquet images) become float32 `(C, H, W)` in [0, 1] (`(T, C, H, W)` windowed; a
one-frame video window is the frame itself), each sample through `image_transforms`; every other column a tensor in
LeRobot's dtypes (floats float32, integers int64, bool); `<key>_is_pad` masks bool; `task` the frame's task string.
Keys come in LeRobot's order: video keys, stored columns, padding masks, `task`. All of it per batch, as a
`TensorBatch`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from episerve._columns import Columns
from episerve._output_torch import available as available
from episerve._output_torch import torch_module
from episerve._tensor_batch import TensorBatch, shared_empty

MISSING = "the LeRobot output needs torch: pip install 'episerve[torch]'"
PAD_SUFFIX = "_is_pad"


class LeRobotFormatter:
    """LeRobot's batch dict from the columns of `video_keys` and `stored` (the others, `image_keys` among them, in
    LeRobot's order) and of the `<key>_is_pad` masks of the `windows` (`{key: [seconds...]}`); `tasks` names each
    `task_index`."""

    empty = staticmethod(np.empty)  # video frames are made by `frames`, straight into their float tensor

    def __init__(
        self,
        *,
        video_keys: Sequence[str],
        image_keys: Sequence[str],
        stored: Sequence[str],
        windows: Mapping[str, Sequence[float]] | None,
        tasks: Mapping[int, str],
        image_transforms: Callable[[Any], Any] | None = None,
    ) -> None:
        self.video_keys = list(video_keys)
        self.image_keys = set(image_keys)
        self.stored = list(stored)
        self.windows = dict(windows or {})
        self.tasks = dict(tasks)
        self.image_transforms = image_transforms

    def frames(self, parts: list[np.ndarray]) -> Any:
        """Video frames, uint8 (rows, [T,] H, W, C) record batch by record batch as served, as one float32
        (rows, [T,] C, H, W) tensor in [0, 1]: each part made channels-first while it is converted (one pass, no
        uint8 copy or concatenation)."""
        torch = torch_module()
        pixels = [torch.from_numpy(p if p.flags.writeable else p.copy()).movedim(-1, -3) for p in parts]
        return _unit_float(pixels, shared=self._floats_shared())

    def format(self, columns: Columns) -> TensorBatch:
        batch = TensorBatch()
        for key in self.video_keys:
            batch[key] = self._camera(key, columns[key])
        for key in self.stored:
            batch[key] = self._camera(key, columns[key]) if key in self.image_keys else _tensor(columns[key])
        for key in self.windows:
            batch[key + PAD_SUFFIX] = _tensor(columns[key + PAD_SUFFIX])
        if "task_index" in columns and self.tasks:
            batch["task"] = [self.tasks[int(i)] for i in np.asarray(columns["task_index"]).reshape(-1)]
        return batch

    def _floats_shared(self) -> bool:
        """Whether float frames go to shared memory: in a DataLoader worker, unless transforms replace them."""
        from torch.utils.data import get_worker_info

        return self.image_transforms is None and get_worker_info() is not None

    def _camera(self, key: str, values: Any) -> Any:
        """Frames (video frames already float, see `frames`; images uint8 channels-first) as LeRobot's float32
        (C, H, W) in [0, 1], each sample through `image_transforms`."""
        torch = torch_module()
        if isinstance(values, np.ndarray) and values.dtype == object:  # images of different shapes: one per sample
            return [self._transform(_unit_float([torch.from_numpy(np.asarray(v))])) for v in values.tolist()]
        frames = values if isinstance(values, torch.Tensor) else torch.from_numpy(values)
        if key in self.video_keys and len(self.windows.get(key, ())) == 1:
            frames = frames[:, 0]  # LeRobot squeezes a one-frame video window to the frame itself
        if frames.dtype == torch.uint8:
            frames = _unit_float([frames], shared=self._floats_shared())
        if self.image_transforms is None:
            return frames
        return torch.stack([self._transform(frame) for frame in frames]) if len(frames) else frames

    def _transform(self, frame: Any) -> Any:
        return frame if self.image_transforms is None else self.image_transforms(frame)


def _unit_float(parts: Sequence[Any], shared: bool = False) -> Any:
    """Tensors `parts`, joined along their first axis, as float32; uint8 ones as float32(x) / 255 computed in
    float32, as LeRobot's decoders and `ToTensor` compute it.

    Converting into a float tensor and dividing in place is ~10x faster than dividing the uint8 tensor (a
    mixed-dtype op that casts element by element). In a DataLoader worker (`shared`) the float tensor is allocated
    in shared memory, where the batch crosses to the main process without another copy.
    """
    torch = torch_module()
    if parts[0].dtype != torch.uint8:
        return (parts[0] if len(parts) == 1 else torch.cat(list(parts))).to(torch.float32)
    shape = (sum(len(p) for p in parts), *parts[0].shape[1:])
    frames = shared_empty(torch, shape, torch.float32) if shared else torch.empty(shape, dtype=torch.float32)
    position = 0
    for part in parts:
        frames[position : position + len(part)].copy_(part)
        position += len(part)
    return frames.div_(255)


def _tensor(values: np.ndarray) -> Any:
    """A column in LeRobot's dtypes: floats float32, integers int64, bool as is; strings stay lists."""
    if values.dtype == object:
        return [_tensor(v) if isinstance(v, np.ndarray) else v for v in values.tolist()]
    torch = torch_module()
    tensor = torch.from_numpy(values if values.flags.writeable else values.copy())
    if tensor.dtype == torch.bool:
        return tensor
    if tensor.is_floating_point():
        return tensor.to(torch.float32)
    return tensor.to(torch.int64)
