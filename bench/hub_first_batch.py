"""P17's two timed jobs, each run in a fresh process by `bench.workers`: a cold episode pick of a Hub dataset through
its first shuffled DataLoader batch, read from an episerve server (`episerve`) or downloaded by LeRobot's own
`LeRobotDataset` (`lerobot`).

Each job points `huggingface_hub` at the Hub given (`HF_ENDPOINT`) with an empty `HF_HOME` and the Hub reachable,
imports what it needs before the clock, and on `go` times the dataset's construction and `next(iter(loader))`:
batch 64, shuffled by a seeded generator, no loader workers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

BATCH = 64


def use_hub(args: dict[str, Any]) -> None:
    """Point `huggingface_hub` (and LeRobot) at the Hub `args["endpoint"]` with an empty `args["hf_home"]`, online;
    call before either is imported."""
    for name in ("HF_LEROBOT_HOME", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.pop(name, None)
    os.environ |= {"HF_ENDPOINT": args["endpoint"], "HF_HOME": args["hf_home"], "HF_HUB_DISABLE_TELEMETRY": "1"}
    os.environ |= {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}


def _first_batch(loader: Any) -> int:
    """Rows in the loader's first batch."""
    batch = next(iter(loader))
    return len(batch["index"])


def episerve_job(args: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """`RemoteLeRobotDataset(url, repo, episodes=pick)` and its first batch (`RemoteLeRobotDataset.collate`); the
    server answers 503 with the progress while it downloads, which the client waits out on the clock."""
    import torch

    from episerve.lerobot import RemoteLeRobotDataset

    def run() -> dict[str, Any]:
        started = time.perf_counter()
        dataset = RemoteLeRobotDataset(args["url"], args["repo_id"], episodes=args["episodes"])
        generator = torch.Generator().manual_seed(args["seed"])
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=BATCH, shuffle=True, generator=generator, collate_fn=RemoteLeRobotDataset.collate
        )
        rows = _first_batch(loader)
        return {"seconds": time.perf_counter() - started, "rows": rows, "samples": len(dataset)}

    return run


def lerobot_job(args: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """LeRobot's `LeRobotDataset(repo, episodes=pick)` downloading into the empty `HF_HOME` (its version check, the
    metadata, the data files holding the pick, their conversion by HF `datasets`) and its first batch."""
    use_hub(args)
    import torch
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    def run() -> dict[str, Any]:
        started = time.perf_counter()
        dataset = LeRobotDataset(args["repo_id"], episodes=args["episodes"])
        generator = torch.Generator().manual_seed(args["seed"])
        loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, generator=generator)
        rows = _first_batch(loader)
        return {"seconds": time.perf_counter() - started, "rows": rows, "samples": len(dataset)}

    return run
