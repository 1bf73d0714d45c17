"""LeRobot v3.0 datasets: many episodes per parquet file (`data/chunk-*/file-*.parquet`), episode metadata in
parquet (`meta/episodes/*/*.parquet`, with each episode's file and row range) and tasks in `meta/tasks.parquet`."""

from __future__ import annotations

import functools
from typing import Any

import pyarrow as pa

from app.errors import DatasetError, InvalidInput
from app.sources.files import ALL_THERE, DatasetPath, FileSupply
from app.sources.parquet import (
    ParquetSource,
    data_files,
    parquet_column_names,
    read_parquet_rows,
    read_parquet_table,
)
from app.sources.source import DatasetInfo, EpisodeClip, EpisodeRun
from app.sources.video import CameraFiles, video_features

FORMAT = "lerobot-v3.0"
_STRINGS = (pa.string(), pa.large_string())
_EPISODE_COLUMNS = ["episode_index", "data/chunk_index", "data/file_index", "dataset_from_index", "dataset_to_index"]


class LeRobotV30Source(CameraFiles, ParquetSource):
    """Episode runs come from the episode metadata when it agrees with the files' row counts."""

    _meta_rows: list[dict[str, Any]] | None = None  # the episode metadata, as read once (a source is a snapshot)
    _file_rows: dict[str, int] | None = None

    @classmethod
    def open_with(
        cls, root: DatasetPath, info: dict[str, Any], fps: float | None, supply: FileSupply = ALL_THERE
    ) -> LeRobotV30Source:
        dataset = DatasetInfo(FORMAT, fps, info, videos=video_features(info))
        dataset.tasks = _tasks(root)
        return cls(root, dataset, data_files(root, supply), supply)

    def listed_rows(self, rel: str) -> int | None:
        """The rows of the episodes the episode metadata places in data file `rel` (`dataset_to_index` -
        `dataset_from_index` of each)."""
        try:
            return self._rows_per_file().get(rel)
        except (OSError, KeyError, ValueError, TypeError, pa.ArrowException):
            return None

    def _rows_per_file(self) -> dict[str, int]:
        if self._file_rows is None:
            rows: dict[str, int] = {}
            for row in self._episode_rows():
                name = self._data_file(row)
                rows[name] = rows.get(name, 0) + int(row["dataset_to_index"]) - int(row["dataset_from_index"])
            self._file_rows = rows
        return self._file_rows

    def _episode_rows(self) -> list[dict[str, Any]]:
        """The episode metadata's rows (their file and global index range, and tasks), read once per snapshot."""
        if self._meta_rows is None:
            rows: list[dict[str, Any]] = []
            for meta in sorted((self.root / "meta/episodes").glob("*/*.parquet")):
                tasks = ["tasks"] if "tasks" in parquet_column_names(meta) else []
                rows.extend(read_parquet_rows(meta, [*_EPISODE_COLUMNS, *tasks]))
            self._meta_rows = rows
        return self._meta_rows

    def _data_file(self, row: dict[str, Any]) -> str:
        """The data file an episode metadata row places its episode in."""
        template = str(self.info.info.get("data_path") or "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet")
        return template.format(chunk_index=row["data/chunk_index"], file_index=row["data/file_index"])

    def episode_clip(self, key: str, episode: int) -> EpisodeClip:
        """From the episode metadata: the file (`video_path` with its chunk and file index) and the episode's
        `from_timestamp` in it."""
        clips = self._clips(key)
        clip = clips.get(episode)
        if clip is None:
            raise DatasetError(f"the episode metadata has no video file of {key!r} for episode {episode}")
        return clip

    @functools.cache  # noqa: B019 (a source is a snapshot, replaced when the dataset reloads)
    def _clips(self, key: str) -> dict[int, EpisodeClip]:
        template = self.info.info.get("video_path")
        if key not in self.info.videos or not template:
            raise InvalidInput(f"{key!r} is not a camera of this dataset")
        prefix = f"videos/{key}/"
        columns = ["episode_index", prefix + "chunk_index", prefix + "file_index", prefix + "from_timestamp"]
        clips: dict[int, EpisodeClip] = {}
        try:
            for meta in sorted((self.root / "meta/episodes").glob("*/*.parquet")):
                for row in read_parquet_rows(meta, columns):
                    name = str(template).format(video_key=key, chunk_index=row[columns[1]], file_index=row[columns[2]])
                    clips[int(row["episode_index"])] = EpisodeClip(name, float(row[columns[3]]))
        except (OSError, KeyError, ValueError, TypeError, pa.ArrowException) as exc:
            raise DatasetError(f"the episode metadata of camera {key!r} is unreadable: {exc}") from exc
        return clips

    def metadata_runs(self, file_rows: list[int]) -> list[EpisodeRun] | None:
        try:
            return self._runs(file_rows)
        except (OSError, KeyError, ValueError, TypeError):
            return None

    def _runs(self, file_rows: list[int]) -> list[EpisodeRun] | None:
        rows = self._episode_rows()
        if not rows:
            return None
        file_numbers = {name: n for n, name in enumerate(self.files)}
        per_file: dict[int, list[dict[str, Any]]] = {}
        for row in rows:
            name = self._data_file(row)
            if name not in file_numbers:
                return None
            per_file.setdefault(file_numbers[name], []).append(row)
            if row.get("tasks") is not None:
                self.info.episode_tasks[int(row["episode_index"])] = list(row["tasks"])
        runs: list[EpisodeRun] = []
        for number, rows_in_file in sorted(per_file.items()):
            rows_in_file.sort(key=lambda r: r["dataset_from_index"])
            first = rows_in_file[0]["dataset_from_index"]
            expected = first
            for row in rows_in_file:
                start, stop = row["dataset_from_index"], row["dataset_to_index"]
                if start != expected or stop < start:
                    return None  # not contiguous: metadata cannot be trusted for row offsets
                expected = stop
                if stop > start:
                    runs.append(EpisodeRun(int(row["episode_index"]), number, start - first, stop - first))
            if expected - first != file_rows[number]:
                return None
        covered = set(per_file)
        if any(rows and n not in covered for n, rows in enumerate(file_rows)):
            return None
        return runs


def _tasks(root: DatasetPath) -> dict[int, str]:
    path = root / "meta/tasks.parquet"
    if not path.is_file():
        return {}
    table = read_parquet_table(path)
    names = [n for n in table.column_names if n != "task_index" and table.schema.field(n).type in _STRINGS]
    if "task_index" not in table.column_names or not names:
        return {}
    return dict(zip(table["task_index"].to_pylist(), table[names[0]].to_pylist(), strict=True))
