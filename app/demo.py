"""Write deterministic, realistic LeRobot-format demo datasets (v3.0 or v2.1).

The frames are synthetic but shaped like a real recording: smooth 6-joint state/action trajectories, a small PNG
camera image per frame and the five standard LeRobot columns (`app.demo_tables`), camera videos (`app.demo_cameras`,
encoded by `app.demo_video`) and the metadata files each format version defines, written here (see the LeRobot
format reference, sections 1-4). Everything derives from `seed`. Episodes are generated and written one at a
time (videos encoded a few episodes ahead, in parallel), so memory stays bounded by a few episodes, not the dataset.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.parquet as pq

from app import demo_video
from app.demo_cameras import (
    DEFAULT_CAMERAS,
    V21_VIDEO_PATH,
    V30_VIDEO_PATH,
    VIDEO_EPISODES_PER_FILE,
    V30Videos,
    iter_recorded_episodes,
    recorded_cameras,
)
from app.demo_tables import (
    ACTION,
    CHUNKS_SIZE,
    FPS,
    IMAGE,
    JOINT_NAMES,
    STANDARD_COLUMNS,
    STAT_NAMES,
    STATE,
    Episode,
    Plan,
    Stats,
    StatsAggregate,
    data_schema,
    episode_stats,
    episode_table,
    make_plan,
    stats_json,
    tasks_table,
)
from app.demo_video import Camera

FORMATS = ("v3.0", "v2.1")
EPISODES_PER_FILE = 50  # default v3.0 rollover: about 4 data files for the default 200 episodes
ROBOT_TYPE = "so100"
V30_DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
V30_EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
V21_DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
INFO_PATH = "meta/info.json"


def write_demo_dataset(
    out: Path,
    *,
    format: str = "v3.0",
    episodes: int = 200,
    seed: int = 0,
    image_size: int = 16,
    files: int | None = None,
    cameras: Mapping[str, tuple[int, int]] | None = DEFAULT_CAMERAS,
    video_files: int | None = None,
    joints: int = len(JOINT_NAMES),
    fps: int = FPS,
) -> Path:
    """Write a demo dataset into directory `out` (created; must be empty or absent) and return `out`.

    `format` is "v3.0" (episodes packed into `files` data files, default about one per 50 episodes) or "v2.1"
    (one data file per episode; `files` is ignored). `image_size` is the side of the square RGB image column.
    `cameras` maps video feature keys to (height, width), both even, with room for the frame label's 32 cells of
    8x8 pixels (e.g. 32x64; see `app.demo_video.camera_frames`); `None` or `{}` writes no videos. v3.0 packs each
    camera's episodes into `video_files` mp4 files (default about one per 80 episodes; independent of the data
    files); v2.1 writes one mp4 per episode and camera. `joints` is the width of the state and action vectors (a
    robot with another arm: more joints than the six named ones are called `joint_6`, `joint_7`...); `fps` the frame
    rate of the recording (timestamps and videos).
    `meta/info.json` is written last, so its presence marks a complete dataset.
    Raises ValueError for an unknown format, episodes < 1, image_size < 1, files < 1, video_files < 1, a camera
    that cannot be encoded, or a non-empty `out`.
    """
    out = Path(out)
    _validate_arguments(format, episodes, image_size, files, video_files)
    cameras_recorded = recorded_cameras(cameras)
    _prepare_empty_dir(out)
    plan = make_plan(episodes, seed, image_size, cameras_recorded, joints, fps)
    if format == "v3.0":
        n_files = min(files if files is not None else math.ceil(episodes / EPISODES_PER_FILE), episodes)
        n_video_files = min(video_files or math.ceil(episodes / VIDEO_EPISODES_PER_FILE), episodes)
        _write_v30(out, plan, n_files, n_video_files)
    else:
        _write_v21(out, plan)
    _write_json(out / INFO_PATH, _info(plan, format))
    return out


def ensure_demo_dataset(out: Path, **options: Any) -> Path:
    """Write the default demo (v3.0; or `write_demo_dataset` with `options`) into `out` unless a complete one is
    already there; safe under concurrent callers from several processes (write into a temp sibling dir, then
    os.rename into place; if the rename loses the race, discard the temp). Return `out`.

    Raises ValueError if `out` exists and holds something other than a complete dataset.
    """
    out = Path(out)
    if _is_complete(out):
        return out
    if out.exists() and not _is_empty_dir(out):
        raise ValueError(f"{out} exists and is not a complete dataset; refusing to write the demo over it")
    out.parent.mkdir(parents=True, exist_ok=True)
    # Hidden name: dataset scanners skip dot-directories, so a half-written temp is never served.
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        write_demo_dataset(tmp, **options)
        try:
            os.rename(tmp, out)  # atomic; replaces `out` only if it is absent or an empty directory
        except OSError as exc:
            if not _is_complete(out):  # not another caller's finished demo: something foreign is there
                raise ValueError(f"cannot move the demo dataset into {out}: {exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# ----------------------------------------------------------------------------------------------------
# Validation and planning


def _validate_arguments(
    format: str, episodes: int, image_size: int, files: int | None, video_files: int | None
) -> None:
    if format not in FORMATS:
        raise ValueError(f"unknown demo format {format!r}; expected one of {', '.join(FORMATS)}")
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if image_size < 1:
        raise ValueError(f"image_size must be >= 1, got {image_size}")
    if files is not None and files < 1:
        raise ValueError(f"files must be >= 1 (or None for the default), got {files}")
    if video_files is not None and video_files < 1:
        raise ValueError(f"video_files must be >= 1 (or None for the default), got {video_files}")


def _prepare_empty_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} exists and is not a directory")
    if out.exists() and not _is_empty_dir(out):
        raise ValueError(f"{out} is not empty; a demo dataset must be written into an empty or absent directory")
    out.mkdir(parents=True, exist_ok=True)


def _is_empty_dir(path: Path) -> bool:
    return path.is_dir() and next(path.iterdir(), None) is None


def _is_complete(path: Path) -> bool:
    return (path / INFO_PATH).is_file()


# ----------------------------------------------------------------------------------------------------
# Metadata and format writers


def _features(
    image_size: int, cameras: tuple[Camera, ...], joints: tuple[str, ...], fps: int
) -> dict[str, dict[str, Any]]:
    """info.json `features`, in data-file column order; cameras (no data column) follow the image column."""
    vector = {"dtype": "float32", "shape": [len(joints)]}
    image = {"dtype": "image", "shape": [image_size, image_size, 3], "names": ["height", "width", "channels"]}
    scalar_dtypes = {"timestamp": "float32", **{name: "int64" for name in STANDARD_COLUMNS[1:]}}
    return {
        STATE: {**vector, "names": list(joints)},
        ACTION: {**vector, "names": list(joints)},
        IMAGE: image,
        **{camera.key: demo_video.video_feature(camera, fps) for camera in cameras},
        **{name: {"dtype": dtype, "shape": [1], "names": None} for name, dtype in scalar_dtypes.items()},
    }


def _write_v30(out: Path, plan: Plan, n_files: int, n_video_files: int) -> None:
    schema = data_schema(len(plan.joints))
    aggregate = StatsAggregate()
    episode_rows: list[dict[str, Any]] = []
    writer: pq.ParquetWriter | None = None
    current_file = -1
    videos = V30Videos(out, n_video_files, plan.episodes)
    try:
        for episode, recorded in iter_recorded_episodes(plan):
            # Roll over by episode count; an episode never spans two files.
            file_number = episode.index * n_files // plan.episodes
            if file_number != current_file:
                if writer is not None:
                    writer.close()
                writer = _open_data_writer(out, file_number, schema)
                current_file = file_number
            writer.write_table(episode_table(episode, schema))  # one row group per episode, as LeRobot does
            video_columns = videos.append(episode.index, recorded)
            stats = episode_stats(episode, {key: video.stats for key, video in recorded.items()})
            aggregate.add(stats)
            episode_rows.append(_v30_episode_row(plan, episode, file_number, video_columns, stats))
    finally:
        if writer is not None:
            writer.close()
        videos.close()
    _write_parquet(out / V30_EPISODES_PATH.format(chunk_index=0, file_index=0), pa.Table.from_pylist(episode_rows))
    _write_parquet(out / "meta/tasks.parquet", tasks_table(plan))
    _write_json(out / "meta/stats.json", stats_json(aggregate.result()))


def _open_data_writer(out: Path, file_number: int, schema: pa.Schema) -> pq.ParquetWriter:
    chunk, file = divmod(file_number, CHUNKS_SIZE)
    path = out / V30_DATA_PATH.format(chunk_index=chunk, file_index=file)
    path.parent.mkdir(parents=True, exist_ok=True)
    return pq.ParquetWriter(path, schema)


def _v30_episode_row(
    plan: Plan, episode: Episode, file_number: int, video_columns: dict[str, Any], stats: dict[str, Stats]
) -> dict[str, Any]:
    chunk, file = divmod(file_number, CHUNKS_SIZE)
    row: dict[str, Any] = {
        "episode_index": episode.index,
        "tasks": [plan.tasks[plan.task_index[episode.index]]],
        "length": episode.length,
        "data/chunk_index": chunk,
        "data/file_index": file,
        "dataset_from_index": episode.start,
        "dataset_to_index": episode.start + episode.length,
        **video_columns,
    }
    for name, feature_stats in stats.items():
        for stat in STAT_NAMES:
            row[f"stats/{name}/{stat}"] = feature_stats[stat].tolist()
    row["meta/episodes/chunk_index"] = 0
    row["meta/episodes/file_index"] = 0
    return row


def _write_v21(out: Path, plan: Plan) -> None:
    schema = data_schema(len(plan.joints))
    meta = out / "meta"
    meta.mkdir(parents=True, exist_ok=True)
    with (
        open(meta / "episodes.jsonl", "w", encoding="utf-8") as episodes_file,
        open(meta / "episodes_stats.jsonl", "w", encoding="utf-8") as stats_file,
    ):
        for episode, recorded in iter_recorded_episodes(plan):
            chunk = episode.index // CHUNKS_SIZE
            path = out / V21_DATA_PATH.format(episode_chunk=chunk, episode_index=episode.index)
            _write_parquet(path, episode_table(episode, schema))
            for key, video in recorded.items():
                video_path = out / V21_VIDEO_PATH.format(
                    episode_chunk=chunk, video_key=key, episode_index=episode.index
                )
                video_path.parent.mkdir(parents=True, exist_ok=True)
                video_path.write_bytes(video.mp4)
            task = plan.tasks[plan.task_index[episode.index]]
            _write_json_line(episodes_file, {"episode_index": episode.index, "tasks": [task], "length": episode.length})
            stats = stats_json(episode_stats(episode, {key: video.stats for key, video in recorded.items()}))
            _write_json_line(stats_file, {"episode_index": episode.index, "stats": stats})
    with open(meta / "tasks.jsonl", "w", encoding="utf-8") as tasks_file:
        for task_index, task in enumerate(plan.tasks):
            _write_json_line(tasks_file, {"task_index": task_index, "task": task})


def _info(plan: Plan, format: str) -> dict[str, Any]:
    """meta/info.json, keys in the order LeRobot writes them for `format`."""
    info: dict[str, Any] = {
        "codebase_version": format,
        "robot_type": ROBOT_TYPE,
        "total_episodes": plan.episodes,
        "total_frames": plan.total_frames,
        "total_tasks": len(plan.tasks),
    }
    if format == "v3.0":
        info |= {"chunks_size": CHUNKS_SIZE, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200}
        data_path, video_path = V30_DATA_PATH, V30_VIDEO_PATH
    else:
        info |= {
            "total_videos": plan.episodes * len(plan.cameras),
            "total_chunks": math.ceil(plan.episodes / CHUNKS_SIZE),
            "chunks_size": CHUNKS_SIZE,
        }
        data_path, video_path = V21_DATA_PATH, V21_VIDEO_PATH
    return info | {
        "fps": plan.fps,
        "splits": {"train": f"0:{plan.episodes}"},
        "data_path": data_path,
        "video_path": video_path if plan.cameras else None,
        "features": _features(plan.image_size, plan.cameras, plan.joints, plan.fps),
    }


def _write_parquet(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=4, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_json_line(handle: TextIO, value: Any) -> None:
    handle.write(json.dumps(value, ensure_ascii=False) + "\n")
