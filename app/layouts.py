"""Recognise a dataset directory's layout (LeRobot v3.0, v2.1, or generic parquet) and read its metadata.

A layout knows where the source parquet files are and what the format's metadata says about episodes; it never
reads frame data. `episode_runs_from_metadata` may return None, in which case the caller scans the episode column.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from app.errors import DatasetError

LEROBOT_INFO = Path("meta/info.json")
GENERIC_SETTINGS = Path("episerve.json")
_V21_EPISODE_FILE = re.compile(r"episode_(\d+)\.parquet$")
_STRINGS = (pa.string(), pa.large_string())


@dataclass(frozen=True)
class EpisodeRun:
    """Rows [start, stop) of source file number `file` belong to `episode`."""

    episode: int
    file: int
    start: int
    stop: int


@dataclass
class Layout:
    """What a dataset directory holds, as far as metadata tells."""

    format: str  # "lerobot-v3.0", "lerobot-v2.1" or "parquet"
    files: list[str]  # source parquet files, relative POSIX paths, in stored order
    fps: float | None = None
    info: dict[str, Any] = field(default_factory=dict)
    tasks: dict[int, str] = field(default_factory=dict)
    episode_tasks: dict[int, list[str]] = field(default_factory=dict)
    episode_column: str | None = None  # overrides the server-wide default (generic datasets, `episerve.json`)


def is_dataset_dir(path: Path) -> bool:
    """A LeRobot dataset (meta/info.json) or a directory with parquet files directly in it or under data/."""
    if (path / LEROBOT_INFO).is_file():
        return True
    if any(p.suffix == ".parquet" and p.is_file() for p in _safe_iterdir(path)):
        return True
    data = path / "data"
    return data.is_dir() and any(data.rglob("*.parquet"))


def is_dataset_root(path: Path) -> bool:
    """Whether a configured root is itself one dataset: a LeRobot dataset (meta/info.json), or a directory with
    parquet files directly in it. A root holding only a data/ tree stays a root of datasets (the tree is one)."""
    if (path / LEROBOT_INFO).is_file():
        return True
    return any(p.suffix == ".parquet" and p.is_file() for p in _safe_iterdir(path))


def watched_paths(root: Path) -> list[str]:
    """What to stat to notice that a dataset's file set or metadata changed: every directory of its data tree
    (a file added, removed or renamed in a directory moves the directory's mtime), and every metadata file (LeRobot
    appends to `meta/` files in place). Listed once per index load; checking them is a `stat` each."""
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


def stamp(paths: list[str]) -> tuple[tuple[int, int, int, int] | None, ...]:
    """(mtime, ctime, size, inode) of each path, None where it is missing."""
    stamps: list[tuple[int, int, int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            stamps.append(None)
            continue
        stamps.append((st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino))
    return tuple(stamps)


def read_layout(root: Path) -> Layout:
    """Describe the dataset directory `root` (its files relative to it, sorted)."""
    info_path = root / LEROBOT_INFO
    if not info_path.is_file():
        return _generic_layout(root)
    info = _read_json(info_path)
    version = str(info.get("codebase_version", ""))
    fps = info.get("fps")
    fps = float(fps) if isinstance(fps, int | float) and fps > 0 else None
    files = _parquet_files(root, root / "data")
    if version.startswith("v3"):
        layout = Layout("lerobot-v3.0", files, fps, info)
        layout.tasks = _v3_tasks(root)
    elif version.startswith("v2"):
        layout = Layout("lerobot-v2.1", files, fps, info)
        layout.tasks = {int(r["task_index"]): str(r["task"]) for r in _read_jsonl(root / "meta/tasks.jsonl")}
        layout.episode_tasks = {
            int(r["episode_index"]): list(r.get("tasks") or []) for r in _read_jsonl(root / "meta/episodes.jsonl")
        }
    else:
        raise DatasetError(f"{info_path}: unsupported codebase_version {version!r} (expected v2.1 or v3.0)")
    return layout


def _generic_layout(root: Path) -> Layout:
    """Any directory of parquet files; an optional `episerve.json` gives `fps` and `episode_column`."""
    layout = Layout(format="parquet", files=_parquet_files(root, root))
    settings_path = root / GENERIC_SETTINGS
    if settings_path.is_file():
        settings = _read_json(settings_path)
        fps = settings.get("fps")
        if fps is not None and (not isinstance(fps, int | float) or isinstance(fps, bool) or fps <= 0):
            raise DatasetError(f"{settings_path}: fps must be a positive number, got {fps!r}")
        column = settings.get("episode_column")
        if column is not None and not isinstance(column, str):
            raise DatasetError(f"{settings_path}: episode_column must be a string, got {column!r}")
        layout.fps = float(fps) if fps is not None else None
        layout.episode_column = column
        layout.info = settings
    return layout


def episode_runs_from_metadata(root: Path, layout: Layout, file_rows: list[int]) -> list[EpisodeRun] | None:
    """Episode runs from LeRobot metadata, checked against the files' row counts; None if unusable."""
    try:
        if layout.format == "lerobot-v2.1":
            return _v21_runs(layout.files, file_rows)
        if layout.format == "lerobot-v3.0":
            return _v3_runs(root, layout, file_rows)
    except (OSError, KeyError, ValueError, TypeError):
        return None
    return None


