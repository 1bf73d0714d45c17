"""Source formats: how a dataset directory's files and metadata are read.

`open_source(path)` recognises the format and returns a `Source` (see `app.sources.source`). To add a format,
write a module with a class implementing `Source` and recognise it in `open_source` and `is_dataset_dir`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from app.errors import DatasetError
from app.sources.files import ALL_THERE, DatasetPath, FileSupply, is_remote_path
from app.sources.json_files import read_json
from app.sources.lerobot_v21 import LeRobotV21Source
from app.sources.lerobot_v30 import LeRobotV30Source
from app.sources.object_store import RemotePath
from app.sources.parquet import GENERIC_SETTINGS, ParquetSource, has_parquet_files
from app.sources.source import DatasetInfo, EpisodeRun, RowGroups, Source, SourceFingerprint, schema_hash

__all__ = [
    "LEROBOT_INFO",
    "DatasetInfo",
    "DatasetPath",
    "EpisodeRun",
    "RowGroups",
    "Source",
    "SourceFingerprint",
    "is_dataset_dir",
    "is_dataset_root",
    "open_source",
    "schema_hash",
    "stamp",
    "watched_paths",
]

LEROBOT_INFO = Path("meta/info.json")


def is_dataset_dir(path: DatasetPath) -> bool:
    """A LeRobot dataset (meta/info.json) or a directory with parquet files directly in it or under data/."""
    return (path / LEROBOT_INFO).is_file() or has_parquet_files(path)


def is_dataset_root(path: DatasetPath) -> bool:
    """Whether a configured root is itself one dataset: a LeRobot dataset (meta/info.json), or a directory with
    parquet files directly in it. A root holding only a data/ tree stays a root of datasets (the tree is one)."""
    if (path / LEROBOT_INFO).is_file():
        return True
    return any(p.suffix == ".parquet" and p.is_file() for p in _safe_iterdir(path))


def watched_paths(root: DatasetPath) -> list[Any]:
    """What to stat to notice that a dataset's file set or metadata changed: every directory of its data tree
    (a file added, removed or renamed in a directory moves the directory's mtime), and every metadata file (LeRobot
    appends to `meta/` files in place). Listed once per index load; checking them is a `stat` each. In an object
    store, the dataset's prefix itself: its listing (cached for `EPISERVE_REMOTE_LIST_TTL`) says it all."""
    if is_remote_path(root):
        return [root]
    if (root / LEROBOT_INFO).is_file():
        trees, paths = [(root / "data", False), (root / "meta", True)], [str(root)]
    else:
        trees, paths = [(root, False)], [str(root / GENERIC_SETTINGS)]
    for tree, with_files in trees:
        for directory, subdirs, names in os.walk(tree):
            subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
            paths.append(directory)
            if with_files:
                paths.extend(os.path.join(directory, name) for name in sorted(names))
    return paths


def stamp(paths: list[Any]) -> tuple[tuple[int, ...] | None, ...]:
    """(mtime, ctime, size, inode) of each path, None where it is missing; for an object-store prefix, the
    signature of its listing."""
    stamps: list[tuple[int, ...] | None] = []
    for path in paths:
        if isinstance(path, RemotePath):
            stamps.append((path.listing_signature(),))
            continue
        try:
            st = os.stat(path)
        except OSError:
            stamps.append(None)
            continue
        stamps.append((st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino))
    return tuple(stamps)


def _safe_iterdir(path: DatasetPath) -> list[Any]:
    try:
        return list(path.iterdir())
    except OSError:
        return []


def open_source(root: DatasetPath, supply: FileSupply = ALL_THERE) -> Source:
    """The dataset directory `root` in its format: LeRobot (by `meta/info.json`'s version) or generic parquet. Its
    files come to be there through `supply` (a LeRobot dataset's data files are those it lists)."""
    info_path = root / LEROBOT_INFO
    if not info_path.is_file():
        return ParquetSource.open(root, supply)
    info = read_json(info_path)
    version = str(info.get("codebase_version", ""))
    fps = info.get("fps")
    fps = float(fps) if isinstance(fps, int | float) and fps > 0 else None
    if version.startswith("v3"):
        return LeRobotV30Source.open_with(root, info, fps, supply)
    if version.startswith("v2"):
        return LeRobotV21Source.open_with(root, info, fps, supply)
    raise DatasetError(f"{info_path}: unsupported codebase_version {version!r} (expected v2.1 or v3.0)")
