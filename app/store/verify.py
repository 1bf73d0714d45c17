"""Cache verification: check every segment on disk against its sidecar, and optionally rebuild the damaged."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from app.sources import open_source
from app.sources.video import frame_schema
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
    frames = built_frame_segments(dataset)
    segments += [(dataset.frames, dataset.frames.file_fingerprint(rel), schema) for rel, schema in frames]
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


def built_frame_segments(dataset: Dataset) -> list[tuple[str, pa.Schema]]:
    """(video file, frame schema) of the decoded-frame segments built so far (the others are not checked)."""
    source = dataset.source()
    built: dict[str, pa.Schema] = {}
    for episode in dataset.index().episodes.tolist() if source.info.videos else []:
        for key, feature in source.info.videos.items():
            rel = source.episode_clip(key, int(episode)).path
            if dataset.frames.paths(rel).arrow.exists() or dataset.frames.paths(rel).sidecar.exists():
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
