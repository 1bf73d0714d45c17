"""The real peers' runner, executed by the peers' Python 3.12 interpreter (`bench/peers/real_env.py`), never
imported by the bench itself: it needs lerobot 0.6.1, which episerve's Python 3.11 venv cannot install.

    python real_loader.py convert --root DATASET --out LANCE_COPY
    python real_loader.py samples --peer lerobot|lance --root ROOT [--frames] --indices 3,17 --out FILE.npz
    python real_loader.py measure --peer lerobot|lance --root ROOT [--frames] --samples 3200 [--batch 64 --workers 2]

Peers: `lerobot` is LeRobot 0.6.1's `LeRobotDataset` over the LeRobot v3.0 dataset at ROOT (frames decoded by
torchcodec); `lance` is lerobot-lancedb's `LanceDBDataset` over the Lance copy at ROOT (written by `convert`).
Both return LeRobot's sample dict (the camera frame as float32 in [0, 1], a `HORIZON`-step action window with
`action_is_pad`, the state, the standard columns, `task`); with `--frames` (P9) the frame as uint8 and the row's
columns, no window (`return_uint8=True`, no `delta_timestamps`). `measure` runs a torch DataLoader (batch 64, 2 workers,
shuffled, torch's default collate; Lance with its own multiprocessing context, as its README shows), starts the
clock once the first batch has arrived and prints `{"samples_per_s": ...}` as the last line of stdout. `samples`
writes the samples at the given indices to an npz file, `<index>/<key>` per entry, for the bench's identity check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local dataset: nothing is asked of the Hub

ACTION = "action"
FPS = 30
HORIZON = 50


def _dataset(peer: str, root: Path, frames: bool) -> Any:
    """The peer's dataset: LeRobot's samples, or with `frames` (P9) the frame as uint8 and no action window."""
    options: dict[str, Any] = (
        {"return_uint8": True} if frames else {"delta_timestamps": {ACTION: [k / FPS for k in range(HORIZON)]}}
    )
    if peer == "lerobot":
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        return LeRobotDataset(root.name, root=root, video_backend="torchcodec", **options)
    if peer == "lance":
        from lerobot_lancedb import LanceDBDataset

        return LanceDBDataset(root=root, **options)
    raise ValueError(f"unknown peer {peer!r}")


def _loader_options(peer: str) -> dict[str, Any]:
    if peer == "lance":
        from lerobot_lancedb import lance_mp_context

        return {"multiprocessing_context": lance_mp_context()}
    return {}


def measure(peer: str, root: Path, frames: bool, samples: int, batch: int, workers: int) -> float:
    """Samples/s of a shuffled DataLoader over `samples` samples drawn after the first batch."""
    from torch.utils.data import DataLoader

    dataset = _dataset(peer, root, frames)
    loader = DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers, **_loader_options(peer))
    iterator = iter(loader)
    next(iterator)
    seen, started = 0, time.perf_counter()
    for item in iterator:
        seen += len(item["index"])
        if seen >= samples:
            break
    elapsed = time.perf_counter() - started
    del iterator
    return seen / elapsed


def dump_samples(peer: str, root: Path, frames: bool, indices: list[int], out: Path) -> None:
    """The samples at `indices`, every value as a numpy array, `<index>/<key>` in one npz file."""
    import numpy as np
    import torch

    dataset = _dataset(peer, root, frames)
    arrays: dict[str, Any] = {}
    for index in indices:
        for key, value in dataset[index].items():
            arrays[f"{index}/{key}"] = value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    np.savez(out, **arrays)


def convert(root: Path, out: Path) -> dict[str, float]:
    """lerobot-lancedb's converter from the dataset at `root` to a Lance copy at `out`: seconds and bytes."""
    import contextlib
    import shutil

    from lerobot_lancedb.convert import convert as to_lance

    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):
        to_lance(out, root=root)
    seconds = time.perf_counter() - started
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    return {"seconds": seconds, "bytes": size}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("convert", "samples", "measure"))
    parser.add_argument("--peer", choices=("lerobot", "lance"))
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--frames", action="store_true", help="uint8 frames and no action window (P9)")
    parser.add_argument("--indices", default="")
    parser.add_argument("--samples", type=int, default=0)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    if args.command == "convert":
        result: dict[str, Any] = convert(args.root, args.out)
    elif args.command == "samples":
        dump_samples(args.peer, args.root, args.frames, [int(i) for i in args.indices.split(",")], args.out)
        result = {"written": str(args.out)}
    else:
        result = {"samples_per_s": measure(args.peer, args.root, args.frames, args.samples, args.batch, args.workers)}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
