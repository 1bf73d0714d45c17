"""How long the episode viewer takes to open a long episode: 10,000 frames of 14-dim state and action and two
cameras (LeRobot v3.0, AV1 like the demo's), in headless Chromium against a real server.

    python -m bench.viewer_open [--root DIR] [--frames N] [--joints N] [--repeats N]

Generates (or reuses) the dataset under `--root`, starts a server on a free port, and opens
`ui/#dataset=long&episode=0` in a fresh page `--repeats` times. Reported per open, from the page's own clock
(`episerveViewer.view.timings`, from the moment the episode view starts, and from navigation): `charts`
(description, episode list, the Arrow read of every numeric column, the uPlot charts drawn) and `open` (charts
plus the first frame of both cameras drawn). The first open is cold: nothing is cached by the server, and under
the default `first-touch` video cache policy its first frame request builds the decoded-frame segment of each
camera's whole file. The others are warm. Then the cursor is moved to 20 positions, waiting for each frame to be
drawn: the time from a cursor move to its frames on screen.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from app import demo_video
from app.demo_cameras import TWO_CAMERAS
from bench.processes import EpiserveServer

NAME = "long"
FPS = 30
CHROMIUM = Path("/usr/bin/chromium")
DATA_PATH = "data/chunk-000/file-000.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-000/file-000.parquet"
TASK = "fold the towel"


def ensure_long_episode(root: Path, frames: int, joints: int) -> Path:
    """A LeRobot v3.0 dataset of one episode of `frames` frames, `joints`-dim state and action, two cameras."""
    path = root / NAME
    marker = path / "bench.json"
    wanted = {"frames": frames, "joints": joints, "cameras": dict(TWO_CAMERAS)}
    if marker.is_file() and json.loads(marker.read_text()) == json.loads(json.dumps(wanted)):
        return path
    if path.exists():
        for file in sorted(path.rglob("*"), reverse=True):
            file.unlink() if file.is_file() else file.rmdir()
    _write(path, frames, joints)
    marker.write_text(json.dumps(wanted))
    return path


def _write(path: Path, frames: int, joints: int) -> None:
    frame_index = np.arange(frames, dtype=np.int64)
    cameras = [demo_video.Camera(key, h, w) for key, (h, w) in TWO_CAMERAS.items()]
    with ThreadPoolExecutor(len(cameras)) as pool:
        videos = dict(
            zip(
                (c.key for c in cameras),
                pool.map(
                    lambda c: demo_video.encode_episode(demo_video.camera_frames(c, 0, frame_index), FPS), cameras
                ),
                strict=True,
            )
        )
    episode: dict[str, object] = {
        "episode_index": 0,
        "tasks": [TASK],
        "length": frames,
        "data/chunk_index": 0,
        "data/file_index": 0,
        "dataset_from_index": 0,
        "dataset_to_index": frames,
    }
    for key, mp4 in videos.items():
        video = path / VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=0)
        video.parent.mkdir(parents=True, exist_ok=True)
        video.write_bytes(mp4)
        prefix = f"videos/{key}/"
        episode |= {prefix + "chunk_index": 0, prefix + "file_index": 0, prefix + "from_timestamp": 0.0}
        episode |= {prefix + "to_timestamp": frames / FPS}
    episode |= {"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0}

    seconds = frame_index / FPS
    rng = np.random.default_rng(0)
    state = (rng.uniform(-40, 40, joints) * np.sin(seconds[:, None] * rng.uniform(0.1, 1.0, joints))).astype(np.float32)
    action = np.roll(state, -1, axis=0)
    vector = pa.list_(pa.float32(), joints)
    table = pa.table(
        {
            "observation.state": pa.FixedSizeListArray.from_arrays(pa.array(state.reshape(-1)), joints),
            "action": pa.FixedSizeListArray.from_arrays(pa.array(action.reshape(-1)), joints),
            "timestamp": pa.array(seconds.astype(np.float32)),
            "frame_index": pa.array(frame_index),
            "episode_index": pa.array(np.zeros(frames, dtype=np.int64)),
            "index": pa.array(frame_index),
            "task_index": pa.array(np.zeros(frames, dtype=np.int64)),
        },
        schema=pa.schema(
            [("observation.state", vector), ("action", vector), ("timestamp", pa.float32())]
            + [(name, pa.int64()) for name in ("frame_index", "episode_index", "index", "task_index")]
        ),
    )
    (path / DATA_PATH).parent.mkdir(parents=True)
    pq.write_table(table, path / DATA_PATH)
    (path / EPISODES_PATH).parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([episode]), path / EPISODES_PATH)
    pq.write_table(pa.table({"task_index": pa.array([0], pa.int64()), "task": [TASK]}), path / "meta/tasks.parquet")
    names = [f"joint_{i}" for i in range(joints)]
    features: dict[str, object] = {
        "observation.state": {"dtype": "float32", "shape": [joints], "names": names},
        "action": {"dtype": "float32", "shape": [joints], "names": names},
        **{c.key: demo_video.video_feature(c, FPS) for c in cameras},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        **{n: {"dtype": "int64", "shape": [1], "names": None} for n in ("frame_index", "episode_index", "index")},
        "task_index": {"dtype": "int64", "shape": [1], "names": None},
    }
    info = {
        "codebase_version": "v3.0",
        "robot_type": "bench",
        "total_episodes": 1,
        "total_frames": frames,
        "total_tasks": 1,
        "chunks_size": 1000,
        "fps": FPS,
        "splits": {"train": "0:1"},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": VIDEO_PATH,
        "features": features,
    }
    (path / "meta/info.json").write_text(json.dumps(info, indent=4))


def measure(url: str, repeats: int) -> dict[str, object]:
    """Open the episode `repeats` times in fresh pages, then scrub; times in milliseconds."""
    from playwright.sync_api import sync_playwright

    opens: list[dict[str, float]] = []
    moves: list[float] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            for _ in range(repeats):
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"{url}/ui/#dataset={NAME}&episode=0")
                page.wait_for_function("window.episerveViewer?.view?.timings?.openMs !== undefined", timeout=120_000)
                opens.append(page.evaluate("episerveViewer.view.timings"))
                if viewer_message := page.evaluate("episerveViewer.message"):
                    raise RuntimeError(f"the viewer reported: {viewer_message}")
                page.close()
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{url}/ui/#dataset={NAME}&episode=0")
            page.wait_for_function("window.episerveViewer?.view?.timings?.openMs !== undefined", timeout=120_000)
            length = page.evaluate("episerveViewer.view.length")
            for row in np.random.default_rng(1).integers(1, length, 20).tolist():
                started = time.perf_counter()
                page.evaluate(f"episerveViewer.setCursor({row})")
                page.wait_for_function(f"episerveViewer.view.shownFrame === {row}", timeout=60_000)
                moves.append((time.perf_counter() - started) * 1000)
        finally:
            browser.close()
    return {"opens": opens, "cursor_to_frame_ms": moves}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "episerve-bench-viewer")
    parser.add_argument("--frames", type=int, default=10_000)
    parser.add_argument("--joints", type=int, default=14)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument(
        "--video-cache-policy",
        choices=["first-touch", "on-demand", "warmed"],
        default="first-touch",
        help="the server's EPISERVE_VIDEO_CACHE_POLICY (default: the server's default, first-touch)",
    )
    args = parser.parse_args()
    if not CHROMIUM.exists():
        raise SystemExit(f"{CHROMIUM} not found: install Debian's chromium package")
    started = time.perf_counter()
    ensure_long_episode(args.root / "datasets", args.frames, args.joints)
    elapsed = time.perf_counter() - started
    print(f"video cache policy {args.video_cache_policy}; dataset ready in {elapsed:.1f} s: {args.frames} frames")
    with (
        tempfile.TemporaryDirectory() as cache,
        EpiserveServer(
            args.root / "datasets",
            Path(cache),
            Path(cache),
            workers=2,
            settings={"EPISERVE_VIDEO_CACHE_POLICY": args.video_cache_policy},
        ) as server,
    ):
        result = measure(server.url, args.repeats)
    for i, timings in enumerate(result["opens"]):  # type: ignore[arg-type]
        kind = "cold" if i == 0 else "warm"
        print(
            f"open {i + 1} ({kind}): charts {timings['chartsMs']:.0f} ms (description and episodes "
            f"{timings['describedMs']:.0f} ms, rows {timings['rowsMs']:.0f} ms), charts + first frames "
            f"{timings['openMs']:.0f} ms ({timings['sinceNavigationMs']:.0f} ms since the page began to load)"
        )
    moves = result["cursor_to_frame_ms"]
    print(f"cursor move to frames drawn: median {statistics.median(moves):.0f} ms, max {max(moves):.0f} ms")  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
