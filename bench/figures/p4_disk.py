"""P4: disk used by the cache after three distinct episode picks (every episode, 50 %, 10 %), as a multiple of
one conversion of the whole dataset.

episerve: a server on an empty cache streams every row of each pick in turn; its cache directory is measured
after each. HF `datasets`: `Dataset.from_parquet(..., filters=episode_index in pick)` per pick, as LeRobot opens
a pick, into an empty cache directory. "One conversion" is each system's own bytes after the full pick.
"""

from __future__ import annotations

from bench.access import best_access
from bench.context import Context
from bench.figures.picks import pick, spec, view_rows
from bench.peers import hf
from bench.processes import EpiserveServer
from bench.report import Row

FRACTIONS = (1.0, 0.5, 0.1)
PAGE_ROWS = 20_000


def _episerve_bytes(ctx: Context, name: str, picks: list[list[int]]) -> list[int]:
    cache = ctx.scratch("p4-episerve")
    sizes = []
    with EpiserveServer(ctx.data_root, cache, ctx.logs, workers=2) as server:
        access = best_access(server.url)
        try:
            lengths = ctx.datasets[name].lengths
            for ids in picks:
                total, episodes = view_rows(lengths, ids), spec(ids)
                for start in range(0, total, PAGE_ROWS):
                    access.rows(name, start, min(total, start + PAGE_ROWS), episodes=episodes)
                sizes.append(hf.directory_bytes(cache))
        finally:
            access.close()
    ctx.drop_scratch("p4-episerve")
    return sizes


def _hf_bytes(ctx: Context, name: str, picks: list[list[int]]) -> list[int]:
    cache = ctx.scratch("p4-hf")
    sizes = []
    for ids in picks:
        full = len(ids) == ctx.datasets[name].episodes
        hf.load(ctx.datasets[name], cache, None if full else ids)
        sizes.append(hf.directory_bytes(cache))
    ctx.drop_scratch("p4-hf")
    return sizes


def run(ctx: Context) -> list[Row]:
    rows = []
    for name in ("vector", "image"):
        episodes = ctx.datasets[name].episodes
        picks = [pick(episodes, f, seed=40 + i) for i, f in enumerate(FRACTIONS)]
        ours, theirs = _episerve_bytes(ctx, name, picks), _hf_bytes(ctx, name, picks)
        ours_x, theirs_x = ours[-1] / ours[0], theirs[-1] / theirs[0]
        note = f"one conversion: episerve {ours[0] / 1e6:,.0f} MB, HF {theirs[0] / 1e6:,.0f} MB"
        rows.append(
            Row(
                "P4",
                f"{name}, picks 100 % + 50 % + 10 %",
                "x one conversion",
                ours_x,
                "HF datasets",
                theirs_x,
                "≤ 1.0x",
                ours_x <= 1.0 + 1e-3,
                note,
            )
        )
    return rows
