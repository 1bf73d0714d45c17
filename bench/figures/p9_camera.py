"""P9: camera frames (AV1, GOP 2, as LeRobot records) through a torch DataLoader, frames/s, against LeRobot's
per-sample decode path, the raw decoder ceiling and a local memory-mapped copy of the decoded frames, all in one
run; and the server's anonymous memory while every frame is streamed.

Per camera dataset (synthetic, photo and ALOHA content, each at 480x640 and 224x224, see `bench/camera_datasets.py`;
each row names its dataset's content and size), every loader is a DataLoader with batch
64 and 2 workers reading the camera and `index`, shuffled:

- (a) `EpisodeDataset` against a server with `EPISERVE_VIDEO_CACHE_POLICY=on-demand` (frames decoded per request);
- (b) `EpisodeDataset` against a server with `first-touch` after `episerve-server warm DATASET --videos` (frames
  read from the decoded-frame segments), over HTTP, and on the same machine with `cache_dir` (the client reads the
  frames from the segment files by reference, `episerve._local_frames`);
- (c) `EpisodeIterableDataset(shuffle=True, chunk_rows=128, batch_size=64)` on demand;
- (d) the LeRobot-style per-sample path (`bench/peers/camera_decode.py`), torch's default collate;
- (e) the ceiling: every frame decoded sequentially with PyAV and converted to RGB, in 1 and in 2 processes;
- (f) the decoded frames in a local IPC file, memory-mapped (`bench/peers/frame_mmap.py`), the reference for (b)
  on the same machine (across machines there is no local map to compare with: over HTTP is shown for information);
- (h) the real peers, for information: LeRobot 0.6.1's `LeRobotDataset` and Lance's `LanceDBDataset` (on a copy
  converted by lerobot-lancedb) with `return_uint8=True` and no action window (the frame and the row's columns),
  each in the same DataLoader settings with torch's default collate, run in their own Python 3.12 venv (see
  `bench/figures/real_peers.py`); skipped with the reason when that venv cannot be built;
- (g) RssAnon growth of a fresh server (summed over its processes) while one client streams every frame in
  64-frame pages: on demand, and first-touch from an empty cache (the segment is built inside the first request).

The loaders' clock starts once the first batch has arrived (worker start-up excluded). Loaders and ceilings run
`Scale.rounds` times, interleaved; the table shows medians. Before measuring, a few frames are checked to be
equal, pixel for pixel, through every path (the real peers' too).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from bench.camera_datasets import CAMERA, CameraDataset
from bench.config import CameraSize
from bench.context import Context
from bench.figures import real_peers
from bench.figures.camera_sets import rows_per_dataset
from bench.figures.p3_loader import samples_per_second
from bench.memory import RssSampler
from bench.peers.camera_decode import LeRobotStyleFrames, decode_ceiling
from bench.peers.frame_mmap import MmapFrames, write_frames
from bench.peers.mmap_loader import identity
from bench.peers.real import LABELS as REAL
from bench.peers.real import RealPeers
from bench.processes import EpiserveServer, _clean_env, app_dir
from bench.report import Row
from bench.timing import Figures, in_rounds, medians, ratio_spread

BATCH = 64
WORKERS = 2
CHUNK_ROWS = 128  # EpisodeIterableDataset chunk: 118 MB of 480x640 frames per request
PAGE_ROWS = 64  # (g): frames per streamed page
COLUMNS = [CAMERA, "index"]
MB = 1e6
FPS_KEY = "frames_per_s"
CEILINGS = {"sequential 1": 1, "sequential 2": 2}


def run(ctx: Context) -> list[Row]:
    peers = real_peers.peers(ctx)
    rows = rows_per_dataset(ctx, "P9", ctx.scale.p9.datasets, partial(_camera, ctx, peers=peers))
    ctx.notes.append(
        "P9: the 2-process decode ceiling is the one the targets use: this machine has 2 cores, which the "
        "DataLoader's 2 workers, the server's 2 workers and the main process share in the loader rows."
    )
    return rows


def _camera(ctx: Context, size: CameraSize, dataset: CameraDataset, peers: RealPeers | str) -> list[Row]:
    frames_file = write_frames(dataset, _frames_path(ctx, size))
    _describe(ctx, dataset, frames_file)
    memory = {policy: _stream_memory(ctx, dataset, policy) for policy in ("on-demand", "first-touch")}
    cache = ctx.scratch(f"p9-{size.name}")
    try:
        warm_s = warm_seconds(ctx, dataset, cache)
        settings = {"EPISERVE_VIDEO_CACHE_POLICY": "on-demand"}
        with (
            EpiserveServer(dataset.root, cache, ctx.logs, workers=2, settings=settings) as on_demand,
            EpiserveServer(dataset.root, cache, ctx.logs, workers=2) as cached,
        ):
            loaders = _loaders(dataset, frames_file, on_demand.url, cached.url, cache)
            picked, reference = _check_same_frames(dataset, loaders)
            peers, real = real_peers.ready(
                dataset, peers, partial(real_peers.check_same_frames, dataset, reference, picked=picked)
            )
            _touch(frames_file)
            samples = min(ctx.scale.p9.samples, dataset.rows - 2 * BATCH)
            peer_samples = min(ctx.scale.p9.peer_samples, samples)
            measure = partial(_measure, dataset, loaders, peers, samples, peer_samples)
            rounds = in_rounds(measure, [*loaders, *CEILINGS, *real], ctx.scale.rounds)
    finally:
        ctx.drop_scratch(f"p9-{size.name}")
    speed = {key: medians(measured)[FPS_KEY] for key, measured in rounds.items()}
    case = size.label
    return [
        *_loader_rows(case, speed, rounds, samples, peer_samples),
        Row(
            "P9",
            f"{case}, `warm --videos` (decode once, {dataset.rows:,} frames)",
            "frames/s",
            dataset.rows / warm_s,
            "sequential decode, 1 process",
            speed["sequential 1"],
            "info",
            note="CLI run, process start-up included",
        ),
        *_memory_rows(case, dataset, memory),
        *_real_rows(case, speed, rounds, samples, peers, real),
    ]


def _real_rows(
    case: str,
    speed: dict[str, float],
    rounds: dict[str, list[Figures]],
    samples: int,
    peers: RealPeers | str,
    real: list[str],
) -> list[Row]:
    """(h): on demand and from the cache on the same machine against each real peer; or why they were skipped."""
    if not isinstance(peers, RealPeers):
        return [real_peers.skipped_row("P9", case, "frames/s", peers)]
    ours = [("on demand", "EpisodeDataset on demand"), ("in place", IN_PLACE)]
    spreads = {(o, p): ratio_spread(rounds[o], rounds[p], FPS_KEY) for o, _ in ours for p in real}
    return real_peers.frame_rows(case, ours, speed, spreads, f"{samples:,} frames each")


OVER_HTTP = "EpisodeDataset from the decoded-frame cache over HTTP"
IN_PLACE = "EpisodeDataset from the decoded-frame cache, same machine (`cache_dir`)"
# (our loader, its label, peer key, peer label, target factor or None for info)
COMPARISONS = [
    ("on demand", "EpisodeDataset on demand", "lerobot", "LeRobot-style per-sample decode", 2.0),
    ("on demand", "EpisodeDataset on demand", "sequential 2", "sequential decode ceiling, 2 processes", 0.5),
    ("on demand", "EpisodeDataset on demand", "sequential 1", "sequential decode, 1 process", None),
    ("in place", IN_PLACE, "mmap", "local mmap of the decoded frames", 0.8),
    ("in place", IN_PLACE, "lerobot", "LeRobot-style per-sample decode", None),
    ("cache", OVER_HTTP, "mmap", "local mmap of the decoded frames", None),
    ("iterable", "EpisodeIterableDataset on demand", "sequential 2", "sequential decode ceiling, 2 processes", 0.7),
]


def _loader_rows(
    case: str, speed: dict[str, float], rounds: dict[str, list[Figures]], samples: int, peer_samples: int
) -> list[Row]:
    rows = []
    for ours, label, peer, peer_label, factor in COMPARISONS:
        spread = ratio_spread(rounds[ours], rounds[peer], FPS_KEY) if factor or peer == "mmap" else ""
        drawn = f"{samples:,} frames" if peer != "lerobot" else f"{samples:,} / {peer_samples:,} frames"
        rows.append(
            Row(
                "P9",
                f"{case}, {label}",
                "frames/s",
                speed[ours],
                peer_label,
                speed[peer],
                f"≥ {factor}x" if factor else "info",
                speed[ours] >= factor * speed[peer] if factor else None,
                "; ".join(filter(None, [drawn, spread])),
            )
        )
    return rows


def _memory_rows(case: str, dataset: CameraDataset, memory: dict[str, RssSampler]) -> list[Row]:
    page_mb = PAGE_ROWS * dataset.frame_bytes / MB
    rows = []
    for policy, sampler in memory.items():
        what = "on demand" if policy == "on-demand" else "first-touch from an empty cache, build included"
        rows.append(
            Row(
                "P9",
                f"{case}, all {dataset.rows:,} frames streamed in {PAGE_ROWS}-frame pages, {what}",
                "RssAnon growth MB",
                sampler.growth / MB,
                "-",
                None,
                "< 200 MB",
                sampler.growth < 200 * MB,
                f"{page_mb:.0f} MB a page; server baseline {sampler.baseline / MB:.0f} MB",
            )
        )
    return rows


def _loaders(
    dataset: CameraDataset, frames_file: Path, on_demand: str, cached: str, cache: Path
) -> dict[str, Iterable[Any]]:
    from torch.utils.data import DataLoader

    import episerve

    common: dict[str, Any] = {"num_workers": WORKERS, "persistent_workers": False}
    shuffled: dict[str, Any] = {"batch_size": BATCH, "shuffle": True, **common}
    iterable = episerve.EpisodeIterableDataset(
        on_demand, dataset.name, columns=COLUMNS, chunk_rows=CHUNK_ROWS, batch_size=BATCH, shuffle=True
    )
    return {
        "on demand": DataLoader(
            episerve.EpisodeDataset(on_demand, dataset.name, columns=COLUMNS), collate_fn=episerve.collate, **shuffled
        ),
        "cache": DataLoader(
            episerve.EpisodeDataset(cached, dataset.name, columns=COLUMNS), collate_fn=episerve.collate, **shuffled
        ),
        "in place": DataLoader(
            episerve.EpisodeDataset(cached, dataset.name, columns=COLUMNS, cache_dir=cache),
            collate_fn=episerve.collate,
            **shuffled,
        ),
        "iterable": DataLoader(iterable, batch_size=None, **common),
        "lerobot": DataLoader(LeRobotStyleFrames(dataset), **shuffled),
        "mmap": DataLoader(MmapFrames(frames_file, dataset.height, dataset.width), collate_fn=identity, **shuffled),
    }


def _measure(
    dataset: CameraDataset,
    loaders: dict[str, Iterable[Any]],
    peers: RealPeers | str,
    samples: int,
    peer_samples: int,
    key: str,
) -> Figures:
    if key in REAL:
        assert isinstance(peers, RealPeers)
        return {FPS_KEY: peers.measured_or_nan(key, dataset, samples, BATCH, WORKERS, frames=True)}
    if key in CEILINGS:
        return {FPS_KEY: decode_ceiling(dataset, CEILINGS[key])}
    drawn = peer_samples if key == "lerobot" else samples
    return {FPS_KEY: samples_per_second(loaders[key], drawn, BATCH)}


def _check_same_frames(dataset: CameraDataset, loaders: dict[str, Any]) -> tuple[list[int], Any]:
    """A few rows' frames, read through every path, are equal pixel for pixel (else the figures compare
    different work). Returns the rows checked and their reference frames."""
    import torch

    picked = np.random.default_rng(90).choice(dataset.rows, size=6, replace=False).tolist()
    reference = loaders["mmap"].dataset.__getitems__(picked)[CAMERA]
    for key in ("on demand", "cache", "in place"):
        frames = loaders[key].dataset.__getitems__(picked).data[CAMERA]
        if not torch.equal(frames, reference):
            raise RuntimeError(f"P9 {dataset.name}: episerve ({key}) frames differ from the decoded-frame file")
    peer = torch.stack([loaders["lerobot"].dataset[i][CAMERA] for i in picked])
    if not torch.equal(peer, reference):
        raise RuntimeError(f"P9 {dataset.name}: the LeRobot-style frames differ from the decoded-frame file")
    return picked, reference


def _stream_memory(ctx: Context, dataset: CameraDataset, policy: str) -> RssSampler:
    """RssAnon of a fresh server on an empty cache while one client streams every frame once."""
    import episerve

    cache = ctx.scratch("p9-memory")
    try:
        settings = {"EPISERVE_VIDEO_CACHE_POLICY": policy}
        with EpiserveServer(dataset.root, cache, ctx.logs, workers=2, settings=settings) as server:
            client = episerve.Client(server.url)
            try:
                client.rows(dataset.name, start=0, stop=1, columns=["index"])  # the index, not a frame
                with RssSampler(server.pid) as sampler:
                    for start in range(0, dataset.rows, PAGE_ROWS):
                        page = client.rows(dataset.name, start=start, stop=start + PAGE_ROWS, columns=[CAMERA])
                        assert page.num_rows == min(PAGE_ROWS, dataset.rows - start)
            finally:
                client.close()
        return sampler
    finally:
        ctx.drop_scratch("p9-memory")


def warm_seconds(ctx: Context, dataset: CameraDataset, cache: Path) -> float:
    """Seconds `episerve-server warm DATASET --videos` takes on an empty cache."""
    command = [sys.executable, "-m", "app.cli", "warm", dataset.name, "--videos"]
    command += ["--root", str(dataset.root), "--cache-dir", str(cache)]
    started = time.perf_counter()
    with open(ctx.logs / "p9-warm.log", "ab") as log:
        subprocess.run(command, cwd=app_dir(), env=_clean_env(), stdout=log, stderr=log, check=True)
    return time.perf_counter() - started


def _frames_path(ctx: Context, size: CameraSize) -> Path:
    digest = hashlib.sha256(json.dumps(asdict(size), sort_keys=True).encode()).hexdigest()[:12]
    return ctx.workdir / "camera-frames" / f"{size.name}-{digest}.arrow"


def _touch(path: Path, chunk: int = 16 * 1024 * 1024) -> None:
    """Read a file once so that it is in the page cache, as the just-built decoded-frame segments are."""
    with open(path, "rb", buffering=0) as file:
        while file.read(chunk):
            pass


def _describe(ctx: Context, dataset: CameraDataset, frames_file: Path) -> None:
    video_mb = dataset.video_bytes / MB
    ctx.notes.append(
        f"P9 `{dataset.name}`: {dataset.height}x{dataset.width} {dataset.codec} GOP 2, {dataset.episodes} episodes, "
        f"{dataset.rows:,} frames at 30 fps in {len(dataset.videos)} mp4 file(s) of {video_mb:,.0f} MB "
        f"({dataset.video_bytes / dataset.rows / 1e3:.0f} KB a frame); decoded {dataset.frame_bytes / MB:.2f} MB a "
        f"frame, {frames_file.stat().st_size / 1e9:.1f} GB for the local copy and as much for the cache."
    )
