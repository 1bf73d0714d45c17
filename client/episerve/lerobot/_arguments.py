"""LeRobot's constructor arguments that have no counterpart on a server: which are accepted, which refused.

`LeRobotDataset(repo_id, root, episodes, image_transforms, delta_timestamps, tolerance_s, revision,
force_cache_sync, download_videos, video_backend, batch_encoding_size, vcodec, streaming_encoding,
encoder_queue_maxsize, encoder_threads)` (LeRobot 0.4.4):

- honoured: `repo_id` (the dataset's id on the server), `episodes`, `image_transforms`, `delta_timestamps`,
  `tolerance_s`;
- accepted, and meaningless on a server, so they change nothing: `root` (where LeRobot keeps its local copy; the
  server owns the files; kept as `.root`), `force_cache_sync` and `download_videos` (there is no local copy to sync
  or download into), `batch_encoding_size`, `vcodec`, `streaming_encoding`, `encoder_queue_maxsize`,
  `encoder_threads` (recording only);
- `video_backend`: frames are decoded by the server with FFmpeg through PyAV, LeRobot's `pyav` backend; any of
  LeRobot's backends is accepted (`torchcodec` may differ from PyAV by one level on some pixels), another name is
  a ValueError as in LeRobot;
- `revision`: a Hub revision would select other files; the server serves one version of each dataset, so only
  None, LeRobot's default (`v3.0`) or the dataset's own `codebase_version` are accepted, anything else is a
  ValueError (serve that revision under a dataset id of its own).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from episerve._extras import require_images

VIDEO_BACKENDS = ("pyav", "torchcodec", "video_reader")
DEFAULT_REVISION = "v3.0"  # LeRobot 0.4.4's CODEBASE_VERSION, what it uses for revision=None


def check_revision(revision: str | None, codebase_version: str | None) -> str:
    """The dataset's revision as LeRobot reports it; a ValueError for one the server cannot serve."""
    if revision is None or revision in (DEFAULT_REVISION, codebase_version):
        return revision or codebase_version or DEFAULT_REVISION
    raise ValueError(
        f"revision={revision!r} cannot be honoured: an episerve server serves one version of each dataset "
        f"(this one is {codebase_version}); serve that revision's files under a dataset id of their own"
    )


def check_video_backend(video_backend: str | None) -> str:
    """The backend LeRobot would report; decoding is the server's (PyAV) whichever is named."""
    if video_backend is not None and video_backend not in VIDEO_BACKENDS:
        raise ValueError(f"Unsupported video backend: {video_backend} (LeRobot's are {', '.join(VIDEO_BACKENDS)})")
    return video_backend or "pyav"


def delta_indices(delta_timestamps: dict[str, list[float]] | None, fps: float | None) -> dict[str, list[int]] | None:
    """LeRobot's `delta_indices`: each window's offsets in frames at `fps`."""
    if delta_timestamps is None or not fps:
        return None
    return {key: [round(d * fps) for d in deltas] for key, deltas in delta_timestamps.items()}


def windows_of(delta_timestamps: Mapping[str, Sequence[float]] | None) -> dict[str, list[float]] | None:
    """`delta_timestamps` as LeRobot keeps them: a dict of float lists (None when there is none)."""
    return {k: [float(d) for d in v] for k, v in delta_timestamps.items()} if delta_timestamps else None


def in_feature_order(names: Iterable[str], features: Mapping[str, Any]) -> list[str]:
    """`names` in LeRobot's item order: info.json's feature order (not the files'), names it lacks last."""
    order = {name: n for n, name in enumerate(features)}
    return sorted(names, key=lambda name: order.get(name, len(order)))


def adopt_lerobot_attributes(
    dataset: Any,
    meta: Any,
    video_backend: str | None,
    delta_timestamps: Mapping[str, Sequence[float]] | None,
    tolerance_s: float,
    stored: Iterable[str],
) -> None:
    """Set on `dataset` the attributes `LeRobotDataset` and `MultiLeRobotDataset` have in common, from its
    metadata `meta` and LeRobot's arguments: `video_backend` (checked), `meta`, `root`, `revision`, `tolerance_s`,
    `delta_timestamps`, `delta_indices` (at `meta.fps`) and `_stored`, the `stored` columns in feature order. A
    dataset with image features needs Pillow to decode them: checked here, before the first batch."""
    dataset.video_backend = check_video_backend(video_backend)
    dataset.meta = meta
    dataset.root = meta.root
    dataset.revision = meta.revision
    dataset.tolerance_s = tolerance_s
    dataset.delta_timestamps = windows_of(delta_timestamps)
    dataset.delta_indices = delta_indices(dataset.delta_timestamps, meta.fps)
    dataset._stored = in_feature_order(stored, meta.features)
    if meta.image_keys:
        require_images()
