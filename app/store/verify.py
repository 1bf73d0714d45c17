"""Cache verification: check every segment on disk against its sidecar, and optionally rebuild the damaged."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from app.sources import open_source
from app.sources.frame_tiers import hot_tier
from app.sources.video import frame_schema, hot_camera
from app.store.dataset import Dataset
from app.store.episode_index import verify_persisted_index


@dataclass
class VerifyReport:
    """What `verify` found for one dataset."""

    dataset: str
    checked: int = 0
    absent: int = 0
    damaged: dict[str, str] = field(default_factory=dict)
    rebuilt: list[str] = field(default_factory=list)
    index_problem: str | None = None  # what was wrong with index.json (it is always rebuilt)


def verify(dataset: Dataset, rebuild: bool = False) -> VerifyReport:
    """Check the persisted episode index against the sources (rebuilt when damaged: a damaged index is never
    served), then every segment on disk against its sidecar (size, checksum, schema, rows); optionally rebuild."""
    report = VerifyReport(dataset.id, index_problem=_verify_index(dataset))
    index = dataset.index()
    segments = [(dataset.segments, source, index.schema) for source in index.files]
    for store, hot in ((dataset.frames, False), (dataset.hot_frames, True)):
        if store is not None:
            built = built_frame_segments(dataset, hot)
            segments += [(store, store.file_fingerprint(rel), schema) for rel, schema in built]
    for store, source, schema in segments:
        if not store.paths(source.path).arrow.exists():
            report.absent += 1
            continue
        report.checked += 1
        problem = store.verify(source, schema)
        if problem is None:
            continue
        report.damaged[source.path] = problem
        if rebuild:
            store.discard(source)
            store.open(source, schema)
            report.rebuilt.append(source.path)
    return report


def built_frame_segments(dataset: Dataset, hot: bool = False) -> list[tuple[str, pa.Schema]]:
    """(video file, frame schema) of the decoded-frame segments built so far (the others are not checked); with
    `hot`, of the hot pixel segments over the cameras' encoded tier."""
    source = dataset.source()
    store = dataset.hot_frames if hot else dataset.frames
    cameras = source.info.videos
    if hot:
        cameras = {key: hot_camera(c) for key, c in cameras.items() if hot_tier(c.tier) is not None}
    built: dict[str, pa.Schema] = {}
    for episode in dataset.index().episodes.tolist() if cameras and store is not None else []:
        for key, feature in cameras.items():
            rel = source.episode_clip(key, int(episode)).path
            if store.paths(rel).arrow.exists() or store.paths(rel).sidecar.exists():  # type: ignore[union-attr]
                built[rel] = frame_schema(feature)
    return sorted(built.items())


def _verify_index(dataset: Dataset) -> str | None:
    """What is wrong with the dataset's `index.json` (then deleted, so loading rebuilds it), or None."""
    source = open_source(dataset.path, dataset.supply)
    column = source.info.episode_column or dataset.default_episode_column
    path = dataset.cache_dir / "index.json"
    problem = verify_persisted_index(source, column, path)
    if problem is not None:
        path.unlink(missing_ok=True)
        dataset.reload()
    return problem
