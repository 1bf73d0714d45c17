"""P6: building the cache from cold, in source MB/s (parquet bytes ÷ seconds) and peak anonymous memory.

episerve: every segment of the dataset built by the server's own code in a fresh process (as `episerve-server
warm` does), into an empty cache. HF `datasets`: `Dataset.from_parquet` of the same files into an empty cache.
Both in subprocesses whose RssAnon is sampled every 10 ms; peak growth is over the idle, imported process. Dirty
pages are flushed (`sync`) before each side starts, so neither pays for writing back what ran before it.
"""

from __future__ import annotations

import os

from bench.context import Context
from bench.report import Row
from bench.workers import run_job

MB = 1e6


def run(ctx: Context) -> list[Row]:
    rows = []
    for name in ("vector", "image"):
        dataset = ctx.datasets[name]
        cache = ctx.scratch("p6-episerve")
        args = {"root": str(ctx.data_root), "cache_dir": str(cache), "dataset": name}
        os.sync()  # neither side starts while the kernel still writes back what earlier figures wrote
        ours, ours_mem = run_job("episerve-build", args, ctx.logs / "p6.log")
        ctx.drop_scratch("p6-episerve")
        hf_cache = ctx.scratch("p6-hf")
        args = {
            "root": str(ctx.data_root),
            "dataset": name,
            "cache_dir": str(hf_cache),
            "hf_home": str(ctx.workdir / "hf-home"),
        }
        os.sync()
        theirs, theirs_mem = run_job("hf-load", args, ctx.logs / "p6.log")
        ctx.drop_scratch("p6-hf")
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
