"""`RemoteLeRobotDatasetMetadata`: LeRobot's `LeRobotDatasetMetadata`, in its own shapes, from an episerve server.

LeRobot 0.4.4 holds a dataset's metadata as `info` (meta/info.json with feature shapes as tuples), `tasks` (a
pandas DataFrame indexed by task string, column `task_index`), `episodes` (a table indexable by column name and by
episode) and `stats` (`{feature: {stat: numpy array}}`, as `np.array` makes them from meta/stats.json: float64
values, int64 counts). This module builds the same from the server's description of the dataset.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from episerve._client import Client, connect
from episerve._retry import Retries
from episerve.lerobot._arguments import check_revision

__all__ = ["EpisodeTable", "LeRobotInfo", "RemoteLeRobotDatasetMetadata"]

_CAMERA_DTYPES = ("image", "video")
CODEBASE_VERSION = "v3.0"  # the LeRobot format version whose metadata shapes these are (LeRobot 0.4.4)


class EpisodeTable:
    """`meta.episodes` as LeRobot 0.4.4 holds it (a `datasets.Dataset` of meta/episodes/): `table["length"]` is a
    column as a list, `table[i]` episode `i`'s row as a dict, `table[a:b]` (or a list of positions) a dict of
    column lists, `len(table)` the number of episodes, iteration yields the rows, `to_pandas()` a DataFrame.

    Rows are in ascending episode order and positions are episode indices, as in a LeRobot dataset (episodes
    0..N-1). Columns: `episode_index`, `length`, `dataset_from_index`, `dataset_to_index` (the episode's rows in the
    whole dataset, LeRobot's global `index` range) and, where the format records them, `tasks`. LeRobot's file
    locations (`data/chunk_index`, `videos/<key>/from_timestamp`, ...) are the server's business and absent.
    """

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self._rows = sorted(rows, key=lambda row: row["episode_index"])
        names: dict[str, None] = {}
        for row in self._rows:
            names.update(dict.fromkeys(row))
        self.column_names = list(names)

    @property
    def num_rows(self) -> int:
        return len(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (dict(row) for row in self._rows)

    def __getitem__(self, key: str | int | slice | Sequence[int]) -> Any:
        if isinstance(key, str):
            if key not in self.column_names:
                raise KeyError(f"no episode column {key!r}; columns: {self.column_names}")
            return [row.get(key) for row in self._rows]
        if isinstance(key, slice | Sequence):  # several episodes: a dict of column lists, as `datasets` gives
            rows = self._rows[key] if isinstance(key, slice) else [self._rows[int(i)] for i in key]
            return {name: [row.get(name) for row in rows] for name in self.column_names}
        return dict(self._rows[int(key)])

    def to_pandas(self) -> Any:
        """The table as a pandas DataFrame (needs pandas)."""
        return pandas_module().DataFrame(self._rows, columns=self.column_names)

    def __repr__(self) -> str:
        return f"EpisodeTable(columns={self.column_names}, num_rows={self.num_rows})"


class LeRobotInfo:
    """The properties LeRobot's `LeRobotDatasetMetadata` derives from `info` (meta/info.json as LeRobot loads it),
    shared by one dataset's metadata and a mixture's."""

    info: dict[str, Any]
    repo_id: Any

    @property
    def fps(self) -> int | float:
        return self.info["fps"]

    @property
    def features(self) -> dict[str, dict[str, Any]]:
        return self.info["features"]

    @property
    def robot_type(self) -> str | None:
        return self.info.get("robot_type")

    @property
    def data_path(self) -> str | None:
        return self.info.get("data_path")

    @property
    def video_path(self) -> str | None:
        return self.info.get("video_path")

    @property
    def chunks_size(self) -> int | None:
        return self.info.get("chunks_size")

    @property
    def data_files_size_in_mb(self) -> int | None:
        return self.info.get("data_files_size_in_mb")

    @property
    def video_files_size_in_mb(self) -> int | None:
        return self.info.get("video_files_size_in_mb")

    @property
    def url_root(self) -> str:
        return f"hf://datasets/{self.repo_id}"

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
    def names(self) -> dict[str, Any]:
        return {key: feature.get("names") for key, feature in self.features.items()}

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {key: tuple(feature.get("shape") or ()) for key, feature in self.features.items()}


class RemoteLeRobotDatasetMetadata(LeRobotInfo):
    """What `LeRobotDatasetMetadata` tells training code, as the server describes the dataset, in LeRobot's shapes.

    `info` (meta/info.json, feature shapes as tuples, each camera's `shape` as served), `fps`, `features`,
    `robot_type`, `camera_keys`/`video_keys`/`image_keys`, `names`, `shapes`, `tasks` (a pandas DataFrame indexed
    by task, column `task_index`, rows in task_index order), `episodes` (an `EpisodeTable`), `stats`
    (`{feature: {stat: numpy array}}`, from meta/stats.json or merged from v2.1's episode statistics, as LeRobot
    loads them; None without statistics files), `total_episodes`, `total_frames`, `total_tasks`, `chunks_size`,
    `data_path`, `video_path`, `revision`, `root`, `get_task_index(task)`; `tasks_by_index` is `{task_index: task}`
    and `column_types` the Arrow type (as text) of each stored column.

    `url` is the server (or a `Client`), `repo_id` the dataset's id there. `root` is kept as `meta.root` and not
    read (the server owns the files); `revision` must be None or the dataset's own version (see
    `episerve.lerobot._arguments`); `force_cache_sync` and `metadata_buffer_size` (recording) change nothing.
    """

    def __init__(
        self,
        url: str | Client,
        repo_id: str,
        *,
        root: str | os.PathLike[str] | None = None,
        revision: str | None = None,
        force_cache_sync: bool = False,
        metadata_buffer_size: int = 10,
        token: str | None = None,
        retries: Retries | int | None = None,
    ) -> None:
        client = connect(url, token, retries, None)
        described = client.info(repo_id)
        self.repo_id = repo_id
        self.root = Path(root) if root is not None else None
        self.column_types = {c["name"]: c["type"] for c in described["columns"] if "video" not in c}
        self.columns = list(self.column_types)
        self.info = _info(described)
        self.revision = check_revision(revision, self.info["codebase_version"])
        self.tasks_by_index = {int(index): task for index, task in (described.get("tasks") or {}).items()}
        self.episodes = EpisodeTable(client.episodes(repo_id))
        self.stats = _stats_arrays(client.stats(repo_id))
        self.subtasks = None
        self.total_frames = int(described["rows"])
        self.total_episodes = len(self.episodes)
        self._tasks: Any = None

    @property
    def tasks(self) -> Any:
        """LeRobot's tasks table: a pandas DataFrame indexed by task string, column `task_index` (needs pandas)."""
        if self._tasks is None:
            pandas = pandas_module()
            ordered = sorted(self.tasks_by_index.items())
            self._tasks = pandas.DataFrame(
                {"task_index": np.array([index for index, _ in ordered], dtype=np.int64)},
                index=[task for _, task in ordered],  # unnamed, as LeRobot 0.4.4 writes and reads it
            )
        return self._tasks

    def get_task_index(self, task: str) -> int | None:
        """The index of `task`, None if the dataset has no such task (LeRobot's method)."""
        return next((index for index, name in self.tasks_by_index.items() if name == task), None)

    @property
    def total_tasks(self) -> int:
        return len(self.tasks_by_index)

    def __repr__(self) -> str:
        return (
            f"RemoteLeRobotDatasetMetadata({self.repo_id!r}, episodes={self.total_episodes}, "
            f"frames={self.total_frames}, fps={self.fps}, cameras={self.camera_keys})"
        )


def _info(described: dict[str, Any]) -> dict[str, Any]:
    """meta/info.json as LeRobot loads it (`load_info`: feature shapes as tuples), with the served features and
    counts; built from the description's fields where the server does not send the file's own."""
    info = dict(described.get("info") or {})
    fps = info.get("fps", described.get("fps"))
    info["fps"] = int(fps) if isinstance(fps, float) and fps.is_integer() else fps
    version = info.get("codebase_version") or str(described.get("format", "")).removeprefix("lerobot-") or None
    info["codebase_version"] = version
    info.setdefault("robot_type", None)
    info["features"] = _served_features(described)
    info["total_episodes"] = int(described["episodes"] or 0)
    info["total_frames"] = int(described["rows"])
    info["total_tasks"] = len(described.get("tasks") or {})
    return info


def _served_features(described: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """info.json's features with shapes as tuples, each camera's shape as the server serves it (it may downscale
    frames)."""
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
    for feature in features.values():
        feature["shape"] = tuple(feature.get("shape") or ())
    return features


def _stats_arrays(stats: dict[str, Any] | None) -> dict[str, dict[str, np.ndarray]] | None:
    """Statistics as LeRobot's `load_stats` casts them: `np.array` of each JSON value."""
    if stats is None:
        return None
    return {feature: {name: np.array(values) for name, values in part.items()} for feature, part in stats.items()}


def pandas_module() -> Any:
    """pandas, which LeRobot's metadata tables need (an ImportError saying so without it)."""
    try:
        import pandas
    except ImportError as exc:
        raise ImportError("LeRobot's metadata tables (meta.tasks, to_pandas) need pandas: pip install pandas") from exc
    return pandas
