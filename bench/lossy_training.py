"""The training cost of a lossy frame tier, measured: LeRobot's own `lerobot_train`, through the switch, on the same
camera dataset from exact frames (`raw`) and from each JPEG setting P16 measures, with the same seeds.

    python -m bench.lossy_training [--steps 300] [--size 224] [--seeds 1000] [--workdir DIR]

The dataset makes the frames matter: P16's photo scene (a pan and zoom over photographs with sensor noise, AV1 as
LeRobot records it), whose `action` is the camera's view (zoom, top, left: `bench.camera_datasets.photo_view`) at
the next frame, and whose `observation.state` is Gaussian noise, so a policy can only predict its actions by
reading the frames. It is generated once (10 episodes of 120-160 frames) and reused; every fifth episode is held
out of training.

For each setting, one server cache is built with `episerve-server warm DATASET --videos` under
`EPISERVE_VIDEO_FRAME_TIER` (once, reused), and a tiny ACT (no pretrained weights) is trained by LeRobot's
`lerobot_train` (`bench/lerobot_train_losses.py`, which records each step's loss) against a server on that cache:
the training episodes only (`--dataset.episodes`), batch 8, 2 DataLoader workers, CPU (one torch thread), seed
1000 (`--seeds 1000,1001`: once per seed), LeRobot's defaults otherwise (ImageNet camera statistics), but for the
learning rate (1e-4, see `TINY_ACT`). The runs of one seed read the same samples in the same order; only the pixels
differ.

Then each trained policy (its saved checkpoint and processors) is evaluated on the held-out episodes, read from the
exact (raw) server whatever it was trained on, with `torch.no_grad`, in LeRobot's order, batch 8:

- the held-out loss: ACT's training loss (L1 + 10 KL) in training mode (the VAE encoder samples a latent from
  the true actions, dropout on), from torch seed 0 for every setting;
- the held-out L1 at inference: the predicted action chunk (latent zero, no dropout, as deployed) against the true
  one, normalised by the dataset's statistics like the loss; beside it, the L1 of predicting the statistics' mean.

Prints a Markdown table, a row per run (disk ÷ the MP4s, the server's PSNR against the exact frames, the mean
training loss over the last 50 steps, the held-out losses and their ratio to the raw run of the same seed) and
each run's mean training loss per 50 steps, and writes every step's loss to a CSV.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.camera_datasets import CAMERA, CameraDataset, Signals, ensure_camera_dataset, photo_view
from bench.config import CameraSize
from bench.figures.p16_frame_tiers import warm_tier
from bench.processes import REPO, EpiserveServer

SETTINGS = ("raw", "jpeg", "jpeg:95:420")  # exact frames, the JPEG default (quality 92, 4:4:4), P16's other setting
STEPS = 300
BATCH = 8
WORKERS = 2
SEED = 1000  # lerobot_train's --seed (its default), the same for every setting
EVAL_SEED = 0
LAST_STEPS = 50  # the training loss is averaged over these last steps
EPISODES = 10
HELD_OUT_EVERY = 5  # episodes 4 and 9 are held out
# One torch thread for training and evaluation: on a shared 2-core machine two threads wait on each other in every
# parallel region (a tiny ACT step at 96x96 took 3-13 s with two threads against 0.6 s with one).
TORCH_THREADS = 1
TINY_ACT = [
    "--policy.type=act",
    "--policy.pretrained_backbone_weights=null",  # no download: a randomly initialised ResNet-18
    "--policy.dim_model=32",
    "--policy.dim_feedforward=64",
    "--policy.n_heads=2",
    "--policy.n_encoder_layers=1",
    "--policy.n_decoder_layers=1",
    "--policy.latent_dim=8",
    "--policy.chunk_size=10",
    "--policy.n_action_steps=10",
    # ACT's default, 1e-5, is meant for a pretrained backbone: in 20-step trials its loss did not fall, and a policy
    # that has not learned to read the frames cannot tell the tiers apart.
    "--policy.optimizer_lr=1e-4",
    "--policy.optimizer_lr_backbone=1e-4",
]


def _next_views(size: CameraSize, episode: int, first: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """The state is noise; the action of row k is the view of the scene's next frame."""
    action = np.array([photo_view(first + k + 1) for k in range(length)], dtype=np.float32)
    state = np.random.default_rng([size.seed, 41, episode]).standard_normal((length, 3), dtype=np.float32)
    return state, action


