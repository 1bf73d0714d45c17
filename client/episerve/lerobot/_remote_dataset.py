"""`RemoteLeRobotDataset`, the drop-in for LeRobot's `LeRobotDataset` (see `episerve.lerobot`)."""

from __future__ import annotations

import os

try:
    import torch  # noqa: F401  (the samples are torch tensors: fail here, with the hint, without it)
except ImportError as exc:  # pragma: no cover - depends on the install
    from episerve._extras import install_hint

    raise ImportError(f"episerve.lerobot needs torch: {install_hint('torch')}") from exc

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from episerve._client import Client, connect
from episerve._collate import collate
from episerve._dataset import EpisodeDataset
from episerve._encoded_frames import require_pixels
from episerve._episodes import episode_count
from episerve._output_lerobot import LeRobotFormatter
from episerve._outputs import formatter
from episerve._retry import Retries
from episerve.lerobot._arguments import adopt_lerobot_attributes
from episerve.lerobot._metadata import RemoteLeRobotDatasetMetadata
from episerve.lerobot._mixture_repo import is_mixture_repo


class RemoteLeRobotDataset(EpisodeDataset):
    """A drop-in for `lerobot.datasets.lerobot_dataset.LeRobotDataset` over an episerve server.

    Constructed like LeRobotDataset, with the server's URL (or a `Client`) first: `repo_id` is the dataset's id
    on the server, `episodes` a list of episode ids (None: every episode), `delta_timestamps`
    `{key: [seconds...]}` (LeRobot's windows, checked against `tolerance_s` by the server), `image_transforms`
    a callable applied to each sample's camera tensors. LeRobot's other arguments (`root`, `revision`,
    `force_cache_sync`, `download_videos`, `video_backend`, `batch_encoding_size`, `vcodec`, `streaming_encoding`,
    `encoder_queue_maxsize`, `encoder_threads`) are accepted by keyword; the server owns the files and decoding,
    so they change nothing, except that a `revision` or `video_backend` that cannot be honoured is a ValueError
    (`episerve.lerobot._arguments`). `cache_dir` is the server's cache directory where this machine can read it
    (see `Client`). `episerve.lerobot.use_server(url)` makes LeRobot's own `LeRobotDataset` this class.

    The sample order is LeRobot's: ascending episode order, then frame order, whatever order `episodes` lists.
    """

    output: LeRobotFormatter  # turns each batch's columns into LeRobot's samples

    @classmethod
    def _instead(cls, url: Any = None, repo_id: Any = None, *args: Any, **kwargs: Any) -> Any:
        """A `RemoteLeRobotMixture` when `repo_id` names several datasets (see `episerve.lerobot._mixture_repo`)."""
        repo_id = kwargs.pop("repo_id", repo_id)
        if not is_mixture_repo(repo_id):
            return None
        from episerve.lerobot._remote_mixture import RemoteLeRobotMixture

        return RemoteLeRobotMixture(url, repo_id, *args, **kwargs)

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
    ) -> None:
        client = connect(url, token, retries, cache_dir)
        require_pixels(client.frames, "RemoteLeRobotDataset")
        self.repo_id = repo_id
        meta = RemoteLeRobotDatasetMetadata(client, repo_id, root=root, revision=revision)
        stored = [name for name in meta.columns if name not in meta.video_keys]
        adopt_lerobot_attributes(self, meta, video_backend, delta_timestamps, tolerance_s, stored)
        self.episodes = list(episodes) if episodes is not None and not isinstance(episodes, str) else episodes
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
                tasks=self.meta.tasks_by_index,
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