def _v21_runs(files: list[str], file_rows: list[int]) -> list[EpisodeRun] | None:
    runs = []
    for number, (name, rows) in enumerate(zip(files, file_rows, strict=True)):
        match = _V21_EPISODE_FILE.search(name)
        if match is None:
            return None
        if rows:
            runs.append(EpisodeRun(int(match.group(1)), number, 0, rows))
    episodes = [r.episode for r in runs]
    return runs if len(set(episodes)) == len(episodes) else None


def _v3_runs(root: Path, layout: Layout, file_rows: list[int]) -> list[EpisodeRun] | None:
    meta_files = sorted((root / "meta/episodes").glob("*/*.parquet"))
    if not meta_files:
        return None
    wanted = [
        "episode_index",
        "data/chunk_index",
        "data/file_index",
        "dataset_from_index",
        "dataset_to_index",
    ]
    rows: list[dict[str, Any]] = []
    for meta in meta_files:
        table = pq.read_table(meta, columns=[*wanted, *(["tasks"] if _has_column(meta, "tasks") else [])])
        rows.extend(table.to_pylist())
    template = str(layout.info.get("data_path") or "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet")
    file_numbers = {name: n for n, name in enumerate(layout.files)}
    per_file: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        name = template.format(chunk_index=row["data/chunk_index"], file_index=row["data/file_index"])
        if name not in file_numbers:
            return None
        per_file.setdefault(file_numbers[name], []).append(row)
        if row.get("tasks") is not None:
            layout.episode_tasks[int(row["episode_index"])] = list(row["tasks"])
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


def _v3_tasks(root: Path) -> dict[int, str]:
    path = root / "meta/tasks.parquet"
    if not path.is_file():
        return {}
    table = pq.read_table(path)
    names = [n for n in table.column_names if n != "task_index" and table.schema.field(n).type in _STRINGS]
    if "task_index" not in table.column_names or not names:
        return {}
    return dict(zip(table["task_index"].to_pylist(), table[names[0]].to_pylist(), strict=True))


def _has_column(path: Path, name: str) -> bool:
    return name in pq.read_schema(path).names


def _parquet_files(root: Path, under: Path) -> list[str]:
    """Parquet files below `under` (no hidden dirs, no symlinks leaving `root`), relative to `root`, sorted."""
    if not under.is_dir():
        return []
    real_root = root.resolve()
    found = []
    for path in under.rglob("*.parquet"):
        rel = path.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or rel.parts[0] == "meta":
            continue
        if not path.resolve().is_relative_to(real_root) or not path.is_file():
            continue
        found.append(rel.as_posix())
    return sorted(found)


def _safe_iterdir(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except OSError:
        return []


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{path}: unreadable JSON ({exc})") from exc


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except ValueError as exc:
        raise DatasetError(f"{path}: unreadable JSON lines ({exc})") from exc
