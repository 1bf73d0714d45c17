"""Camera videos of LeRobot datasets: which features are videos, where an episode's frames are, and decoding
the frames nearest to given times (PyAV, i.e. FFmpeg: AV1 through dav1d, H.264, HEVC...).

LeRobot's frame rule (format reference §4): the frame of a row at episode time `t` is the decoded frame whose
presentation time is nearest to `from_timestamp + t` in the episode's file (v3.0, several episodes per file) or
to `t` in the episode's own file (v2.1); farther than `tolerance_s` is an error, never a silently wrong frame.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from app.errors import DatasetError, InvalidInput
from app.sources.decoders import DecoderPool
from app.sources.files import DatasetPath, video_input
from app.sources.frame_tiers import hot_tier, kept_tier
from app.sources.source import SourceFingerprint, VideoFeature


def video_features(info: dict[str, Any]) -> dict[str, VideoFeature]:
    """The video features of an info.json, in its order."""
    features = info.get("features") or {}
    return {
        key: VideoFeature.of(key, feature)
        for key, feature in features.items()
        if isinstance(feature, dict) and feature.get("dtype") == "video"
    }


def decode_nearest_into(
    out: np.ndarray,
    places: Sequence[np.ndarray],
    root: DatasetPath,
    rel: str,
    times: np.ndarray,
    feature: VideoFeature,
    decoders: DecoderPool,
    require_frames: bool = True,
) -> np.ndarray:
    """Decode the frame nearest to each of `times` (seconds, ascending) into `out` at the positions `places[i]`
    (one or more per time), and return the presentation times of the frames found (NaN where decoding from the
    keyframe before them found no frame at all, an error unless `require_frames` is False).

    One forward pass from the keyframe at or before the first time (or on from where the last read of the file
    stopped, see `app.sources.decoders`); each frame picked is converted to RGB once, straight into its first place
    in `out`, as soon as it is known (the decoded frames are not held until the end), and copied from there to its
    other places."""
    import av

    last: list[Any] = [None, -1]  # the frame converted last, and where it went
    rgb = RgbConverter(feature, rel)

    def keep(i: int, frame: Any) -> None:
        first, *others = places[i].tolist()
        if frame is last[0]:
            out[first] = out[last[1]]
        else:
            rgb.convert_into(frame, out[first])
        for other in others:
            out[other] = out[first]
        last[:] = [frame, first]

    try:
        frame_s = 1.0 / (feature.fps or 10.0)
        first = float(times[0]) if len(times) else 0.0
        with decoders.checkout(root / rel, first, frame_s, run=_is_run(times, frame_s)) as decoder:
            picked_at = decoder.nearest(times, frame_s, keep)
    except (OSError, av.error.FFmpegError) as exc:
        raise DatasetError(f"video file {rel!r} cannot be decoded: {exc}") from exc
    if require_frames and np.isnan(picked_at).any():
        raise DatasetError(_no_frames(rel, times, picked_at))
    return picked_at


def _no_frames(rel: str, times: np.ndarray, picked_at: np.ndarray) -> str:
    """Why some of `times` found no frame: the file has none, or none can be decoded from some point on."""
    missing = np.isnan(picked_at)
    if missing.all():
        return f"video file {rel!r} holds no frames"
    first = float(times[np.flatnonzero(missing)[0]])
    return f"video file {rel!r} has no decodable frame near {first:.6f} s (the file may be truncated)"


def decode_nearest_side_by_side(
    out: np.ndarray,
    places: Sequence[np.ndarray],
    root: DatasetPath,
    rel: str,
    times: np.ndarray,
    feature: VideoFeature,
    decoders: DecoderPool,
) -> np.ndarray:
    """`decode_nearest_into`, with a scattered read of many times (a shuffled batch's frames of one file) cut into
    up to `SIDE_BY_SIDE` parts of ascending times, decoded at once on separate decoders in `decoding_threads()`.

    Each frame of a scattered read costs a seek and a decode from its keyframe anyway, so cutting it costs
    nothing; the request's decoding then uses the cores that other requests leave idle (while a client receives
    and converts its previous batch, say) instead of one. Runs of consecutive frames are decoded in one pass, as
    they continue from keyframe to keyframe without seeking."""
    bounds = part_bounds(times, 1.0 / (feature.fps or 10.0), math.prod(feature.file_size))
    if len(bounds) < 3:
        return decode_nearest_into(out, places, root, rel, times, feature, decoders)
    parts = [
        decoding_threads().submit(
            decode_nearest_into, out, places[low:high], root, rel, times[low:high], feature, decoders, False
        )
        for low, high in itertools.pairwise(bounds)
    ]
    futures.wait(parts)  # every part has stopped writing into `out` before an error leaves
    picked_at = np.concatenate([part.result() for part in parts])
    if np.isnan(picked_at).any():  # a part past the file's decodable end (a truncated file): as one pass has it
        return decode_nearest_into(out, places, root, rel, times, feature, decoders)
    return picked_at


def part_bounds(times: np.ndarray, frame_s: float, frame_pixels: int) -> list[int]:
    """Where a read of `times` (ascending) of frames of `frame_pixels` pixels each (in the file) is cut for
    `decode_nearest_side_by_side`: [0, ..., len(times)], one part (no cut) for a run of consecutive frames or too
    little decoding to share. A part holds `MIN_PART_FRAMES` frames or `MIN_PART_PIXELS` of decoding, whichever
    is less: an answer read in pieces of a few MiB (`app.reads.pieces`) has only a few frames a piece when they
    are large, and those are still decoded side by side."""
    frames = max(len(times) // MIN_PART_FRAMES, len(times) * frame_pixels // MIN_PART_PIXELS)
    count = min(SIDE_BY_SIDE, frames)
    if count < 2 or _is_run(times, frame_s):
        return [0, len(times)]
    return np.linspace(0, len(times), count + 1).round().astype(int).tolist()


SIDE_BY_SIDE = min(4, os.cpu_count() or 1)
MIN_PART_FRAMES = 8
MIN_PART_PIXELS = 8 * 224 * 224  # as much decoding as eight 224x224 frames: large frames need fewer a part
_threads: tuple[int, futures.ThreadPoolExecutor] | None = None
_threads_lock = threading.Lock()


def decoding_threads() -> futures.ThreadPoolExecutor:
    """This process's threads for the parts of scattered reads (made anew in a forked child)."""
    global _threads
    with _threads_lock:
        if _threads is None or _threads[0] != os.getpid():
            _threads = (os.getpid(), futures.ThreadPoolExecutor(SIDE_BY_SIDE, thread_name_prefix="decode"))
        return _threads[1]


