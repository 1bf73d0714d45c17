"""P6: building the cache from cold, in source MB/s (parquet bytes ÷ seconds) and peak anonymous memory.

episerve: every segment of the dataset built by the server's own code in a fresh process (as `episerve-server
warm` does), into an empty cache. HF `datasets`: `Dataset.from_parquet` of the same files into an empty cache.
Both in subprocesses whose RssAnon is sampled every 10 ms; peak growth is over the idle, imported process. Dirty
pages are flushed (`sync`) before each run, and the two sides alternate twice (episerve, HF, episerve, HF) with
the faster run of each reported and the higher memory peak: on this machine the first large write after other
work runs at half speed whichever side it is, so a single run in a fixed order favours the second.
"""

from __future__ import annotations

import os

from bench.context import Context
from bench.memory import RssSampler
from bench.report import Row
from bench.workers import run_job

MB = 1e6
ROUNDS = 2


def _build(ctx: Context, job: str, name: str) -> tuple[dict, RssSampler]:
    """One side's build of dataset `name` into an empty scratch cache (`episerve-build` or `hf-load`)."""
    scratch = f"p6-{job}"
    args = {"root": str(ctx.data_root), "dataset": name, "cache_dir": str(ctx.scratch(scratch))}
    if job == "hf-load":
        args["hf_home"] = str(ctx.workdir / "hf-home")
    os.sync()  # neither side starts while the kernel still writes back what ran before it
    try:
        return run_job(job, args, ctx.logs / "p6.log")
    finally:
        ctx.drop_scratch(scratch)


def run(ctx: Context) -> list[Row]:
    rows = []
    for name in ("vector", "image"):
        dataset = ctx.datasets[name]
        ours_runs, theirs_runs = [], []
        for _ in range(ROUNDS):
            ours_runs.append(_build(ctx, "episerve-build", name))
            theirs_runs.append(_build(ctx, "hf-load", name))
        ours = {"seconds": min(run[0]["seconds"] for run in ours_runs)}
        theirs = {"seconds": min(run[0]["seconds"] for run in theirs_runs)}
        ours_mem = max((run[1] for run in ours_runs), key=lambda sampler: sampler.growth)
        theirs_mem = max((run[1] for run in theirs_runs), key=lambda sampler: sampler.growth)
        source = dataset.parquet_bytes / MB
        files = len(dataset.files)
        case = f"{name}, {source:,.0f} MB parquet in {files} file{'s' if files > 1 else ''}"
        our_speed, their_speed = source / ours["seconds"], source / theirs["seconds"]
        rows += [
            Row(
                "P6",
                case,
                "source MB/s",
                our_speed,
                "HF datasets",
                their_speed,
                "≥ 1.5x",
                our_speed >= 1.5 * their_speed,
            ),
            Row(
                "P6",
                case,
                "peak RssAnon growth MB",
                ours_mem.growth / MB,
                "HF datasets",
                theirs_mem.growth / MB,
                "≤ 256 MB",
                ours_mem.growth <= 256 * MB,
                f"absolute peak: episerve {ours_mem.peak / MB:.0f} MB, HF {theirs_mem.peak / MB:.0f} MB",
            ),
        ]
    return rows
