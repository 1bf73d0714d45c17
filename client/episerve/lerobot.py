"""`RemoteLeRobotDataset`: the samples of LeRobot's `LeRobotDataset`, fetched from an episerve server.

`ds[i]` is the dict `LeRobotDataset.__getitem__` returns, key for key: camera keys (video frames and parquet
images) as float32 `(C, H, W)` in [0, 1] (`(T, C, H, W)` windowed), every other stored column as a tensor with
LeRobot's dtypes (floats float32, integers int64, bool), 0-d for scalar features, `delta_timestamps` windows
stacked with a bool `<key>_is_pad`, `image_transforms` applied to each camera key, and `task` as the frame's task
string; keys in LeRobot's order (video keys, stored columns, padding masks, `task`). The server computes the
windows and decodes the video frames; the client decodes parquet PNGs.

A DataLoader batch is one request (`__getitems__`), converted to LeRobot's dtypes once per batch; with
`collate_fn=episerve.lerobot.collate` the batch arrives whole and crosses from the worker as one block. torch's
default collate gives the same batch by stacking the samples again.
"""

from __future__ import annotations

import os

try:
    import torch
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("episerve.lerobot needs torch: pip install 'episerve[torch]'") from exc

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from episerve._client import Client, connect
from episerve._collate import collate
from episerve._dataset import EpisodeDataset
from episerve._episodes import episode_count
from episerve._output_lerobot import LeRobotFormatter
from episerve._outputs import formatter
from episerve._retry import Retries

__all__ = ["RemoteLeRobotDataset", "RemoteLeRobotDatasetMetadata", "collate"]

_CAMERA_DTYPES = ("image", "video")


class RemoteLeRobotDatasetMetadata:
    """What `LeRobotDatasetMetadata` tells training code, as the server describes the dataset.

    `fps`, `features` (info.json's, with each camera's `shape` as served), `camera_keys`/`video_keys`/
    `image_keys`, `tasks` (`{task_index: task}`), `episodes` (`{episode_index: {"length", "tasks",
    "dataset_from_index", "dataset_to_index"}}`), `stats` (`{feature: {stat: tensor}}`, from `meta/stats.json`
    or merged from v2.1's episode statistics, as LeRobot loads them; None without statistics files),
    `total_episodes`, `total_frames`, `total_tasks`, `names` and `shapes`.
    """

    def __init__(self, client: Client, repo_id: str) -> None:
        described = client.info(repo_id)
        self.repo_id = repo_id
        fps = described.get("fps")
        self.fps: float | int | None = int(fps) if isinstance(fps, float) and fps.is_integer() else fps
        self.columns = [c["name"] for c in described["columns"] if "video" not in c]
        self.features = _served_features(described)
        self.tasks = {int(index): task for index, task in (described.get("tasks") or {}).items()}
        self.episodes = {int(e["episode_index"]): e for e in client.episodes(repo_id)}
        self.stats = _stats_tensors(client.stats(repo_id))
        self.total_frames = int(described["rows"])
        self.total_episodes = len(self.episodes)

    @property
    def video_keys(self) -> list[str]:
        return [key for key, feature in self.features.items() if feature.get("dtype") == "video"]

    @property
    def image_keys(self) -> list[str]:
        return [key for key, feature in self.features.items() if feature.get("dtype") == "image"]

    @property
    def camera_keys(self) -> list[str]:
        return [key for key, feature in self.features.items() if feature.get("dtype") in _CAMERA_DTYPES]

    @property
    def total_tasks(self) -> int:
        return len(self.tasks)

    @property
    def names(self) -> dict[str, Any]:
        return {key: feature.get("names") for key, feature in self.features.items()}

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {key: tuple(feature.get("shape") or ()) for key, feature in self.features.items()}

    def __repr__(self) -> str:
        return (
            f"RemoteLeRobotDatasetMetadata({self.repo_id!r}, episodes={self.total_episodes}, "
            f"frames={self.total_frames}, fps={self.fps}, cameras={self.camera_keys})"
        )