RUN_FRAMES = 16  # a read of at least this many mostly consecutive frames is a run (see `DecoderPool`)


def _is_run(times: np.ndarray, frame_s: float) -> bool:
    """Whether `times` (ascending) are mostly consecutive frames: a read that decodes on rather than seeks."""
    return len(times) >= RUN_FRAMES and float(times[-1] - times[0]) <= 2 * len(times) * frame_s


class RgbConverter:
    """Converts decoded frames of one camera file to uint8 (H, W, 3) RGB at the camera's served size
    (area-averaged when downscaled), written straight into the caller's array.

    One FFmpeg scaler, single-threaded, serves every frame: a new one per frame (what `VideoFrame.to_ndarray`
    does) set up and tore down a scaler and its threads each time, which cost more than the conversion. The
    pixels equal `frame.to_ndarray(format="rgb24")` (and its `AREA`-downscaled form) exactly.
    """

    def __init__(self, feature: VideoFeature, rel: str) -> None:
        from av.video.reformatter import VideoReformatter

        self.feature, self.rel = feature, rel
        self._reformatter = VideoReformatter()
        resized = (feature.height, feature.width) != feature.file_size
        self._size = {"width": feature.width, "height": feature.height, "interpolation": "AREA"} if resized else {}

    def convert_into(self, frame: Any, out: np.ndarray) -> None:
        """Write `frame` as RGB into `out`, a uint8 (H, W, 3) array."""
        if (frame.height, frame.width) != self.feature.file_size:
            height, width = self.feature.file_size
            raise DatasetError(
                f"video file {self.rel!r} has {frame.width}x{frame.height} frames; info.json says {width}x{height}"
            )
        plane = self._reformatter.reformat(frame, format="rgb24", threads=1, **self._size).planes[0]
        height, width = self.feature.height, self.feature.width
        rows = np.frombuffer(plane, np.uint8).reshape(height, plane.line_size)[:, : width * 3]  # without padding
        out[...] = rows.reshape(height, width, 3)


def check_tolerance(
    key: str, episodes: np.ndarray, frame_index: np.ndarray, wanted: np.ndarray, found: np.ndarray, tolerance_s: float
) -> None:
    """A problem naming the first row whose nearest frame is farther than `tolerance_s` from its time."""
    distance = np.abs(found - wanted)
    bad = np.flatnonzero(~(distance <= tolerance_s))
    if len(bad):
        i = int(bad[0])
        raise InvalidInput(
            f"no frame of {key!r} within tolerance_s={tolerance_s:g} of episode {int(episodes[i])} frame "
            f"{int(frame_index[i])} (time {wanted[i]:.6f} s in its video; "
            f"the nearest frame is {distance[i]:.6f} s away)"
        )


def frame_schema(feature: VideoFeature) -> pa.Schema:
    """A decoded-frame segment: each frame's presentation time and the frame as the camera's tier keeps it (raw
    RGB pixels, row-major (H, W, C), or one encoded image)."""
    return feature.tier.schema(feature.shape)


