"""P5: growth of the server's anonymous memory (RssAnon, summed over its processes) while streaming every row of
the image dataset, against the in-RAM approach (`to_table(filter)` then serialised pages) doing the same.

The server has only served a warm-up request before; the in-RAM approach runs in a fresh subprocess.
"""

from __future__ import annotations

from bench.context import Context
from bench.memory import RssSampler
from bench.report import Row
from bench.workers import run_job

MB = 1e6


def run(ctx: Context) -> list[Row]:
    assert ctx.server is not None
    dataset = ctx.datasets["image"]
    page = ctx.scale.p1_rows["image"]
    access = ctx.access()
    try:
        access.rows("image", 0, 1)
        with RssSampler(ctx.server.pid) as ours:
            for start in range(0, dataset.rows, page):
                access.rows("image", start, min(dataset.rows, start + page))
    finally:
        access.close()
    _, theirs = run_job("inram", {"files": [str(f) for f in dataset.files], "page_rows": page}, ctx.logs / "p5.log")
    case = f"image, all {dataset.rows:,} rows in {page:,}-row pages"
    note = f"server baseline {ours.baseline / MB:.0f} MB, {ours.samples} samples"
    return [
        Row(
            "P5",
            case,
            "RssAnon growth MB",
            ours.growth / MB,
            "in-RAM `to_table(filter)`",
            theirs.growth / MB,
            "< 100 MB",
            ours.growth < 100 * MB,
            note,
        )
    ]
