"""Cache verification: check every segment on disk against its sidecar, and optionally rebuild the damaged."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.store.dataset import Dataset


@dataclass
class VerifyReport:
    """What `verify` found for one dataset."""

    dataset: str
    checked: int = 0
    absent: int = 0
    damaged: dict[str, str] = field(default_factory=dict)
    rebuilt: list[str] = field(default_factory=list)


def verify(dataset: Dataset, rebuild: bool = False) -> VerifyReport:
    """Check every segment on disk against its sidecar (size, checksum, schema, rows); optionally rebuild."""
    index = dataset.index()
    report = VerifyReport(dataset.id)
    for source in index.files:
        if not dataset.segments.paths(source.path).arrow.exists():
            report.absent += 1
            continue
        report.checked += 1
        problem = dataset.segments.verify(source, index.schema)
        if problem is None:
            continue
        report.damaged[source.path] = problem
        if rebuild:
            dataset.segments.discard(source)
            dataset.segments.open(source, index.schema)
            report.rebuilt.append(source.path)
    return report
