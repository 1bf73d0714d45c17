"""P12: a weighted mixture of three camera datasets through a torch DataLoader, samples/s, against the same loader
over one of its datasets alone.

Three LeRobot v3.0 demo datasets (`app.demo`; 150 episodes each in full mode, 15 in quick), one AV1 camera
each, of different robots: 6 joints at 30 fps with a
96x128 `observation.images.top`, 9 joints at 15 fps with a 120x160 `observation.images.cam_high`, 14 joints at
10 fps with a 72x96 `observation.images.front`, weights 3 : 2 : 1, the two other cameras renamed to
`observation.images.top`. One server (2 workers) with `EPISERVE_VIDEO_CACHE_SIZE=224x224` after
`episerve-server warm DATASET --videos` for each: every frame comes from the decoded-frame cache at 224x224.
Batch 64, 2 workers, reading the camera and `index`:

- map-style: `MixtureDataset` with its `sampler(64)`, against `EpisodeDataset` over the first dataset with a
  shuffled batch sampler;
- iterable: `MixtureIterableDataset(batch_size=64, chunk_rows=128)`, against `EpisodeIterableDataset(shuffle=True,
  chunk_rows=128, batch_size=64)` over the first dataset: both read 128 rows (two batches) per request, the
  mixture's from its globally shuffled plan, the one dataset's a contiguous chunk shuffled within.

The clock starts once the first batch has arrived and runs for 9,600 samples in full mode (960 in quick); every
loader runs `Scale.rounds` times (at least 7 in full mode), interleaved; medians.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

from bench.context import Context
from bench.figures.p3_loader import samples_per_second
from bench.processes import EpiserveServer, _clean_env, app_dir
from bench.report import Row
from bench.timing import Figures, in_rounds, medians, ratio_spread

BATCH = 64
CHUNK = 128  # rows an iterable loader reads per request
WORKERS = 2
TOP = "observation.images.top"
COLUMNS = [TOP, "index"]
SIZE = {"EPISERVE_VIDEO_CACHE_SIZE": "224x224"}
# name: (joints, fps, camera key, (height, width), weight)
ROBOTS = {
    "robot-a": (6, 30, TOP, (96, 128), 3),
    "robot-b": (9, 15, "observation.images.cam_high", (120, 160), 2),
    "robot-c": (14, 10, "observation.images.front", (72, 96), 1),
}
KEY = "samples_per_s"
ROUNDS = 7  # in full mode: a measurement is well under a second, so medians need more of them


# The mixture ÷ one dataset targets: a map-style batch is one request whatever its datasets, so it is held higher.
TARGETS = {"map-style": 0.95, "iterable": 0.9}


def run(ctx: Context) -> list[Row]:
    episodes, samples = (150, 9600) if ctx.scale.mode == "full" else (15, 960)
    root = _datasets(ctx.workdir / f"p12-data-{episodes}", episodes)
    cache = ctx.scratch("p12-cache")
    for name in ROBOTS:
        _warm(ctx, root, cache, name)
    with EpiserveServer(root, cache, ctx.logs, workers=2, settings=SIZE) as server:
        loaders = _loaders(server.url)
        rounds = max(ctx.scale.rounds, ROUNDS) if ctx.scale.mode == "full" else ctx.scale.rounds
        measured = in_rounds(partial(_speed, loaders, samples), list(loaders), rounds)
    rows = []
    for style in ("map-style", "iterable"):
        ours, peer = measured[f"{style} mixture"], measured[f"{style} one dataset"]
        note = ", ".join(filter(None, [f"{samples:,} samples", ratio_spread(ours, peer, KEY)]))
        mixture, alone = medians(ours)[KEY], medians(peer)[KEY]
        rows.append(
            Row(
                "P12",
                f"3-dataset mixture, 224x224 from the cache, {style}",
                "samples/s",
                mixture,
                "the same loader over robot-a alone",
                alone,
                f"≥ {TARGETS[style]}x",
                mixture >= TARGETS[style] * alone,
                note,
            )
        )
    return rows


def _datasets(root: Path, episodes: int) -> Path:
    from app.demo import write_demo_dataset

    for seed, (name, (joints, fps, camera, size, _)) in enumerate(ROBOTS.items()):
        marker = root / name / "meta/info.json"
        if marker.exists():
            continue
        write_demo_dataset(root / name, episodes=episodes, seed=seed, joints=joints, fps=fps, cameras={camera: size})
    return root


def _warm(ctx: Context, root: Path, cache: Path, name: str) -> None:
    command = [
        sys.executable,
        "-m",
        "app.cli",
        "warm",
        name,
        "--videos",
        "--root",
        str(root),
        "--cache-dir",
        str(cache),
    ]
    with open(ctx.logs / "p12-warm.log", "ab") as log:
        subprocess.run(command, cwd=app_dir(), env=_clean_env(SIZE), stdout=log, stderr=log, check=True)


def _mixture() -> Any:
    import episerve

    return episerve.Mixture(
        [
            {"dataset": name, "weight": weight, **({"features": {camera: TOP}} if camera != TOP else {})}
            for name, (_, _, camera, _, weight) in ROBOTS.items()
        ]
    )


def _loaders(url: str) -> dict[str, Any]:
    """Factories of each loader (made afresh per measurement, so every one starts its own workers)."""
    from torch.utils.data import DataLoader

    import episerve

    def map_mixture() -> Iterable[Any]:
        dataset = episerve.MixtureDataset(url, _mixture(), COLUMNS)
        return DataLoader(
            dataset, batch_sampler=dataset.sampler(BATCH), collate_fn=episerve.collate, num_workers=WORKERS
        )

    def map_one() -> Iterable[Any]:
        dataset = episerve.EpisodeDataset(url, "robot-a", columns=COLUMNS)
        return DataLoader(dataset, BATCH, shuffle=True, collate_fn=episerve.collate, num_workers=WORKERS)

    def iterable_mixture() -> Iterable[Any]:
        dataset = episerve.MixtureIterableDataset(url, _mixture(), COLUMNS, batch_size=BATCH, chunk_rows=CHUNK)
        return DataLoader(dataset, batch_size=None, num_workers=WORKERS)

    def iterable_one() -> Iterable[Any]:
        dataset = episerve.EpisodeIterableDataset(
            url, "robot-a", columns=COLUMNS, shuffle=True, chunk_rows=CHUNK, batch_size=BATCH
        )
        return DataLoader(dataset, batch_size=None, num_workers=WORKERS)

    return {
        "map-style mixture": map_mixture,
        "map-style one dataset": map_one,
        "iterable mixture": iterable_mixture,
        "iterable one dataset": iterable_one,
    }


def _speed(loaders: dict[str, Any], samples: int, key: str) -> Figures:
    return {KEY: samples_per_second(loaders[key](), samples, BATCH)}
