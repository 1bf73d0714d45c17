"""P13: resuming a mixture's plan at position 10^8 of a 10^9-position epoch on another world size: seconds to the
first batch and the plan's memory, against replaying the plan from the start.

A three-component mixture (two robots of 6 and 9 joints, one of them picked twice with different episodes, weights
pi : e : 1 so that the plan has its longest period) over small demo datasets, the server's caches warmed by the
saving run; the epoch is set to 10^9 positions (`epoch_size`: the plan does not care
how many rows the components have). A run of 4 ranks x 64 saves its state at position 10^8; rank 1 of 3 then
resumes from it in a fresh process: the clock runs from creating the dataset (which resolves the mixture against
the server and builds the plan) to the first batch in hand, and `tracemalloc` measures the plan's peak memory
(building it and locating the batch's positions). The peer replays the plan: it locates every position from 0 in
blocks of 10^6, as a loader that can only skip forward would; timed over the first `REPLAY` positions and scaled
to 10^8 (linear: every block costs the same).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.context import Context
from bench.processes import EpiserveServer, _clean_env, app_dir
from bench.report import Row

EPOCH = 10**9
RESUME_AT = 10**8
BATCH = 64
BLOCK = 10**6
COLUMNS = ["observation.state", "action", "index"]


def run(ctx: Context) -> list[Row]:
    root = _datasets(ctx.workdir / "p13-data")
    replay = 10**7 if ctx.scale.mode == "full" else 2 * 10**6
    with EpiserveServer(root, ctx.scratch("p13-cache"), ctx.logs, workers=2) as server:
        measured = json.loads(
            subprocess.run(
                [sys.executable, "-c", _RESUME, server.url, json.dumps(_mixture())],
                check=True,
                capture_output=True,
                text=True,
                cwd=app_dir(),
                env=_clean_env(),
            ).stdout.splitlines()[-1]
        )
    replay_seconds = _replay_seconds(measured["sizes"], replay) * RESUME_AT / replay
    ctx.notes.append(
        f"P13: replay timed over the first {replay:,} positions of the plan and scaled to {RESUME_AT:,}; "
        f"episerve's plan period is {measured['period']:,} positions."
    )
    return [
        Row(
            "P13",
            "resume at 10^8 of 10^9, 4 ranks -> 3",
            "s to first batch",
            measured["seconds"],
            "replaying the plan",
            replay_seconds,
            "< 1 s",
            measured["seconds"] < 1.0,
        ),
        Row(
            "P13",
            "plan memory at the resume",
            "MB",
            measured["plan_mb"],
            "",
            None,
            "< 100 MB",
            measured["plan_mb"] < 100,
        ),
    ]


def _datasets(root: Path) -> Path:
    from app.demo import write_demo_dataset

    for name, joints, seed in (("arm6", 6, 1), ("arm9", 9, 2)):
        if not (root / name / "meta/info.json").exists():
            write_demo_dataset(root / name, episodes=20, seed=seed, joints=joints, cameras=None)
    return root


def _mixture() -> dict:
    """Weights that no small period holds exactly (pi : e : 1), so the plan has its longest period (65,536)."""
    return {
        "components": [
            {"dataset": "arm6", "weight": math.pi},
            {"dataset": "arm9", "weight": math.e, "episodes": "0-9"},
            {"dataset": "arm9", "weight": 1, "episodes": "10-19"},
        ]
    }


def _replay_seconds(sizes: list[int], positions: int) -> float:
    import episerve

    mixture = episerve.Mixture.from_dict(_mixture())
    from episerve._plan import quotas

    plan = episerve.MixturePlan(quotas(mixture.weights), tuple(sizes), 0, EPOCH)
    plan.locate(0, [0])
    began = time.perf_counter()
    for start in range(0, positions, BLOCK):
        plan.locate(0, np.arange(start, start + BLOCK))
    return time.perf_counter() - began


# Run in a fresh process: the resumed rank, from creating its dataset to its first batch.
_RESUME = """
import json, sys, time, tracemalloc
import numpy as np
import episerve
from episerve._plan import MixturePlan, quotas, schedule, _prefix_counts

url, document = sys.argv[1], json.loads(sys.argv[2])
mixture = episerve.Mixture.from_dict(document)
columns = ["observation.state", "action", "index"]
EPOCH, RESUME_AT, BATCH = 10**9, 10**8, 64

options = {"batch_size": BATCH, "epoch_size": EPOCH}
saving = episerve.MixtureIterableDataset(url, mixture, columns, rank=0, world_size=4, **options)
state = saving.state_dict(batches=RESUME_AT // (4 * BATCH))
assert state["position"] == RESUME_AT
next(iter(saving))  # the server's caches warm: what is timed is the resume, not a first conversion
sizes = list(saving.source.plan.sizes)
schedule.cache_clear(); _prefix_counts.cache_clear()

began = time.perf_counter()
dataset = episerve.MixtureIterableDataset(url, mixture, columns, rank=1, world_size=3, **options)
dataset.load_state_dict(state)
batch = next(iter(dataset))
seconds = time.perf_counter() - began
assert len(batch["index"]) == BATCH

schedule.cache_clear(); _prefix_counts.cache_clear()
tracemalloc.start()
plan = MixturePlan(quotas(mixture.weights), tuple(sizes), 0, EPOCH)
plan.locate(0, np.arange(RESUME_AT + BATCH, RESUME_AT + 2 * BATCH))
plan.counts(RESUME_AT)
_, peak = tracemalloc.get_traced_memory()
print(json.dumps({"seconds": seconds, "plan_mb": peak / 1e6, "sizes": sizes, "period": plan.period}))
"""
