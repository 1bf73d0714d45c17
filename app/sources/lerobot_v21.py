"""LeRobot v2.1 datasets: one parquet file per episode (`data/chunk-*/episode_NNNNNN.parquet`), metadata in
JSON lines (`meta/tasks.jsonl`, `meta/episodes.jsonl`)."""

from __future__ import annotations

import re
from typing import Any

from app.errors import InvalidInput
from app.sources.files import ALL_THERE, DatasetPath, FileSupply
from app.sources.json_files import read_jsonl
from app.sources.parquet import ParquetSource, data_files
from app.sources.source import DatasetInfo, EpisodeClip, EpisodeRun
from app.sources.video import CameraFiles, video_features

FORMAT = "lerobot-v2.1"
_EPISODE_FILE = re.compile(r"episode_(\d+)\.parquet$")


class LeRobotV21Source(CameraFiles, ParquetSource):
    """Episode runs come from the file names: each file is one whole episode."""

    lengths: dict[int, int]  # episode -> its length, as `meta/episodes.jsonl` records it

    @classmethod
    def open_with(
        cls, root: DatasetPath, info: dict[str, Any], fps: float | None, supply: FileSupply = ALL_THERE
    ) -> LeRobotV21Source:
        dataset = DatasetInfo(FORMAT, fps, info, videos=video_features(info))
        dataset.tasks = {int(r["task_index"]): str(r["task"]) for r in read_jsonl(root / "meta/tasks.jsonl")}
        episodes = read_jsonl(root / "meta/episodes.jsonl")
        dataset.episode_tasks = {int(r["episode_index"]): list(r.get("tasks") or []) for r in episodes}
        source = cls(root, dataset, data_files(root, supply), supply)
        source.lengths = {int(r["episode_index"]): r["length"] for r in episodes if isinstance(r.get("length"), int)}
        return source

    def listed_rows(self, rel: str) -> int | None:
        """The episode's `length` in `meta/episodes.jsonl` (each file holds one whole episode)."""
        match = _EPISODE_FILE.search(rel)
        return self.lengths.get(int(match.group(1))) if match is not None else None

    def episode_clip(self, key: str, episode: int) -> EpisodeClip:
        """The episode's own file, from time 0 (`video_path` with `episode_chunk`, `video_key`, `episode_index`)."""
        template = self.info.info.get("video_path")
        if key not in self.info.videos or not template:
            raise InvalidInput(f"{key!r} is not a camera of this dataset")
        chunk = episode // int(self.info.info.get("chunks_size") or 1000)
        return EpisodeClip(str(template).format(episode_chunk=chunk, video_key=key, episode_index=episode), 0.0)

    def metadata_runs(self, file_rows: list[int]) -> list[EpisodeRun] | None:
        runs = []
        for number, (name, rows) in enumerate(zip(self.files, file_rows, strict=True)):
            match = _EPISODE_FILE.search(name)
            if match is None:
                return None
            if rows:
                runs.append(EpisodeRun(int(match.group(1)), number, 0, rows))
        episodes = [r.episode for r in runs]
        return runs if len(set(episodes)) == len(episodes) else None
