"""LeRobot `lerobot_train`'s own DataLoader, timed: samples/s of the loader the training script builds.

    python -m bench.lerobot_loader --samples N [--episerve-url URL] <lerobot-train arguments>

The configuration is parsed from lerobot-train's own arguments (`TrainPipelineConfig`, e.g. `--dataset.repo_id=ID
--dataset.root=DIR --policy.type=act --policy.chunk_size=100 --batch_size=64 --num_workers=2`), the dataset is
LeRobot's `make_dataset(cfg)` (through `episerve.lerobot.use_server(URL)` with `--episerve-url`), and the DataLoader
is built with the arguments `lerobot_train.train` gives it (its `EpisodeAwareSampler` for policies with
`drop_n_last_frames`, else shuffle; no pinned memory on the CPU; prefetch factor 2). Accelerate's wrapper, which
only moves batches to the device, is left out. The clock starts once the first batch has arrived (worker start-up
excluded) and stops after N more samples; one JSON line is printed: `{"samples_per_s": ..., "samples": ...}`.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from episerve.lerobot.train import split_arguments


def build_loader(arguments: list[str]) -> tuple[Any, Any]:
    """(the DataLoader as lerobot_train builds it, its TrainPipelineConfig) for lerobot-train `arguments`."""
    import draccus
    import torch
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.datasets.factory import make_dataset
    from lerobot.datasets.sampler import EpisodeAwareSampler
    from lerobot.scripts import lerobot_train  # registers the policy types, as running the script does

    lerobot_train.register_third_party_plugins()

    cfg = draccus.parse(TrainPipelineConfig, args=arguments)
    cfg.validate()
    dataset = make_dataset(cfg)
    if hasattr(cfg.policy, "drop_n_last_frames"):
        shuffle, sampler = (
            False,
            EpisodeAwareSampler(
                dataset.meta.episodes["dataset_from_index"],
                dataset.meta.episodes["dataset_to_index"],
                episode_indices_to_use=dataset.episodes,
                drop_n_last_frames=cfg.policy.drop_n_last_frames,
                shuffle=True,
            ),
        )
    else:
        shuffle, sampler = True, None
    loader = torch.utils.data.DataLoader(
        dataset,
        num_workers=cfg.num_workers,
        batch_size=cfg.batch_size,
        shuffle=shuffle and not cfg.dataset.streaming,
        sampler=sampler,
        pin_memory=False,
        drop_last=False,
        prefetch_factor=2 if cfg.num_workers > 0 else None,
    )
    return loader, cfg


def samples_per_second(loader: Any, samples: int) -> float:
    """Samples/s over `samples` samples after the first batch, cycling through epochs as lerobot_train does."""
    batches = _cycle(loader)
    next(batches)
    drawn, started = 0, time.perf_counter()
    while drawn < samples:
        drawn += len(next(batches)["index"])
    return drawn / (time.perf_counter() - started)


def _cycle(loader: Any) -> Any:
    while True:
        yield from loader


def main(argv: list[str] | None = None) -> None:
    arguments = list(sys.argv[1:] if argv is None else argv)
    samples = int(arguments.pop(arguments.index("--samples") + 1))
    arguments.remove("--samples")
    ours, rest = split_arguments(arguments)
    if "url" in ours:
        from episerve.lerobot import use_server

        use_server(ours["url"], ours.get("token"))
    loader, _ = build_loader(rest)
    print(json.dumps({"samples_per_s": samples_per_second(loader, samples), "samples": samples}))


if __name__ == "__main__":
    main()
