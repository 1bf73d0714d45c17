"""P3: a torch DataLoader end to end (batch 256, 2 workers, shuffle), samples/s over a fixed number of samples.

Loaders: `episerve.EpisodeDataset` (map-style, one take per batch, `episerve.collate`), the same on the server's
machine with `cache_dir=` (each take answered with where its rows lie, which the workers gather from the segment
files themselves: rows by reference), `episerve.EpisodeIterableDataset` (shuffled chunks, batched in the
dataset), HF `datasets` in torch format (its own
`__getitems__` plus the default collate), and the local mmap ceiling (one batch-grouped take per batch, handed
to the main process as one block like episerve's batches; for reference also with torch's default
per-tensor hand-off). The clock starts once the first batch has arrived (worker start-up excluded) and stops at
the last one. Every loader runs `Scale.rounds` times, interleaved; the table shows medians and, in the target
rows' notes, the range of the per-round ratios.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from functools import partial
from typing import Any

from bench.context import Context
from bench.peers import hf
from bench.peers.mmap_loader import MmapBatchDataset, identity
from bench.report import Row
from bench.timing import Figures, in_rounds, medians, ratio_spread

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


def _speed(loader: Iterable[Any], *, samples: int, batch: int) -> Figures:
    return {"samples_per_s": samples_per_second(loader, samples, batch)}


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
    by_reference = episerve.EpisodeDataset(url, name, cache_dir=ctx.cache_dir)
    iterable = episerve.EpisodeIterableDataset(url, name, batch_size=batch, shuffle=True)
    hf_torch = hf.load(ctx.datasets[name], ctx.hf_cache).with_format("torch")
    local = MmapBatchDataset(ctx.ipc[name], one_block=True)
    local_per_tensor = MmapBatchDataset(ctx.ipc[name], one_block=False)
    common = {"num_workers": WORKERS, "persistent_workers": False}
    return {
        "episerve": DataLoader(mapped, batch_size=batch, shuffle=True, collate_fn=episerve.collate, **common),
        "episerve by reference": DataLoader(
            by_reference, batch_size=batch, shuffle=True, collate_fn=episerve.collate, **common
        ),
        "episerve iterable": DataLoader(iterable, batch_size=None, **common),
        "hf": DataLoader(hf_torch, batch_size=batch, shuffle=True, **common),
        "mmap": DataLoader(local, batch_size=batch, shuffle=True, collate_fn=identity, **common),
        "mmap per tensor": DataLoader(local_per_tensor, batch_size=batch, shuffle=True, collate_fn=identity, **common),
    }


BY_REFERENCE = "EpisodeDataset by reference (cache_dir=)"
LOADERS = {
    "EpisodeDataset": "episerve",
    BY_REFERENCE: "episerve by reference",
    "EpisodeIterableDataset": "episerve iterable",
}
OVER_HTTP = ("EpisodeDataset", "EpisodeIterableDataset")
# (peer label, loader key, {which of our loaders it is compared with: target factor, or None for an info row})
COMPARISONS: list[tuple[str, str, dict[str, float | None]]] = [
    ("HF datasets (torch format)", "hf", dict.fromkeys(OVER_HTTP, 1.5)),
    ("local mmap batched ceiling", "mmap", {**dict.fromkeys(OVER_HTTP, 0.8), BY_REFERENCE: 1.0}),
    ("local mmap, torch's per-tensor hand-off", "mmap per tensor", {"EpisodeDataset": None}),
]


def run(ctx: Context) -> list[Row]:
    rows: list[Row] = []
    batch = ctx.scale.p3_batch
    for name in ("vector", "image"):
        samples = min(ctx.scale.p3_samples[name], ctx.datasets[name].rows - 2 * batch)
        loaders = _loaders(ctx, name)
        by_loader = in_rounds(partial(_speed, samples=samples, batch=batch), list(loaders.values()), ctx.scale.rounds)
        rounds = {kind: by_loader[loader] for kind, loader in loaders.items()}
        speed = {kind: medians(measured)["samples_per_s"] for kind, measured in rounds.items()}
        case = f"{name}, {samples:,} samples"
        for peer, peer_kind, ours_compared in COMPARISONS:
            for label, factor in ours_compared.items():
                ours = LOADERS[label]
                spread = ratio_spread(rounds[ours], rounds[peer_kind], "samples_per_s") if factor else ""
                rows.append(
                    Row(
                        "P3",
                        case,
                        "samples/s",
                        speed[ours],
                        peer,
                        speed[peer_kind],
                        f"≥ {factor}x" if factor else "info",
                        speed[ours] >= factor * speed[peer_kind] if factor else None,
                        "; ".join(filter(None, [label, spread])),
                    )
                )
    return rows
