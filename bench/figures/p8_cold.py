"""P8: cold start of a 10 % episode pick: time to the first shuffled batch of 256 samples with an empty cache.

episerve: a server already running on an empty cache directory (nothing indexed, nothing converted); the clock
covers creating `EpisodeDataset(pick)` (its length request) and fetching one random batch, which builds the
index and the segments that batch touches. HF `datasets`: converting the pick (`from_parquet` with the
`episode_index` filter) into an empty cache and reading the same batch, in a fresh process after imports.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.context import Context
from bench.figures.picks import cold_pick, spec
from bench.processes import EpiserveServer
from bench.report import Row
from bench.workers import run_job


def first_batch_seconds(
    ctx: Context,
    root: Path | str,
    name: str,
    ids: list[int],
    batch: list[int],
    scratch: str = "p8-episerve",
    settings: dict[str, str] | None = None,
) -> float:
    """Seconds from a fresh server over `root` with an empty cache to the first batch of the pick `ids`."""
    import episerve

    episode_dataset = episerve.EpisodeDataset  # imports torch now, not on the clock
    cache = ctx.scratch(scratch)
    try:
        with EpiserveServer(root, cache, ctx.logs, workers=2, settings=settings) as server:  # type: ignore[arg-type]
            started = time.perf_counter()
            dataset = episode_dataset(server.url, name, episodes=spec(ids))
            dataset.__getitems__(batch)
            return time.perf_counter() - started
    finally:
        ctx.drop_scratch(scratch)


def hf_load_args(ctx: Context, name: str, ids: list[int], batch: list[int], scratch: str) -> dict[str, Any]:
    """The HF `datasets` job's arguments for loading dataset `name`'s pick `ids` into the empty scratch directory
    `scratch` and reading `batch` of it."""
    return {
        "root": str(ctx.data_root),
        "dataset": name,
        "cache_dir": str(ctx.scratch(scratch)),
        "hf_home": str(ctx.workdir / "hf-home"),
        "episodes": ids,
        "first_batch": batch,
    }


def run(ctx: Context) -> list[Row]:
    rows = []
    for name in ("vector", "image"):
        dataset = ctx.datasets[name]
        ids, batch = cold_pick(dataset.lengths, ctx.scale.p8_fraction, ctx.scale.p3_batch, seed=80)
        ours = first_batch_seconds(ctx, ctx.data_root, name, ids, batch)
        theirs, _ = run_job("hf-load", hf_load_args(ctx, name, ids, batch, "p8-hf"), ctx.logs / "p8.log")
        ctx.drop_scratch("p8-hf")
        rows.append(
            Row(
                "P8",
                f"{name}, {len(ids)} of {dataset.episodes} episodes",
                "s to first batch",
                ours,
                "HF datasets (convert pick + batch)",
                theirs["seconds"],
                "≤ 0.5x",
                ours <= 0.5 * theirs["seconds"],
            )
        )
    return rows
