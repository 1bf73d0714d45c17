"""`RemoteLeRobotMixture`: LeRobot's samples of a mixture of served datasets, where LeRobot would use
`MultiLeRobotDataset` (see `episerve.lerobot`).

**Index contract.** `len(ds)` is the positions of one epoch of the mixture's plan (`epoch_size`, by default
the components' rows together) and `ds[i]` is position `i` of epoch `ds.epoch` (0 unless `set_epoch` is
called): which component and row fill it is the plan's (`episerve.MixturePlan`; weights hold in every prefix
of the epoch within one sample, rows drawn without replacement per pass of a component). A sampler that
permutes `range(len(ds))` — LeRobot's `shuffle=True`, `EpisodeAwareSampler` — therefore delivers each
component its weight's share of every pass exactly, in a fresh random order. LeRobot's training script never
calls `set_epoch`, so each pass reads epoch 0's positions again: with a list of datasets (weights proportional
to rows) that is every row once per pass, as `MultiLeRobotDataset`; with other weights a subsampled
component gives the same subsample each pass (call `set_epoch(e)` between passes in a loop of your own to
draw the next ones).
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from episerve._client import Client, connect
from episerve._collate import Batch, collate
from episerve._encoded_frames import require_pixels
from episerve._mixture import Mixture
from episerve._mixture_dataset import MixtureSource
from episerve._plan import MixturePlan
from episerve._retry import Retries
from episerve.lerobot._arguments import adopt_lerobot_attributes
from episerve.lerobot._mixture_metadata import RemoteLeRobotMixtureMetadata
from episerve.lerobot._mixture_output import LeRobotMixtureFormatter
from episerve.lerobot._mixture_repo import lerobot_mixture

try:
    from torch.utils.data import Dataset as _Base
except ImportError:  # pragma: no cover - episerve.lerobot needs torch, and says so when imported
    _Base = object  # type: ignore[assignment,misc]


class RemoteLeRobotMixture(_Base):  # type: ignore[misc]
    """LeRobot's samples of a mixture: what `RemoteLeRobotDataset(url, repo_id)` makes when `repo_id` names
    several datasets (an `episerve.Mixture`, a list of dataset ids, `"mixture:NAME"` or `"mixture:FILE.yaml"`;
    see `episerve.lerobot._mixture_repo`).

    Each sample is its component's `RemoteLeRobotDataset` sample in the mixture's names (renamed by the
    feature maps; vectors padded with zeros to the mixture's width; a camera the component lacks as zeros),
    then `<name>_is_real`, `<camera>_is_missing` and `dataset_index` (see `_mixture_output`). `meta` is the
    mixture's metadata in LeRobot's shapes (`RemoteLeRobotMixtureMetadata`), `stats` its merged statistics.
    `delta_timestamps` use the mixture's names and are resolved per component at its own fps. `episodes` may
    only pick episodes per dataset id for a list (`{repo_id: [ids]}`, as `MultiLeRobotDataset`); a mixture
    document picks its own. LeRobot's other arguments are accepted as by `RemoteLeRobotDataset`; `seed` and
    `epoch_size` are the plan's. See the module docstring for what an index means.
    """

    def __init__(
        self,
        url: str | Client,
        repo_id: Mixture | Sequence[str] | str,
        episodes: Mapping[str, Any] | None = None,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        image_transforms: Callable[[Any], Any] | None = None,
        tolerance_s: float = 1e-4,
        token: str | None = None,
        *,
        retries: Retries | int | None = None,
        root: str | os.PathLike[str] | None = None,
        revision: str | None = None,
        video_backend: str | None = None,
        download_videos: bool = True,
        force_cache_sync: bool = False,
        batch_encoding_size: int = 1,
        vcodec: str = "libsvtav1",
        streaming_encoding: bool = False,
        encoder_queue_maxsize: int = 30,
        encoder_threads: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        seed: int = 0,
        epoch_size: int | None = None,
    ) -> None:
        self.client = connect(url, token, retries, cache_dir)
        require_pixels(self.client.frames, "RemoteLeRobotMixture")
        self.mixture, self.repo_id, self.repo_ids = lerobot_mixture(self.client, repo_id, episodes)
        meta = RemoteLeRobotMixtureMetadata(
            self.client, self.mixture, self.repo_id, root=root, revision=revision, epoch_size=epoch_size
        )
        adopt_lerobot_attributes(self, meta, video_backend, delta_timestamps, tolerance_s, meta.columns)
        self.episodes = None  # LeRobot's samplers: every position (the components pick their own episodes)
        self.disabled_features = self.meta.disabled_features
        self.epoch = 0
        self.source = MixtureSource(
            self.client,
            self.mixture,
            [*self.meta.video_keys, *self._stored],
            self.delta_timestamps,
            tolerance_s,
            bool(self.meta.image_keys),
            LeRobotMixtureFormatter(
                video_keys=self.meta.video_keys,
                image_keys=self.meta.image_keys,
                stored=self._stored,
                windows=self.delta_timestamps,
                tasks=self.meta.tasks_by_component,
                image_transforms=image_transforms,
            ),
            seed,
            epoch_size,
        )

    # --- reading -------------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.plan.epoch_size

    def set_epoch(self, epoch: int) -> None:
        """Read the positions of plan epoch `epoch` from now on (see the module docstring)."""
        if epoch < 0:
            raise ValueError("epoch must be non-negative")
        self.epoch = int(epoch)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.__getitems__([operator.index(index)])[0]

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        """The samples at positions `indices` of the current epoch, read in one request (a take per component)."""
        positions = np.asarray(indices, dtype=np.int64).reshape(-1)
        positions = np.where(positions < 0, positions + len(self), positions)
        if len(positions) and (positions.min() < 0 or positions.max() >= len(self)):
            bad = np.asarray(indices).reshape(-1)[(positions < 0) | (positions >= len(self))]
            raise IndexError(f"index {bad[0]} out of range for a mixture epoch of {len(self)} positions")
        return Batch(self.source.read(self.epoch, positions), len(positions))

    collate = staticmethod(collate)

    # --- LeRobotDataset's and MultiLeRobotDataset's attributes ---------------------------------------------------

    @property
    def plan(self) -> MixturePlan:
        return self.source.plan

    @property
    def version(self) -> str:
        """The resolved mixture's version (its document and every component's data)."""
        return self.source.version

    @property
    def stats(self) -> dict[str, dict[str, np.ndarray]] | None:
        """The merged statistics (`MultiLeRobotDataset.stats`; also `meta.stats`)."""
        return self.meta.stats

    @property
    def repo_id_to_index(self) -> dict[str, int]:
        return {repo_id: k for k, repo_id in enumerate(self.repo_ids)}

    @property
    def fps(self) -> float | int:
        return self.meta.fps

    @property
    def features(self) -> dict[str, dict[str, Any]]:
        return self.meta.features

    @property
    def camera_keys(self) -> list[str]:
        return self.meta.camera_keys

    @property
    def video_frame_keys(self) -> list[str]:
        return self.meta.video_keys

    @property
    def video(self) -> bool:
        return bool(self.meta.video_keys)

    @property
    def num_frames(self) -> int:
        return len(self)

    @property
    def num_episodes(self) -> int:
        return self.meta.total_episodes

    @property
    def image_transforms(self) -> Callable[[Any], Any] | None:
        return self.source.output.image_transforms  # type: ignore[attr-defined]

    @image_transforms.setter
    def image_transforms(self, transforms: Callable[[Any], Any] | None) -> None:
        self.source.output.image_transforms = transforms  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return (
            f"RemoteLeRobotMixture({self.client.url!r}, {self.mixture!r}, positions={len(self)}, "
            f"episodes={self.num_episodes}, cameras={self.camera_keys})"
        )
