"""P9's decoding peers, with PyAV (FFmpeg's dav1d for AV1), the decoder the server uses.

- `LeRobotStyleFrames`: LeRobot 0.4.4's per-sample camera path (`LeRobotDataset.__getitem__` →
  `_query_videos` → `decode_video_frames` with the pyav backend): per sample, open the episode's video file, seek
  to the keyframe at or before the frame's time, decode forward converting every frame to RGB until one is at or
  past that time, keep the nearest, check `tolerance_s`, close the file. It returns uint8 (C, H, W) like
  episerve (LeRobot then also converts to float32 in [0, 1], which this peer skips), and looks up each row's
  episode and timestamp in arrays loaded once (LeRobot reads them from its HF dataset per sample): both make the
  peer faster than LeRobot, not slower.
- `decode_ceiling`: the raw decoder ceiling, every frame of the files decoded sequentially and converted to RGB,
  in 1 or more processes that each take a contiguous share of the frames.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from bench.camera_datasets import CAMERA, VIDEO_PATH, CameraDataset
from bench.datasets import EPISODES_PATH, FPS

TOLERANCE_S = 1e-4


def row_locations(dataset: CameraDataset) -> tuple[list[str], np.ndarray, np.ndarray]:
    """For every row: (video files, each row's file number, each row's time in its file)."""
    prefix = f"videos/{CAMERA}/"
    episodes = pq.read_table(dataset.path / EPISODES_PATH).to_pylist()
    files = [
        VIDEO_PATH.format(video_key=CAMERA, chunk_index=e[prefix + "chunk_index"], file_index=e[prefix + "file_index"])
        for e in episodes
    ]
    names = sorted(set(files))
    data = pq.read_table(sorted((dataset.path / "data").rglob("*.parquet"))[0], columns=["episode_index", "timestamp"])
    episode = data["episode_index"].to_numpy()
    file_of_episode = np.array([names.index(f) for f in files])
    from_s = np.array([e[prefix + "from_timestamp"] for e in episodes])
    return names, file_of_episode[episode], from_s[episode] + data["timestamp"].to_numpy().astype(np.float64)


class LeRobotStyleFrames:
    """Map-style dataset: `[i]` is `{camera: uint8 (C, H, W) tensor, "index": i}`, decoded per sample."""

    def __init__(self, dataset: CameraDataset) -> None:
        self.root = dataset.path
        self.files, self.file_of_row, self.time_of_row = row_locations(dataset)

    def __len__(self) -> int:
        return len(self.time_of_row)

    def __getitem__(self, index: int) -> dict[str, Any]:
        import torch

        pixels = decode_one(self.root / self.files[self.file_of_row[index]], float(self.time_of_row[index]))
        return {CAMERA: torch.from_numpy(pixels).permute(2, 0, 1), "index": torch.tensor(index)}


def decode_one(path: Path, at: float) -> np.ndarray:
    """The frame of `path` nearest to `at` seconds, as LeRobot's pyav backend finds it: uint8 (H, W, 3)."""
    import av

    loaded: list[tuple[float, np.ndarray]] = []
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        container.seek(int(at / stream.time_base), stream=stream, backward=True, any_frame=False)
        for frame in container.decode(stream):
            current = float(Fraction(frame.pts) * stream.time_base)
            loaded.append((current, frame.to_ndarray(format="rgb24")))  # every frame, as torchvision's reader does
            if current >= at:
                break
    distance, pixels = min(((abs(t - at), p) for t, p in loaded), key=lambda pair: pair[0])
    if distance > TOLERANCE_S:
        raise ValueError(f"no frame of {path} within {TOLERANCE_S} s of {at:.6f} s (nearest {distance:.6f} s away)")
    return pixels


def ceiling_shares(dataset: CameraDataset, processes: int) -> list[list[tuple[str, float, float]]]:
    """Every frame of the dataset's videos split into `processes` contiguous shares of (file, from s, to s)."""
    files, file_of_row, _ = row_locations(dataset)
    frames_per_file = np.bincount(file_of_row, minlength=len(files))
    bounds = np.linspace(0, len(file_of_row), processes + 1).round().astype(int)
    firsts = np.concatenate([[0], np.cumsum(frames_per_file)])
    shares = []
    for low, high in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        share = []
        for number, path in enumerate(files):
            start, stop = max(low, firsts[number]) - firsts[number], min(high, firsts[number + 1]) - firsts[number]
            if start < stop:  # frame k of a file is at k / fps (episodes are appended back to back)
                share.append((str(dataset.path / path), (start - 0.5) / FPS, (stop - 0.5) / FPS))
        shares.append(share)
    return shares


def decode_share(share: list[tuple[str, float, float]]) -> int:
    """Decode and convert to RGB every frame whose time lies in each [from, to) of `share`; frames decoded."""
    import av

    count = 0
    for path, start, stop in share:
        with av.open(path) as container:
            stream = container.streams.video[0]
            # Single-threaded, as the server's decoders (EPISERVE_VIDEO_DECODE_THREADS=1): two single-threaded
            # processes decode 551-563 frames/s of camera480 here against 485-523 with FFmpeg's frame threads.
            stream.codec_context.thread_count = 1
            if start > 0:
                container.seek(int(start / stream.time_base), stream=stream, backward=True, any_frame=False)
            for frame in container.decode(stream):
                at = float(Fraction(frame.pts) * stream.time_base)
                if at >= stop:
                    break
                if at >= start:
                    frame.to_ndarray(format="rgb24")
                    count += 1
    return count


def decode_ceiling(dataset: CameraDataset, processes: int) -> float:
    """Frames/s decoding every frame of the dataset sequentially in `processes` fresh processes (each its own
    contiguous share); the clock runs from the moment all are ready (imports done) until the last one finishes."""
    from bench.processes import _clean_env, app_dir

    children = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.peers.camera_decode", json.dumps(share)],
            cwd=app_dir(),
            env=_clean_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for share in ceiling_shares(dataset, processes)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            if child.stdout.readline().strip() != "ready":
                raise RuntimeError("a decode ceiling process failed to start")
        started = time.perf_counter()
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        decoded = sum(int(child.stdout.readline()) for child in children if child.stdout is not None)
        elapsed = time.perf_counter() - started
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
            child.wait()
    if decoded != dataset.rows:
        raise RuntimeError(f"the ceiling decoded {decoded} frames of {dataset.name}; it has {dataset.rows}")
    return decoded / elapsed


def main() -> None:
    """One ceiling process: `python -m bench.peers.camera_decode SHARE_JSON`; prints `ready`, waits for a line,
    decodes its share and prints the number of frames."""
    import av  # noqa: F401  (imported before `ready`, so the import is not timed)

    share = [tuple(part) for part in json.loads(sys.argv[1])]
    print("ready", flush=True)
    sys.stdin.readline()
    print(decode_share(share), flush=True)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