class RemoteLeRobotDataset(EpisodeDataset):
    """A drop-in for `lerobot.datasets.lerobot_dataset.LeRobotDataset` over an episerve server.

    Constructed like LeRobotDataset, with the server's URL (or a `Client`) first: `repo_id` is the dataset's id
    on the server, `episodes` a list of episode ids (None: every episode), `delta_timestamps`
    `{key: [seconds...]}` (LeRobot's windows, checked against `tolerance_s` by the server), `image_transforms`
    a callable applied to each sample's camera tensors. `revision`, `video_backend`, `download_videos` and
    `force_cache_sync` are accepted for compatibility and do nothing: the server owns the files and decoding.
    `cache_dir` is the server's cache directory where this machine can read it (see `Client`).

    The sample order is LeRobot's: ascending episode order, then frame order, whatever order `episodes` lists.
    """

    output: LeRobotFormatter  # turns each batch's columns into LeRobot's samples

    def __init__(
        self,
        url: str | Client,
        repo_id: str,
        episodes: Iterable[int] | str | None = None,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        image_transforms: Callable[[Any], Any] | None = None,
        tolerance_s: float = 1e-4,
        token: str | None = None,
        *,
        retries: Retries | int | None = None,
        revision: str | None = None,
        video_backend: str | None = None,
        download_videos: bool = True,
        force_cache_sync: bool = False,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        client = connect(url, token, retries, cache_dir)
        self.repo_id = repo_id
        self.meta = RemoteLeRobotDatasetMetadata(client, repo_id)
        self.episodes = list(episodes) if episodes is not None and not isinstance(episodes, str) else episodes
        self.tolerance_s = tolerance_s
        self.delta_timestamps = (
            {k: [float(d) for d in v] for k, v in delta_timestamps.items()} if delta_timestamps else None
        )
        self.delta_indices = _delta_indices(self.delta_timestamps, self.meta.fps)
        self._stored = [name for name in self.meta.columns if name not in self.meta.video_keys]
        if self.meta.features:  # LeRobot's item order: info.json's feature order, not the file's
            order = {name: n for n, name in enumerate(self.meta.features)}
            self._stored.sort(key=lambda name: order.get(name, len(order)))
        if self.meta.image_keys:
            _require_pillow()
        super().__init__(
            client,
            repo_id,
            self.episodes,  # a generator of ids was consumed into the list above
            columns=[*self.meta.video_keys, *self._stored],
            delta_timestamps=self.delta_timestamps,
            tolerance_s=tolerance_s,
            decode_images=bool(self.meta.image_keys),
            output=formatter(
                "lerobot",
                video_keys=self.meta.video_keys,
                image_keys=self.meta.image_keys,
                stored=self._stored,
                windows=self.delta_timestamps,
                tasks=self.meta.tasks,
                image_transforms=image_transforms,
            ),
        )

    # --- LeRobotDataset's attributes ----------------------------------------------------------------------------

    @property
    def fps(self) -> float | int | None:
        return self.meta.fps

    @property
    def features(self) -> dict[str, dict[str, Any]]:
        return self.meta.features

    @property
    def camera_keys(self) -> list[str]:
        return self.meta.camera_keys

    @property
    def num_frames(self) -> int:
        return len(self)

    @property
    def num_episodes(self) -> int:
        if self.episodes is None:
            return self.meta.total_episodes
        if isinstance(self.episodes, str):
            return episode_count(self.episodes)
        return len(self.episodes)

    @property
    def image_transforms(self) -> Callable[[Any], Any] | None:
        """Applied to each sample's camera tensors (by the LeRobot output, which holds it)."""
        return self.output.image_transforms

    @image_transforms.setter
    def image_transforms(self, transforms: Callable[[Any], Any] | None) -> None:
        self.output.image_transforms = transforms

    collate = staticmethod(collate)

    def __repr__(self) -> str:
        return (
            f"RemoteLeRobotDataset({self.client.url!r}, {self.repo_id!r}, episodes={self.num_episodes}, "
            f"frames={self.num_frames}, cameras={self.camera_keys})"
        )


def _served_features(described: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """info.json's features, with each camera's shape as the server serves it (it may downscale frames)."""
    features = {key: dict(feature) for key, feature in (described.get("features") or {}).items()}
    for column in described["columns"]:
        feature = features.get(column["name"])
        if "video" not in column or feature is None:
            continue
        height, width, channels = column["video"]["shape"]
        by_name = {"height": height, "width": width, "channels": channels}
        names = feature.get("names") or ["height", "width", "channels"]
        if sorted(names) == sorted(by_name):
            feature["shape"] = [by_name[name] for name in names]
    return features


def _stats_tensors(stats: dict[str, Any] | None) -> dict[str, dict[str, Any]] | None:
    if stats is None:
        return None
    return {feature: {name: torch.tensor(values) for name, values in part.items()} for feature, part in stats.items()}


def _delta_indices(delta_timestamps: dict[str, list[float]] | None, fps: float | None) -> dict[str, list[int]] | None:
    if delta_timestamps is None or not fps:
        return None
    return {key: [round(d * fps) for d in deltas] for key, deltas in delta_timestamps.items()}


def _require_pillow() -> None:
    try:
        import PIL  # noqa: F401
    except ImportError as exc:
        raise ImportError("datasets with image features need Pillow: pip install 'episerve[torch,images]'") from exc
