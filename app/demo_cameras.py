"""The demo's cameras: which ones it records, each episode's videos encoded a few episodes ahead of the writer
(`app.demo_video` encodes them), and v3.0's video files holding many episodes back to back."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from app import demo_video
from app.demo_tables import CHUNKS_SIZE, FEATURE_ORDER, Episode, Plan, Stats, image_stats, iter_episodes
from app.demo_video import Camera

TOP_CAMERA, WRIST_CAMERA = "observation.images.top", "observation.images.wrist"
# Camera key -> (height, width). The default demo has one camera; TWO_CAMERAS adds a smaller second one.
DEFAULT_CAMERAS: Mapping[str, tuple[int, int]] = MappingProxyType({TOP_CAMERA: (64, 96)})
TWO_CAMERAS: Mapping[str, tuple[int, int]] = MappingProxyType({TOP_CAMERA: (64, 96), WRIST_CAMERA: (48, 64)})
V30_VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
V21_VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
VIDEO_EPISODES_PER_FILE = 80  # default v3.0 video rollover: 3 files per camera for 200 episodes, apart from data's
_ENCODE_WORKERS = max(1, min(4, os.cpu_count() or 1))


@dataclass(frozen=True)
class EpisodeVideo:
    """One camera's recording of one episode: a standalone mp4 starting at t=0, and its pixel stats."""

    mp4: bytes
    stats: Stats


def recorded_cameras(cameras: Mapping[str, tuple[int, int]] | None) -> tuple[Camera, ...]:
    found = tuple(Camera(key, int(height), int(width)) for key, (height, width) in (cameras or {}).items())
    for camera in found:
        demo_video.validate_camera(camera)
        if camera.key in FEATURE_ORDER:
            raise ValueError(f"camera key {camera.key!r} is already a feature of the demo")
    return found


def iter_recorded_episodes(plan: Plan) -> Iterator[tuple[Episode, dict[str, EpisodeVideo]]]:
    """Episodes in order, each with its camera videos; videos are encoded a few episodes ahead on worker threads
    (the encoders release the GIL), while the caller writes the parquet of earlier episodes."""
    if not plan.cameras:
        for episode in iter_episodes(plan):
            yield episode, {}
        return
    pending: deque[tuple[Episode, dict[str, Future[EpisodeVideo]]]] = deque()
    with ThreadPoolExecutor(_ENCODE_WORKERS, thread_name_prefix="demo-video") as pool:
        for episode in iter_episodes(plan):
            jobs = {camera.key: pool.submit(_record_video, camera, episode, plan.fps) for camera in plan.cameras}
            pending.append((episode, jobs))
            if len(pending) > 2 * _ENCODE_WORKERS:
                done, jobs = pending.popleft()
                yield done, {key: job.result() for key, job in jobs.items()}
        while pending:
            done, jobs = pending.popleft()
            yield done, {key: job.result() for key, job in jobs.items()}


def _record_video(camera: Camera, episode: Episode, fps: int) -> EpisodeVideo:
    frames = demo_video.camera_frames(camera, episode.index, episode.columns["frame_index"])
    return EpisodeVideo(demo_video.encode_episode(frames, fps), image_stats(frames))


class V30Videos:
    """Each camera's current v3.0 video file; episodes are appended back to back and roll over by episode count
    (an episode never spans two files)."""

    def __init__(self, out: Path, n_files: int, episodes: int) -> None:
        self._out, self._n_files, self._episodes = out, n_files, episodes
        self._open: dict[str, tuple[int, demo_video.ConcatenatedVideo]] = {}

    def append(self, episode: int, recorded: dict[str, EpisodeVideo]) -> dict[str, Any]:
        """Append the episode's videos; return its `videos/<key>/...` episode-metadata columns."""
        file_number = episode * self._n_files // self._episodes
        chunk, file = divmod(file_number, CHUNKS_SIZE)
        columns: dict[str, Any] = {}
        for key, video in recorded.items():
            current = self._open.get(key)
            if current is None or current[0] != file_number:
                if current is not None:
                    current[1].close()
                path = self._out / V30_VIDEO_PATH.format(video_key=key, chunk_index=chunk, file_index=file)
                current = self._open[key] = (file_number, demo_video.ConcatenatedVideo(path))
            start, end = current[1].append(video.mp4)
            columns |= {
                f"videos/{key}/chunk_index": chunk,
                f"videos/{key}/file_index": file,
                f"videos/{key}/from_timestamp": start,
                f"videos/{key}/to_timestamp": end,
            }
        return columns

    def close(self) -> None:
        for _, video in self._open.values():
            video.close()
        self._open.clear()
