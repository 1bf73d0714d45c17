"""Camera videos for the demo datasets: frames that carry their own label, encoded the way LeRobot records them.

Every frame shows its episode and frame index as a row of black/white 8x8 cells (the label, see `camera_frames`)
over a colour field that drifts from frame to frame, so a test that decodes a frame can tell exactly which frame it
got, even through a lossy codec. Each episode is encoded on its own with LeRobot's `encode_video_frames` defaults
(SVT-AV1, yuv420p, GOP 2, CRF 30; H.264 where the FFmpeg build has no AV1 encoder), so every episode starts on a key
frame. v3.0 files then hold several episodes back to back, appended by stream copy as LeRobot's
`concatenate_video_files` does; each episode's `[from_timestamp, to_timestamp)` is the file's duration before and
after its append.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np

CELL = 8  # side of one label cell, in pixels; a multiple of the 4:2:0 chroma block, so cells stay crisp
LABEL_BITS = 16  # bits per label field: frame index first, then episode index, each most significant bit first
LABEL_CELLS = 2 * LABEL_BITS
PIX_FMT = "yuv420p"
GOP = 2  # LeRobot's `encode_video_frames(g=2)`: a key frame every other frame, for cheap random access
CRF = 30

# SVT-AV1 logs its whole configuration to stderr for every encoder; keep errors only.
os.environ.setdefault("SVT_LOG", "1")


@dataclass(frozen=True)
class Camera:
    """A video feature of the demo: its key and frame size."""

    key: str
    height: int
    width: int


@dataclass(frozen=True)
class _Encoder:
    name: str  # FFmpeg encoder
    codec: str  # codec name as ffprobe reports it (info.json `video.codec`)
    options: dict[str, str]


def pick_encoder(available: frozenset[str] | set[str] = av.codecs_available) -> _Encoder:
    """AV1 through SVT-AV1 as LeRobot records; H.264 where this FFmpeg build has no AV1 encoder."""
    # One thread per encoder: the demo writer runs several episodes' encoders at once instead. Preset 10 encodes
    # about 1.6x faster than SVT-AV1's default (8); presets 11 and up skip whole 8x8 blocks on these tiny frames in
    # the non-key frames, which would erase label bits.
    if "libsvtav1" in available:
        options = {"g": str(GOP), "crf": str(CRF), "preset": "10", "svtav1-params": "lp=1"}
        return _Encoder("libsvtav1", "av1", options)
    # No B-frames: packets of consecutive episodes then concatenate by stream copy with monotonic timestamps.
    options = {"g": str(GOP), "crf": str(CRF), "bf": "0", "threads": "1"}
    return _Encoder("libx264", "h264", options)


ENCODER = pick_encoder()


def validate_camera(camera: Camera) -> None:
    """Raise ValueError unless `camera` can be encoded (even sides for 4:2:0) and holds the label cells."""
    if "/" in camera.key or not camera.key:
        raise ValueError(f"camera key {camera.key!r} must be non-empty and contain no '/'")
    if camera.height < 2 or camera.width < 2 or camera.height % 2 or camera.width % 2:
        raise ValueError(f"camera {camera.key!r}: height and width must be even and >= 2 (yuv420p)")
    if (camera.height // CELL) * (camera.width // CELL) < LABEL_CELLS:
        raise ValueError(
            f"camera {camera.key!r}: {camera.height}x{camera.width} is too small for the frame label "
            f"({LABEL_CELLS} cells of {CELL}x{CELL} pixels, e.g. 32x64)"
        )


def camera_frames(camera: Camera, episode: int, frame_index: np.ndarray) -> np.ndarray:
    """The frames (N, H, W, 3) uint8 RGB of `episode` at `frame_index`.

    Label: the grid of CELL x CELL cells in raster order (row by row, left to right); cell k < LABEL_BITS is white
    (255) when bit LABEL_BITS-1-k of `frame_index` is set, else black (0); cell LABEL_BITS + k likewise for
    `episode`. Both are taken modulo 2**LABEL_BITS. The rest of the frame is a smooth colour field that moves with
    the frame index and has a different phase in every episode.
    """
    height, width = camera.height, camera.width
    x = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, None, :]
    y = np.linspace(0.0, 1.0, height, dtype=np.float32)[None, :, None]
    phase = (2 * np.pi * frame_index / 45.0 + 0.9 * episode).astype(np.float32)[:, None, None]
    rgb = np.empty((len(frame_index), height, width, 3), dtype=np.float32)
    rgb[..., 0] = np.sin(2 * np.pi * x + phase)
    rgb[..., 1] = np.sin(2 * np.pi * y - 0.7 * phase)
    rgb[..., 2] = np.cos(np.pi * (x + y) + 0.5 * phase)
    frames = (100.0 * rgb + 128.0).astype(np.uint8)
    bits = _label_bits(np.asarray(frame_index), episode)
    columns = width // CELL
    for cell in range(LABEL_CELLS):
        row, column = divmod(cell, columns)
        block = frames[:, row * CELL : (row + 1) * CELL, column * CELL : (column + 1) * CELL]
        block[...] = (255 * bits[:, cell])[:, None, None, None]
    return frames


def _label_bits(frame_index: np.ndarray, episode: int) -> np.ndarray:
    """(N, LABEL_CELLS) uint8 of 0/1: frame index bits, then episode bits, most significant first."""
    shifts = np.arange(LABEL_BITS - 1, -1, -1)
    frame_bits = (frame_index.astype(np.int64)[:, None] >> shifts) & 1
    episode_bits = np.broadcast_to((episode >> shifts) & 1, frame_bits.shape)
    return np.concatenate([frame_bits, episode_bits], axis=1).astype(np.uint8)


def encode_episode(frames: np.ndarray, fps: int) -> bytes:
    """One episode's frames (N, H, W, 3) uint8 RGB as an mp4 starting at t=0, frame i at pts i/fps."""
    _, height, width, _ = frames.shape
    time_base = Fraction(1, fps)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream(ENCODER.name, rate=fps, options=ENCODER.options)
        stream.width, stream.height, stream.pix_fmt = width, height, PIX_FMT
        for i, pixels in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            frame.pts, frame.time_base = i, time_base
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return buffer.getvalue()


