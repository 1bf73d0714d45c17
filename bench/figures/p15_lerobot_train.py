"""P15: LeRobot's own `lerobot_train` DataLoader (its sampler, collate, workers) through the one switch
(`episerve.lerobot.use_server`), samples/s, against the same loader on LeRobot's `LeRobotDataset` over the same
files, in one run.

Every loader is built by `bench/lerobot_loader.py` in a process of its own, from lerobot-train's own arguments for
an ACT policy with a 100-step action chunk (`--policy.chunk_size=100`), batch 64, 2 workers, as `lerobot_train`
builds it (shuffled, LeRobot's default collate); the clock starts once the first batch has arrived.

- Parquet images (the demo's synthetic PNGs, 96x96, LeRobot v3.0; no videos): `LeRobotDataset` reading the files
  (LeRobot 0.4.4, `--dataset.root`) against the switch to a server over the same files. Target ≥ 10x.
- One AV1 camera (P9's 224x224 dataset): the switch on demand (`EPISERVE_VIDEO_CACHE_POLICY=on-demand`) and from
  the decoded-frame cache (after `episerve-server warm --videos`). LeRobot 0.4.4 cannot decode video on this
  machine (its `pyav` path calls `torchvision.io.VideoReader`, which torchvision 0.28, the release for torch 2.13,
  no longer has; torchcodec has no build for torch's CPU wheel), so these rows have no peer. The dataset has no
  statistics file: `--dataset.use_imagenet_stats=false`.

Needs LeRobot installed (`make venv` does, see tests/lerobot_env/).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.camera_datasets import ensure_camera_dataset
from bench.context import Context
from bench.figures.p9_camera import warm_seconds
from bench.processes import EpiserveServer
from bench.report import Row
from bench.timing import in_rounds, medians, ratio_spread

REPOSITORY = Path(__file__).resolve().parents[2]  # where `bench` is importable from
KEY = "samples_per_s"
TARGET = 10.0
IMAGE_SIZE = 96
IMAGE_DATASET = "images96"
POLICY = [
    "--policy.type=act",
    "--policy.chunk_size=100",
    "--policy.n_action_steps=100",
    "--policy.push_to_hub=false",
    "--policy.device=cpu",
    "--batch_size=64",
    "--num_workers=2",
]
SAMPLES = {"quick": (1280, 320), "full": (3200, 640)}  # (through the switch, through LeRobotDataset)


def run(ctx: Context) -> list[Row]:
    ours, theirs = SAMPLES[ctx.scale.mode]
    print("# P15 parquet images ...", file=sys.stderr)
    rows = _images(ctx, ours, theirs)
    size = next(c for c in ctx.scale.p9.of("synthetic") if c.height == 224)
    print(f"# P15 {size.name} ...", file=sys.stderr)
    rows += _camera(ctx, size, ours)
    ctx.notes.append(
        "P15: lerobot_train's DataLoader for ACT with a 100-step action chunk, batch 64, 2 workers, shuffled, "
        "LeRobot's default collate (bench/lerobot_loader.py); LeRobot 0.4.4. Target on parquet images ≥ 10x."
    )
    return rows


def _images(ctx: Context, ours: int, theirs: int) -> list[Row]:
    from app.demo import write_demo_dataset

    root = ctx.workdir / "p15-data"
    dataset = root / IMAGE_DATASET
    if not (dataset / "meta/info.json").exists():
        write_demo_dataset(dataset, format="v3.0", episodes=40, seed=15, cameras={}, image_size=IMAGE_SIZE)
    arguments = [f"--dataset.repo_id={IMAGE_DATASET}", *POLICY]
    cache = ctx.scratch("p15-images")
    try:
        with EpiserveServer(root, cache, ctx.logs, workers=2) as server:
            runs = {
                "episerve": ["--samples", str(ours), "--episerve-url", server.url, *arguments],
                "lerobot": ["--samples", str(theirs), *arguments, f"--dataset.root={dataset}"],
            }
            rounds = in_rounds(lambda key: _loader(ctx, runs[key]), list(runs), ctx.scale.rounds)
    finally:
        ctx.drop_scratch("p15-images")
    speed = {key: medians(measured)[KEY] for key, measured in rounds.items()}
    spread = ratio_spread(rounds["episerve"], rounds["lerobot"], KEY)
    return [
        Row(
            "P15",
            f"parquet images {IMAGE_SIZE}x{IMAGE_SIZE}, lerobot_train's loader through the switch",
            "samples/s",
            speed["episerve"],
            "the same loader on LeRobotDataset (0.4.4) over the files",
            speed["lerobot"],
            f"≥ {TARGET:g}x",
            speed["episerve"] >= TARGET * speed["lerobot"],
            "; ".join(filter(None, [f"{ours:,} / {theirs:,} samples", spread])),
        )
    ]


def _camera(ctx: Context, size: object, samples: int) -> list[Row]:
    dataset = ensure_camera_dataset(ctx.workdir / "camera-data", size)  # type: ignore[arg-type]
    cache = ctx.scratch("p15-camera")
    arguments = [f"--dataset.repo_id={dataset.name}", "--dataset.use_imagenet_stats=false", *POLICY]
    try:
        warm_seconds(ctx, dataset, cache)
        settings = {"EPISERVE_VIDEO_CACHE_POLICY": "on-demand"}
        with (
            EpiserveServer(dataset.root, cache, ctx.logs, workers=2, settings=settings) as on_demand,
            EpiserveServer(dataset.root, cache, ctx.logs, workers=2) as cached,
        ):
            runs = {
                key: ["--samples", str(samples), "--episerve-url", url, *arguments]
                for key, url in (("on demand", on_demand.url), ("from the decoded-frame cache", cached.url))
            }
            rounds = in_rounds(lambda key: _loader(ctx, runs[key]), list(runs), ctx.scale.rounds)
    finally:
        ctx.drop_scratch("p15-camera")
    return [
        Row(
            "P15",
            f"{dataset.height}x{dataset.width} AV1 camera, through the switch {key}",
            "samples/s",
            medians(measured)[KEY],
            "none: LeRobot 0.4.4 cannot decode video on this machine",
            None,
            "info",
            None,
            f"{samples:,} samples",
        )
        for key, measured in rounds.items()
    ]


def _loader(ctx: Context, arguments: list[str]) -> dict[str, float]:
    """One timed loader, `python -m bench.lerobot_loader ARGUMENTS` in a process of its own, with no Hub access."""
    home = ctx.scratch("p15-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPISERVE_")}
    env |= {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_LEROBOT_HOME": str(home)}
    command = [sys.executable, "-m", "bench.lerobot_loader", *arguments, f"--output_dir={home / 'outputs'}"]
    with open(ctx.logs / "p15.log", "ab") as log:
        done = subprocess.run(command, cwd=REPOSITORY, env=env, stdout=subprocess.PIPE, stderr=log, check=True)
    return {KEY: float(json.loads(done.stdout.decode().strip().splitlines()[-1])[KEY])}