@functools.lru_cache(maxsize=256)
def hot_camera(feature: VideoFeature) -> VideoFeature:
    """`feature` as its hot pixel segments keep its frames (`app.sources.frame_tiers.HotPixels`, over an encoded
    tier only): `frame_schema(hot_camera(feature))` is the schema of its hot segments."""
    hot = hot_tier(feature.tier)
    if hot is None:
        raise ValueError(f"camera {feature.key!r} keeps {feature.tier} frames, which have no hot layer")
    return replace(feature, tier=hot)


def video_fingerprint(root: DatasetPath, rel: str, feature: VideoFeature) -> SourceFingerprint:
    """A video file's identity (one stat, and the frame count from the container's header)."""
    import av

    path = root / rel
    try:
        stat = path.stat()
        with video_input(path) as opened, av.open(opened) as container:
            frames = int(container.streams.video[0].frames)
    except (OSError, av.error.FFmpegError, IndexError) as exc:
        raise DatasetError(f"video file {rel!r} cannot be read: {exc}") from exc
    if frames <= 0:
        raise DatasetError(f"video file {rel!r} does not record its frame count; it cannot be cached")
    return SourceFingerprint.of(rel, stat, frames, frame_schema(feature))


def iter_frames(root: DatasetPath, rel: str, feature: VideoFeature, batch_bytes: int) -> Iterator[pa.RecordBatch]:
    """Every frame of the file in presentation order, as record batches of about `batch_bytes` (a few frames in
    memory at a time, whatever the length of the video)."""
    import av

    schema = frame_schema(feature)
    per_batch = max(1, batch_bytes // (feature.height * feature.width * feature.channels))
    rgb = RgbConverter(feature, rel)
    shape = (per_batch, feature.height, feature.width, feature.channels)
    times: list[float] = []
    images = np.empty(shape, dtype=np.uint8)
    last = -np.inf
    try:
        with video_input(root / rel) as opened, av.open(opened) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            for frame in container.decode(stream):
                if frame.pts is None:
                    continue
                at = float(Fraction(frame.pts) * stream.time_base)
                if at <= last:
                    raise DatasetError(f"video file {rel!r} has frames out of presentation order at {at:.6f} s")
                last = at
                rgb.convert_into(frame, images[len(times)])
                times.append(at)
                if len(times) == per_batch:
                    yield feature.tier.batch(schema, times, images)
                    times, images = [], np.empty(shape, dtype=np.uint8)  # the batch handed on keeps its pixels
    except (OSError, av.error.FFmpegError) as exc:
        raise DatasetError(f"video file {rel!r} cannot be decoded: {exc}") from exc
    if times:
        yield feature.tier.batch(schema, times, images[: len(times)])


def nearest_rows(pts: np.ndarray, times: np.ndarray) -> np.ndarray:
    """For each of `times`, the position in the ascending `pts` of the nearest one (the earlier on a tie)."""
    right = np.clip(np.searchsorted(pts, times, side="left"), 0, len(pts) - 1)
    left = np.clip(right - 1, 0, len(pts) - 1)
    return np.where(np.abs(times - pts[left]) <= np.abs(pts[right] - times), left, right)


class CameraFiles:
    """Mixed into a source whose `info.videos` are cameras in mp4 files: their files fingerprint and stream like
    data files (a decoded-frame segment per video file, see `frame_schema`), so the segment store caches decoded
    frames exactly as it caches parquet rows."""

    root: DatasetPath
    info: Any

    def camera_of(self, rel: str) -> VideoFeature | None:
        """The camera whose video file `rel` is (None for a data file)."""
        if not rel.endswith(".mp4"):
            return None
        parts = Path(rel).parts
        return next((feature for key, feature in self.info.videos.items() if key in parts), None)

    def fingerprint(self, rel: str) -> tuple[SourceFingerprint, pa.Schema]:
        camera = self.camera_of(rel)
        if camera is None:
            return super().fingerprint(rel)  # type: ignore[misc]
        return video_fingerprint(self.root, rel, camera), frame_schema(camera)

    def read_batches(self, rel: str, schema: pa.Schema, batch_bytes: int, etag: str = "") -> Iterator[pa.RecordBatch]:
        camera = self.camera_of(rel)
        if camera is None:
            return super().read_batches(rel, schema, batch_bytes, etag)  # type: ignore[misc]
        try:  # the camera's tier, or its hot layer (`app.sources.frame_tiers.HotPixels`): the schema says which
            tier = kept_tier(camera.tier, schema, camera.shape)
        except ValueError as exc:
            raise DatasetError(f"decoded frames of {rel!r}: {exc}") from exc
        return iter_frames(self.root, rel, replace(camera, tier=tier), batch_bytes)
