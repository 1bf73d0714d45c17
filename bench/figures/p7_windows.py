"""P7: temporal windows, a 50-step action chunk and a 2-step state history, for uniformly random samples.

episerve: takes of 256 random samples with `delta_timestamps`, back to back, one client. LeRobot-style: the
per-sample `__getitem__` of LeRobot 0.4.4 over HF `datasets` (see bench/peers/lerobot_style.py), one process.
Both return every column of the vector dataset plus the windows and their pad masks.
"""

from __future__ import annotations

import time

import numpy as np

from bench.context import Context
from bench.datasets import ACTION, FPS, STATE
from bench.peers.lerobot_style import LeRobotStyleDataset
from bench.report import Row

DELTA_TIMESTAMPS = {ACTION: [k / FPS for k in range(50)], STATE: [-1 / FPS, 0.0]}


def run(ctx: Context) -> list[Row]:
    name = "vector"
    dataset = ctx.datasets[name]
    batch = ctx.scale.p3_batch
    rng = np.random.default_rng(7)
    access = ctx.access()
    try:
        access.take(name, rng.integers(0, dataset.rows, size=batch).tolist(), delta_timestamps=DELTA_TIMESTAMPS)
        started = time.perf_counter()
        for _ in range(ctx.scale.p7_requests):
            ids = rng.integers(0, dataset.rows, size=batch).tolist()
            table = access.take(name, ids, delta_timestamps=DELTA_TIMESTAMPS)
        ours = ctx.scale.p7_requests * batch / (time.perf_counter() - started)
        assert table.num_rows == batch and f"{ACTION}_is_pad" in table.column_names
    finally:
        access.close()
    lerobot = LeRobotStyleDataset(dataset, ctx.hf_cache, DELTA_TIMESTAMPS)
    lerobot[0]
    ids = rng.integers(0, dataset.rows, size=ctx.scale.p7_lerobot_samples).tolist()
    started = time.perf_counter()
    for i in ids:
        item = lerobot[i]
    theirs = len(ids) / (time.perf_counter() - started)
    assert tuple(item[ACTION].shape) == (50, 14)
    return [
        Row(
            "P7",
            f"{name}, 50-step action + 2-step state windows",
            "samples/s",
            ours,
            "LeRobot 0.4.4-style per-sample",
            theirs,
            "≥ 50x",
            ours >= 50 * theirs,
            f"episerve: {batch}-sample takes; LeRobot-style: {1e3 / theirs:.1f} ms/sample",
        )
    ]