NEXT_VIEWS = Signals("next views", ("noise_0", "noise_1", "noise_2"), ("zoom", "top", "left"), _next_views, stats=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.lossy_training", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS, help=f"training steps per setting (default {STEPS})")
    parser.add_argument("--size", type=int, default=224, help="frame height and width (default 224)")
    parser.add_argument(
        "--seeds",
        default=str(SEED),
        help=f"lerobot_train's --seed, comma-separated: every setting is trained once per seed (default {SEED})",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "episerve-bench" / "lossy-training",
        help="dataset, caches, runs and logs (default: <tmp>/episerve-bench/lossy-training)",
    )
    args = parser.parse_args(argv)
    seeds = [int(seed) for seed in args.seeds.split(",")]
    workdir: Path = args.workdir.resolve()
    load_before, started = os.getloadavg()[0], time.monotonic()
    size = CameraSize(f"views{args.size}", args.size, args.size, EPISODES, 120, 160, seed=41, content="photo")
    print(f"# dataset {size.name} ...", file=sys.stderr)
    dataset = ensure_camera_dataset(workdir / "camera-data", size, NEXT_VIEWS)
    held_out = [e for e in range(dataset.episodes) if e % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
    train = [e for e in range(dataset.episodes) if e not in held_out]
    logs = workdir / "logs"
    caches = {setting: workdir / "frame-tiers" / dataset.name / setting.replace(":", "-") for setting in SETTINGS}
    disk, psnr = {}, {}
    for setting, cache in caches.items():
        print(f"# warm {setting} ...", file=sys.stderr)
        disk[setting] = warm_tier(dataset, cache, setting, logs / "warm.log") / dataset.video_bytes
    runs = workdir / "runs" / f"{dataset.name}-{args.steps}"
    trained: dict[tuple[str, int], dict[str, Any]] = {}
    for setting, cache in caches.items():
        with EpiserveServer(dataset.root, cache, logs, 1, {"EPISERVE_VIDEO_FRAME_TIER": setting}) as server:
            psnr[setting] = _psnr(server.url, dataset.name)
            for seed in seeds:
                print(f"# train on {setting}, seed {seed} ...", file=sys.stderr)
                out = runs / f"{setting.replace(':', '-')}-seed{seed}"
                trained[setting, seed] = _train(server.url, dataset, train, args.steps, seed, out)
    print("# held-out episodes from the exact frames ...", file=sys.stderr)
    with EpiserveServer(dataset.root, caches["raw"], logs, 1, {"EPISERVE_VIDEO_FRAME_TIER": "raw"}) as server:
        for run in trained.values():
            run |= _held_out(server.url, dataset.name, held_out, run["checkpoint"])
    curves = runs / "losses.csv"
    _write_curves(curves, trained)
    minutes = (time.monotonic() - started) / 60
    training = ", ".join(f"{run['seconds'] / 60:.1f}" for run in trained.values())
    print(
        f"{dataset.height}x{dataset.width}, {dataset.episodes} episodes ({dataset.rows:,} frames): trained on "
        f"episodes {train}, held out {held_out}; {args.steps} steps, batch {BATCH}, {WORKERS} workers, seeds "
        f"{args.seeds}, evaluation seed {EVAL_SEED}; {minutes:.1f} minutes, load average {load_before:.1f} before "
        f"and {os.getloadavg()[0]:.1f} after; training runs {training} minutes; per-step losses in {curves}\n"
    )
    print(_table(trained, disk, psnr))
    print()
    print(_curve_table(trained))


def _psnr(url: str, name: str) -> float | None:
    """The server's PSNR of the camera's frames against the exact ones (None for the exact tier)."""
    described = httpx.get(f"{url}/datasets/{name}", timeout=300).raise_for_status().json()
    camera = next(column for column in described["columns"] if column["name"] == CAMERA)
    return camera["frames"].get("psnr_db")


def _train(url: str, dataset: CameraDataset, episodes: list[int], steps: int, seed: int, out: Path) -> dict[str, Any]:
    """One lerobot_train run through the switch against `url`, in a process of its own with no Hub access:
    {"losses": one per step, "seconds": its wall time, "checkpoint": the saved policy}."""
    shutil.rmtree(out, ignore_errors=True)  # lerobot_train refuses an existing output directory
    out.mkdir(parents=True)
    record = out / "losses.json"
    arguments = [
        f"--dataset.repo_id={dataset.name}",
        f"--dataset.episodes={json.dumps(episodes)}",
        "--policy.device=cpu",
        "--policy.push_to_hub=false",
        f"--batch_size={BATCH}",
        f"--steps={steps}",
        f"--num_workers={WORKERS}",
        f"--log_freq={max(steps // 10, 1)}",
        f"--seed={seed}",
        f"--output_dir={out / 'train'}",
        *TINY_ACT,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPISERVE_")}
    env |= {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_LEROBOT_HOME": str(out / "hf-lerobot")}
    env["OMP_NUM_THREADS"] = str(TORCH_THREADS)
    command = [sys.executable, "-m", "bench.lerobot_train_losses", str(record), "--episerve-url", url, *arguments]
    with open(out / "train.log", "ab") as log:
        subprocess.run(command, cwd=REPO, env=env, stdout=log, stderr=log, check=True)
    return json.loads(record.read_text()) | {"checkpoint": out / "train/checkpoints/last/pretrained_model"}


def _held_out(url: str, name: str, episodes: list[int], checkpoint: Path) -> dict[str, float]:
    """The trained policy at `checkpoint` on `episodes` of the server at `url`, in LeRobot's order, batch `BATCH`:
    the mean training-mode loss (seed `EVAL_SEED`), the mean inference L1 and the mean predictor's L1, per sample."""
    import torch
    from lerobot.datasets.factory import resolve_delta_timestamps
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.factory import make_pre_post_processors
    from torch.utils.data import DataLoader

    from episerve.lerobot import RemoteLeRobotDataset, RemoteLeRobotDatasetMetadata

    torch.set_num_threads(TORCH_THREADS)
    policy = ACTPolicy.from_pretrained(checkpoint)
    preprocessor, _ = make_pre_post_processors(policy.config, pretrained_path=str(checkpoint))
    windows = resolve_delta_timestamps(policy.config, RemoteLeRobotDatasetMetadata(url, name))
    samples = RemoteLeRobotDataset(url, name, episodes=episodes, delta_timestamps=windows)
    totals = {"held_out_loss": 0.0, "held_out_l1": 0.0, "mean_l1": 0.0}
    count = 0
    torch.manual_seed(EVAL_SEED)
    with torch.no_grad():
        for batch in DataLoader(samples, batch_size=BATCH, shuffle=False, num_workers=0):
            batch = preprocessor(batch)
            real = ~batch["action_is_pad"].unsqueeze(-1)
            policy.train()  # ACT's training loss: a latent sampled from the true actions, dropout on
            loss, _ = policy.forward(batch)
            predicted = policy.predict_action_chunk(batch)  # sets eval mode: latent zero, no dropout
            n = len(batch["action"])
            totals["held_out_loss"] += float(loss) * n
            totals["held_out_l1"] += float(((batch["action"] - predicted).abs() * real).mean()) * n
            totals["mean_l1"] += float((batch["action"].abs() * real).mean()) * n
            count += n
    return {key: value / count for key, value in totals.items()}


def _write_curves(path: Path, trained: dict[tuple[str, int], dict[str, Any]]) -> None:
    """Every run's loss per step, a column per run (`raw seed 1000`, ...)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["step", *(f"{setting} seed {seed}" for setting, seed in trained)])
        for step, losses in enumerate(zip(*(run["losses"] for run in trained.values()), strict=True), start=1):
            writer.writerow([step, *(f"{loss:.6g}" for loss in losses)])


def _table(
    trained: dict[tuple[str, int], dict[str, Any]], disk: dict[str, float], psnr: dict[str, float | None]
) -> str:
    """One row per run; the ratios are to the raw run of the same seed."""
    lines = [
        "| setting | seed | disk ÷ MP4 | PSNR vs exact | train loss, last 50 steps | held-out loss | ÷ raw "
        "| held-out L1, inference | ÷ raw |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (setting, seed), run in sorted(trained.items(), key=lambda item: item[0][1]):
        raw = trained["raw", seed]
        quality = "exact" if psnr[setting] is None else f"{psnr[setting]:.1f} dB"
        last = float(np.mean(run["losses"][-LAST_STEPS:]))
        lines.append(
            f"| `{setting}` | {seed} | {disk[setting]:.1f}x | {quality} | {last:.4f} | {run['held_out_loss']:.4f} "
            f"| {run['held_out_loss'] / raw['held_out_loss']:.3f} | {run['held_out_l1']:.4f} "
            f"| {run['held_out_l1'] / raw['held_out_l1']:.3f} |"
        )
    mean_l1 = next(iter(trained.values()))["mean_l1"]
    lines.append(f"\nPredicting the statistics' mean (zero, normalised): held-out L1 {mean_l1:.4f}.")
    return "\n".join(lines)


def _curve_table(trained: dict[tuple[str, int], dict[str, Any]]) -> str:
    """The training loss curves in short: each run's mean loss over every `LAST_STEPS` steps."""
    steps = min(len(run["losses"]) for run in trained.values())
    windows = [(start, min(start + LAST_STEPS, steps)) for start in range(0, steps, LAST_STEPS)]
    lines = [
        "| setting | seed | " + " | ".join(f"steps {start + 1}-{end}" for start, end in windows) + " |",
        "|---|---:|" + "---:|" * len(windows),
    ]
    for (setting, seed), run in sorted(trained.items(), key=lambda item: item[0][1]):
        means = (float(np.mean(run["losses"][start:end])) for start, end in windows)
        lines.append(f"| `{setting}` | {seed} | " + " | ".join(f"{mean:.3f}" for mean in means) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