class ConcatenatedVideo:
    """One v3.0 video file: episode mp4s appended back to back by stream copy (no re-encode)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._container = av.open(str(path), "w", format="mp4")
        self._stream: Any = None
        self._end = Fraction(0)  # the file's duration so far, in seconds

    def append(self, episode_mp4: bytes) -> tuple[float, float]:
        """Append one episode; return its (from_timestamp, to_timestamp) in seconds within this file."""
        start = self._end
        with av.open(io.BytesIO(episode_mp4), "r") as source:
            source_stream = source.streams.video[0]
            if self._stream is None:
                self._stream = self._container.add_stream_from_template(source_stream, opaque=True)
            time_base = source_stream.time_base
            offset = start / time_base
            if offset.denominator != 1:
                raise ValueError(f"file time {start} s is not a whole number of ticks of {time_base}")
            end = start
            for packet in source.demux(source_stream):
                if packet.dts is None:  # the demuxer's final empty packet
                    continue
                packet.pts += int(offset)
                packet.dts += int(offset)
                end = max(end, (packet.pts + packet.duration) * time_base)
                packet.stream = self._stream
                self._container.mux(packet)
        self._end = end
        return float(start), float(end)

    def close(self) -> None:
        self._container.close()


def video_feature(camera: Camera, fps: int) -> dict[str, Any]:
    """The info.json `features` entry of a camera, with the `info` block LeRobot's `get_video_info` writes."""
    return {
        "dtype": "video",
        "shape": [camera.height, camera.width, 3],
        "names": ["height", "width", "channels"],
        "info": {
            "video.height": camera.height,
            "video.width": camera.width,
            "video.codec": ENCODER.codec,
            "video.pix_fmt": PIX_FMT,
            "video.is_depth_map": False,
            "video.fps": fps,
            "video.channels": 3,
            "has_audio": False,
        },
    }
