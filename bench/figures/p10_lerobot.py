"""P10: `RemoteLeRobotDataset` (LeRobotDataset's samples from the server) through a torch DataLoader, samples/s,
against LeRobot's per-sample path over the same files, in one run.

On P9's camera datasets (one AV1 camera, GOP 2; synthetic, photo and ALOHA content, each at 480x640 and 224x224;
see `bench/camera_datasets.py`; each row names its dataset's content and size), every
loader is a DataLoader with batch 64, 2 workers and shuffle, over samples holding the camera frame (float32 in
[0, 1]), a 50-step action window with its `action_is_pad`, the state, the standard columns and `task`:

- (a) `RemoteLeRobotDataset` with `collate_fn=RemoteLeRobotDataset.collate` against a server with
  `EPISERVE_VIDEO_CACHE_POLICY=on-demand` (frames decoded per request);
- (b) the same against a `first-touch` server after `episerve-server warm DATASET --videos` (frames read from the
  decoded-frame segments);
- (b') the same on the same machine with `cache_dir` (the frames read by reference from the segment files);
- (c) the LeRobot-style per-sample path (`bench/peers/lerobot_camera.py`: one decoder open, seek and float
  conversion per sample), torch's default collate;
- (d) the real peers, in their own Python 3.12 venv (`bench/peers/real_env.py`, built on first use): LeRobot
  0.6.1's `LeRobotDataset` (torchcodec) over the same files, and Lance's `LanceDBDataset` over a copy converted
  by lerobot-lancedb 0.3.1, each a DataLoader with the same settings, one subprocess per measurement
  (`bench/peers/real_loader.py`); rows skipped with the reason when their environment cannot be built. A disk
  row sets the Lance copy beside episerve's cache.

The clock starts once the first batch has arrived (worker start-up excluded); the loaders run `Scale.rounds`
times, interleaved, and the table shows medians. Before measuring, a few samples are checked to be equal, key by
key, through every path (the real peers: every key but `task` bit-identical, see `bench/figures/real_peers.py`).
The sample counts are P9's; the real peers draw as many as episerve's loaders.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from bench.camera_datasets import CameraDataset
from bench.config import CameraSize
from bench.context import Context
from bench.datasets import ACTION, FPS
from bench.figures import real_peers
from bench.figures.camera_sets import rows_per_dataset
from bench.figures.p3_loader import samples_per_second
from bench.figures.p9_camera import warm_seconds
from bench.peers.lerobot_camera import LeRobotStyleCameraSamples
from bench.peers.real import LABELS as REAL
from bench.peers.real import RealPeers, directory_bytes
from bench.processes import EpiserveServer
from bench.report import Row
from bench.timing import Figures, in_rounds, medians, ratio_spread

BATCH = 64
WORKERS = 2
HORIZON = 50
DELTA_TIMESTAMPS = {ACTION: [k / FPS for k in range(HORIZON)]}
KEY = "samples_per_s"
TARGETS = {"on demand": 2.0, "cache": 5.0}  # at 480x640; 224x224 is stated for information
LABELS = {
    "on demand": "RemoteLeRobotDataset on demand",
    "cache": "RemoteLeRobotDataset from the decoded-frame cache",
}


def run(ctx: Context) -> list[Row]:
    peers = real_peers.peers(ctx)
    rows = rows_per_dataset(ctx, "P10", ctx.scale.p9.datasets, partial(_camera, ctx, peers=peers))
    ctx.notes.append(
        f"P10: samples of one camera frame (float32), a {HORIZON}-step action window with its padding mask, the "
        "state, the standard columns and `task`, as LeRobotDataset returns them; DataLoader batch 64, 2 workers, "
        "shuffled. Targets at 480x640 (≥ 2x on demand, ≥ 5x from the cache); 224x224 for information."
    )
    return rows


def _camera(ctx: Context, size: CameraSize, dataset: CameraDataset, peers: RealPeers | str) -> list[Row]:
    case = size.label
    cache = ctx.scratch(f"p10-{size.name}")
    real: list[str] = []
    try:
        warm_seconds(ctx, dataset, cache)
        cache_bytes = directory_bytes(cache)
        settings = {"EPISERVE_VIDEO_CACHE_POLICY": "on-demand"}
        with (
            EpiserveServer(dataset.root, cache, ctx.logs, workers=2, settings=settings) as on_demand,
            EpiserveServer(dataset.root, cache, ctx.logs, workers=2) as cached,
        ):
            loaders = _loaders(dataset, on_demand.url, cached.url, cache)
            picked = _check_same_samples(dataset, loaders)
            peers, real = real_peers.ready(
                dataset, peers, partial(_check_real_samples, ctx, dataset, loaders["cache"].dataset, picked)
            )
            samples = min(ctx.scale.p9.samples, dataset.rows - 2 * BATCH)
            peer_samples = min(ctx.scale.p9.peer_samples, samples)
            measure = partial(_measure, dataset, loaders, peers, samples, peer_samples)
            rounds = in_rounds(measure, [*loaders, *real], ctx.scale.rounds)
    finally:
        ctx.drop_scratch(f"p10-{size.name}")
    speed = {key: medians(measured)[KEY] for key, measured in rounds.items()}
    rows = _target_rows(case, dataset, speed, rounds, samples, peer_samples)
    if not isinstance(peers, RealPeers):
        return [*rows, real_peers.skipped_row("P10", case, "samples/s", peers)]
    spreads = {(o, p): ratio_spread(rounds[o], rounds[p], KEY) for o, _ in real_peers.OURS for p in real}
    lance_bytes = directory_bytes(peers.lance_copy(dataset))
    ctx.notes.append(real_peers.summary(case, speed))
    return [
        *rows,
        *real_peers.comparison_rows(case, speed, spreads, f"{samples:,} samples each"),
        real_peers.disk_row(case, dataset, lance_bytes, cache_bytes),
    ]


def _check_real_samples(ctx: Context, dataset: CameraDataset, ours: Any, picked: list[int], peers: RealPeers) -> None:
    ctx.notes.append(f"P10 {dataset.name}: {real_peers.check_same_samples(dataset, ours, peers, picked)}.")


def _target_rows(
    case: str,
    dataset: CameraDataset,
    speed: dict[str, float],
    rounds: dict[str, list[Figures]],
    samples: int,
    peer_samples: int,
) -> list[Row]:
    targeted = (dataset.height, dataset.width) == (480, 640)
    rows = []
    for ours, label in LABELS.items():
        factor = TARGETS[ours]
        rows.append(
            Row(
                "P10",
                f"{case}, {label}",
                "samples/s",
                speed[ours],
                "LeRobot-style per-sample decode + float conversion",
                speed["lerobot"],
                f"≥ {factor}x" if targeted else "info",
                speed[ours] >= factor * speed["lerobot"] if targeted else None,
                "; ".join(
                    filter(
                        None,
                        [f"{samples:,} / {peer_samples:,} samples", ratio_spread(rounds[ours], rounds["lerobot"], KEY)],
                    )
                ),
            )
        )
    return rows


def _loaders(dataset: CameraDataset, on_demand: str, cached: str, cache: Path) -> dict[str, Iterable[Any]]:
    from torch.utils.data import DataLoader

    from episerve.lerobot import RemoteLeRobotDataset

    shuffled: dict[str, Any] = {"batch_size": BATCH, "shuffle": True, "num_workers": WORKERS}
    remote = {
        key: RemoteLeRobotDataset(url, dataset.name, delta_timestamps=DELTA_TIMESTAMPS, cache_dir=cache_dir)
        for key, url, cache_dir in (
            ("on demand", on_demand, None),
            ("cache", cached, None),
            ("in place", cached, cache),
        )
    }
    return {
        **{key: DataLoader(ds, collate_fn=RemoteLeRobotDataset.collate, **shuffled) for key, ds in remote.items()},
        "lerobot": DataLoader(LeRobotStyleCameraSamples(dataset, DELTA_TIMESTAMPS), **shuffled),
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
        return {KEY: peers.measured_or_nan(key, dataset, samples, BATCH, WORKERS)}
    return {KEY: samples_per_second(loaders[key], peer_samples if key == "lerobot" else samples, BATCH)}


def _check_same_samples(dataset: CameraDataset, loaders: dict[str, Any]) -> list[int]:
    """A few samples are equal, key by key, through every episerve path and the LeRobot-style one (else the
    figures compare different work). Returns the indices checked."""
    import torch

    picked = np.random.default_rng(100).choice(dataset.rows, size=4, replace=False).tolist()
    peer = loaders["lerobot"].dataset
    for key in ("on demand", "cache", "in place"):
        ours = loaders[key].dataset
        for index in picked:
            mine, theirs = ours[index], peer[index]
            same = list(mine) == list(theirs) and all(
                mine[k] == v if isinstance(v, str) else (mine[k].dtype == v.dtype and torch.equal(mine[k], v))
                for k, v in theirs.items()
            )
            if not same:
                raise RuntimeError(f"P10 {dataset.name}: sample {index} differs between {key} and the LeRobot path")
    return picked
