"""The camera figures' walk over their datasets (P9, P10, P16): each dataset generated or reused, then measured; a
dataset whose content cannot be made on this machine (the ALOHA renders without MuJoCo or a headless GL) is skipped
with a SKIP line, a note and a table row that say why, and the figure goes on with the others."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable

from bench.aloha_scene import SceneUnavailable
from bench.camera_datasets import CameraDataset, ensure_camera_dataset
from bench.config import CameraSize
from bench.context import Context
from bench.report import Row


def rows_per_dataset(
    ctx: Context, figure: str, sizes: Iterable[CameraSize], rows_of: Callable[[CameraSize, CameraDataset], list[Row]]
) -> list[Row]:
    """`rows_of(size, dataset)` for each of `sizes` in order, or a skipped row for one that cannot be made."""
    rows: list[Row] = []
    for size in sizes:
        print(f"# {figure} {size.name} ({size.label}) ...", file=sys.stderr)
        try:
            dataset = ensure_camera_dataset(ctx.workdir / "camera-data", size)
        except SceneUnavailable as error:
            print(f"SKIP {figure} {size.label}: {error}", file=sys.stderr)
            ctx.notes.append(f"{figure} {size.label} skipped: {error}.")
            rows.append(Row(figure, size.label, "-", None, f"skipped: {error}", None, "info"))
            continue
        rows += rows_of(size, dataset)
    return rows
