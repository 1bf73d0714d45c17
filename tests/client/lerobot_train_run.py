"""Runs LeRobot's own `lerobot_train` in this process and records what it did, for tests/client/test_lerobot_train.py.

    python -m tests.client.lerobot_train_run RECORD.pt lerobot <lerobot-train arguments>
    python -m tests.client.lerobot_train_run RECORD.pt episerve --episerve-url URL <lerobot-train arguments>

`lerobot` runs `lerobot.scripts.lerobot_train.main()` as is; `episerve` runs `python -m episerve.lerobot.train`'s
`main()`. Either way the training script is LeRobot's, unchanged: this only wraps two of its module functions to
watch it, `update_policy` (each step's loss and gradient norm) and `cycle` (every batch the DataLoader gave, the first
as `first_batch`, and the dataset's class and windows). RECORD.pt is written with `torch.save` when training ends.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from lerobot.scripts import lerobot_train

record: dict[str, Any] = {"losses": [], "grad_norms": []}


def _watch_update_policy(original: Any) -> Any:
    def update_policy(*args: Any, **kwargs: Any) -> Any:
        metrics, output = original(*args, **kwargs)
        record["losses"].append(float(metrics.loss.val))
        record["grad_norms"].append(float(metrics.grad_norm.val))
        return metrics, output

    return update_policy


def _watch_cycle(original: Any) -> Any:
    def cycle(dataloader: Any) -> Any:
        dataset = getattr(dataloader, "dataset", None)
        record["dataset_class"] = type(dataset).__name__
        record["delta_timestamps"] = getattr(dataset, "delta_timestamps", None)
        record["sampler"] = _sampler_name(dataloader)
        record["batches"] = []
        for batch in original(dataloader):
            record["batches"].append({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()})
            record["first_batch"] = record["batches"][0]
            yield batch

    return cycle


def _sampler_name(loader: Any) -> str:
    """The class name of the sampler under accelerate's wrappers (`base_dataloader`, `batch_sampler`, ...)."""
    seen: list[Any] = [loader]
    while seen:
        node = seen.pop()
        sampler = getattr(node, "sampler", None)
        if sampler is not None and type(sampler).__name__ not in ("SequentialSampler", "RandomSampler"):
            return type(sampler).__name__
        seen += [getattr(node, name) for name in ("base_dataloader", "batch_sampler") if hasattr(node, name)]
    return type(getattr(loader, "sampler", None)).__name__


def main() -> None:
    out, mode, *arguments = sys.argv[1:]
    lerobot_train.update_policy = _watch_update_policy(lerobot_train.update_policy)
    lerobot_train.cycle = _watch_cycle(lerobot_train.cycle)
    sys.argv = [sys.argv[0], *arguments]
    if mode == "episerve":
        from episerve.lerobot.train import main as train_main
    else:
        train_main = lerobot_train.main
    train_main()
    torch.save(record, out)


if __name__ == "__main__":
    main()
