"""P3: a torch DataLoader end to end (batch 256, 2 workers, shuffle), samples/s over a fixed number of samples.

Loaders: `episerve.EpisodeDataset` (map-style, one take per batch, `episerve.collate`), `episerve.
EpisodeIterableDataset` (shuffled chunks, batched in the dataset), HF `datasets` in torch format (its own
`__getitems__` plus the default collate), and the local mmap ceiling (one batch-grouped take per batch, handed
to the main process as one block like episerve's batches; for reference also with torch's default
per-tensor hand-off). The clock starts once the first batch has arrived (worker start-up excluded) and stops at
the last one.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from bench.context import Context
from bench.peers import hf
from bench.peers.mmap_loader import MmapBatchDataset, identity
from bench.report import Row

WORKERS = 2


def samples_per_second(loader: Iterable[Any], samples: int, batch: int) -> float:
    """Draw batches until `samples` were seen after the first batch; samples/s over that span."""
    iterator = iter(loader)
    next(iterator)
    seen, started = 0, time.perf_counter()
    for item in iterator:
        seen += _batch_len(item, batch)
        if seen >= samples:
            break
    elapsed = time.perf_counter() - started
    del iterator  # shuts the workers down
    return seen / elapsed


def _batch_len(item: Any, default: int) -> int:
    if isinstance(item, dict):
        for value in item.values():
            if hasattr(value, "__len__"):
                return len(value)
    return default


def _loaders(ctx: Context, name: str) -> dict[str, Iterable[Any]]:
    from torch.utils.data import DataLoader

    import episerve

    assert ctx.server is not None
    batch = ctx.scale.p3_batch
    url = ctx.server.url
    mapped = episerve.EpisodeDataset(url, name)
    iterable = episerve.EpisodeIterableDataset(url, name, batch_size=batch, shuffle=True)
    hf_torch = hf.load(ctx.datasets[name], ctx.hf_cache).with_format("torch")
    local = MmapBatchDataset(ctx.ipc[name], one_block=True)
    local_per_tensor = MmapBatchDataset(ctx.ipc[name], one_block=False)
    common = {"num_workers": WORKERS, "persistent_workers": False}
    return {
        "episerve": DataLoader(mapped, batch_size=batch, shuffle=True, collate_fn=episerve.collate, **common),
        "episerve iterable": DataLoader(iterable, batch_size=None, **common),
        "hf": DataLoader(hf_torch, batch_size=batch, shuffle=True, **common),
        "mmap": DataLoader(local, batch_size=batch, shuffle=True, collate_fn=identity, **common),
        "mmap per tensor": DataLoader(local_per_tensor, batch_size=batch, shuffle=True, collate_fn=identity, **common),
    }


def run(ctx: Context) -> list[Row]:
    rows: list[Row] = []
    batch = ctx.scale.p3_batch
    for name in ("vector", "image"):
        samples = min(ctx.scale.p3_samples[name], ctx.datasets[name].rows - 2 * batch)
        speeds = {kind: samples_per_second(loader, samples, batch) for kind, loader in _loaders(ctx, name).items()}
        case = f"{name}, {samples:,} samples"
        ours, it = speeds["episerve"], speeds["episerve iterable"]
        rows += [
            Row(
                "P3",
                case,
                "samples/s",
                ours,
                "HF datasets (torch format)",
                speeds["hf"],
                "≥ 1.5x",
                ours >= 1.5 * speeds["hf"],
                "EpisodeDataset",
            ),
            Row(
                "P3",
                case,
                "samples/s",
                ours,
                "local mmap batched ceiling",
                speeds["mmap"],
                "≥ 0.8x",
                ours >= 0.8 * speeds["mmap"],
                "EpisodeDataset",
            ),
            Row(
                "P3",
                case,
                "samples/s",
                it,
                "HF datasets (torch format)",
                speeds["hf"],
                "≥ 1.5x",
                it >= 1.5 * speeds["hf"],
                "EpisodeIterableDataset",
            ),
            Row(
                "P3",
                case,
                "samples/s",
                it,
                "local mmap batched ceiling",
                speeds["mmap"],
                "≥ 0.8x",
                it >= 0.8 * speeds["mmap"],
                "EpisodeIterableDataset",
            ),
            Row(
                "P3",
                case,
                "samples/s",
                ours,
                "local mmap, torch's per-tensor hand-off",
                speeds["mmap per tensor"],
                "info",
                None,
                "EpisodeDataset",
            ),
        ]
    return rows
