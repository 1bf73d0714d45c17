"""Source formats: how a dataset directory's files and metadata are read.

`open_source(path)` recognises the format and returns a `Source` (see `app.sources.source`). To add a format,
write a module with a class implementing `Source` and recognise it in `open_source` and `is_dataset_dir`.
"""

from __future__ import annotations

from pathlib import Path

from app.errors import DatasetError
from app.sources.json_files import read_json
from app.sources.lerobot_v21 import LeRobotV21Source
from app.sources.lerobot_v30 import LeRobotV30Source
from app.sources.parquet import ParquetSource, has_parquet_files
from app.sources.source import DatasetInfo, EpisodeRun, RowGroups, Source, SourceFingerprint, schema_hash

__all__ = [
    "DatasetInfo",
    "EpisodeRun",
    "RowGroups",
    "Source",
    "SourceFingerprint",
    "is_dataset_dir",
    "open_source",
    "schema_hash",
]

LEROBOT_INFO = Path("meta/info.json")


def is_dataset_dir(path: Path) -> bool:
    """A LeRobot dataset (meta/info.json) or a directory with parquet files directly in it or under data/."""
    return (path / LEROBOT_INFO).is_file() or has_parquet_files(path)


def open_source(root: Path) -> Source:
    """The dataset directory `root` in its format: LeRobot (by `meta/info.json`'s version) or generic parquet."""
    info_path = root / LEROBOT_INFO
    if not info_path.is_file():
        return ParquetSource.open(root)
    info = read_json(info_path)
    version = str(info.get("codebase_version", ""))
    fps = info.get("fps")
    fps = float(fps) if isinstance(fps, int | float) and fps > 0 else None
    if version.startswith("v3"):
        return LeRobotV30Source.open_with(root, info, fps)
    if version.startswith("v2"):
        return LeRobotV21Source.open_with(root, info, fps)
    raise DatasetError(f"{info_path}: unsupported codebase_version {version!r} (expected v2.1 or v3.0)")
