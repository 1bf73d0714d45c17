"""Source fingerprints and the episode index: episode -> runs of (source file, row_start, row_stop).

Built at dataset open without converting anything: from LeRobot metadata when it agrees with the files' row
counts, otherwise by reading only the episode column. Persisted as `index.json` next to the segments and reused
while the files' fingerprints still match, so reopening a large dataset stats its files and reads nothing else.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import itertools
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from app.errors import DatasetError
from app.files import write_atomically
from app.layouts import EpisodeRun, Layout, episode_runs_from_metadata

if TYPE_CHECKING:
    from app.views import EpisodeView

INDEX_FORMAT = 2


@dataclass(frozen=True)
class SourceFingerprint:
    """Identity of one source file's content: any change to it invalidates that file's segment."""

    path: str
    size: int
    mtime_ns: int
    rows: int
    schema_hash: str

    def same_file(self, stat: os.stat_result) -> bool:
        return stat.st_size == self.size and stat.st_mtime_ns == self.mtime_ns


def schema_hash(schema: pa.Schema) -> str:
    """Stable digest of a schema, field metadata and schema metadata included."""
    return hashlib.sha256(schema.serialize().to_pybytes()).hexdigest()[:32]


def fingerprint_file(root: Path, rel: str) -> tuple[SourceFingerprint, pa.Schema]:
    """Fingerprint one source file by reading only its parquet footer."""
    path = root / rel
    try:
        stat = path.stat()
        meta = pq.read_metadata(path)
        schema = meta.schema.to_arrow_schema()
    except (OSError, pa.ArrowException) as exc:
        raise DatasetError(f"source file {rel!r} is unreadable: {exc}") from exc
    return SourceFingerprint(rel, stat.st_size, stat.st_mtime_ns, meta.num_rows, schema_hash(schema)), schema


@dataclass
class EpisodeIndex:
    """Where every episode's rows are, plus the unified schema every segment is written with.

    Runs are sorted by (episode, file, start): the order rows appear in a view.
    """

    files: list[SourceFingerprint]
    schema: pa.Schema
    has_episode_column: bool
    episodes: np.ndarray  # sorted unique episode ids
    episode_offsets: np.ndarray  # runs of episodes[i] are runs[episode_offsets[i]:episode_offsets[i+1]]
    run_file: np.ndarray
    run_start: np.ndarray
    run_stop: np.ndarray

    @property
    def total_rows(self) -> int:
        return int((self.run_stop - self.run_start).sum())

    @functools.cached_property
    def episode_lengths(self) -> np.ndarray:
        per_run = self.run_stop - self.run_start
        return np.add.reduceat(per_run, self.episode_offsets[:-1]) if len(per_run) else per_run

    @functools.cached_property
    def digest(self) -> str:
        """Changes whenever any source file or the unified schema changes (used for ETags)."""
        h = hashlib.sha256(schema_hash(self.schema).encode())
        for fp in self.files:
            h.update(orjson.dumps(asdict(fp)))
        return h.hexdigest()[:32]

    @functools.cached_property
    def full_view(self) -> EpisodeView:
        """The view of every episode (computed once per index snapshot)."""
        from app.views import EpisodeView  # views build on this module

        return EpisodeView.of(self)

    @classmethod
    def from_runs(
        cls,
        files: list[SourceFingerprint],
        schema: pa.Schema,
        runs: list[EpisodeRun],
        has_episode_column: bool,
    ) -> EpisodeIndex:
        ordered = sorted(runs, key=lambda r: (r.episode, r.file, r.start))
        episode = np.fromiter((r.episode for r in ordered), dtype=np.int64, count=len(ordered))
        episodes, first = np.unique(episode, return_index=True)
        return cls(
            files=files,
            schema=schema,
            has_episode_column=has_episode_column,
            episodes=episodes,
            episode_offsets=np.append(first, len(ordered)).astype(np.int64),
            run_file=np.fromiter((r.file for r in ordered), dtype=np.int64, count=len(ordered)),
            run_start=np.fromiter((r.start for r in ordered), dtype=np.int64, count=len(ordered)),
            run_stop=np.fromiter((r.stop for r in ordered), dtype=np.int64, count=len(ordered)),
        )

    def runs(self) -> list[EpisodeRun]:
        episode = np.repeat(self.episodes, np.diff(self.episode_offsets))
        return [
            EpisodeRun(int(e), int(f), int(s), int(t))
            for e, f, s, t in zip(episode, self.run_file, self.run_start, self.run_stop, strict=True)
        ]


def load_or_build_index(root: Path, layout: Layout, episode_column: str, index_path: Path) -> EpisodeIndex:
    """The dataset's episode index, reusing `index_path` for every file whose fingerprint still matches."""
    previous = _read_persisted(index_path, episode_column)
    known = {fp.path: fp for fp in previous.files} if previous else {}
    files: list[SourceFingerprint] = []
    schemas: dict[str, pa.Schema] = {}
    for rel in layout.files:
        old = known.get(rel)
        try:
            stat = (root / rel).stat()
        except OSError as exc:
            raise DatasetError(f"source file {rel!r} is unreadable: {exc}") from exc
        if old is not None and old.same_file(stat):
            files.append(old)
        else:
            fp, schemas[rel] = fingerprint_file(root, rel)
            files.append(fp)
    if not files:
        raise DatasetError("no parquet files found")
    if previous is not None and previous.files == files:
        return previous

    schema = _unified_schema(root, files, schemas, previous)
    has_episode_column = episode_column in schema.names
    if not has_episode_column:
        runs = [EpisodeRun(0, n, 0, fp.rows) for n, fp in enumerate(files) if fp.rows]
    else:
        runs = episode_runs_from_metadata(root, layout, [fp.rows for fp in files]) or _scan_episode_column(
            root, files, episode_column, previous
        )
    index = EpisodeIndex.from_runs(files, schema, runs, has_episode_column)
    _persist(index_path, index, episode_column)
    return index


def _unified_schema(
    root: Path, files: list[SourceFingerprint], schemas: dict[str, pa.Schema], previous: EpisodeIndex | None
) -> pa.Schema:
    """One schema for every segment: the first file's column order, types unified across files."""
    if previous is not None and {fp.schema_hash for fp in files} == {fp.schema_hash for fp in previous.files}:
        return previous.schema
    for fp in files:
        if fp.path not in schemas:
            schemas[fp.path] = pq.read_schema(root / fp.path)
    distinct: dict[str, pa.Schema] = {}
    for fp in files:
        distinct.setdefault(fp.schema_hash, schemas[fp.path])
    try:
        unified = next(iter(distinct.values()))
        if len(distinct) > 1:
            unified = pa.unify_schemas(list(distinct.values()), promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise DatasetError(f"source files have incompatible schemas: {exc}") from exc
    return _without_dictionaries(unified)


def _without_dictionaries(schema: pa.Schema) -> pa.Schema:
    """Dictionary-encoded columns (pandas categoricals) become plain columns of their values, so every response
    is a self-contained stream of record batches."""
    fields = [
        field.with_type(field.type.value_type) if pa.types.is_dictionary(field.type) else field for field in schema
    ]
    return pa.schema(fields, metadata=schema.metadata)


def _scan_episode_column(
    root: Path, files: list[SourceFingerprint], column: str, previous: EpisodeIndex | None
) -> list[EpisodeRun]:
    """Runs of equal episode ids, found by reading only the episode column of each changed file."""
    reusable: dict[SourceFingerprint, list[EpisodeRun]] = {}
    if previous is not None:
        old_number = {fp: n for n, fp in enumerate(previous.files)}
        for run in previous.runs():
            reusable.setdefault(previous.files[run.file], []).append(run)
        reusable = {fp: runs for fp, runs in reusable.items() if fp in old_number}
    runs: list[EpisodeRun] = []
    for number, fp in enumerate(files):
        if fp in reusable:
            runs.extend(EpisodeRun(r.episode, number, r.start, r.stop) for r in reusable[fp])
            continue
        runs.extend(_runs_in_file(root / fp.path, number, column))
    return runs


def _runs_in_file(path: Path, number: int, column: str) -> list[EpisodeRun]:
    parquet = pq.ParquetFile(path)
    if column not in parquet.schema_arrow.names:
        raise DatasetError(f"source file {path.name!r} has no episode column {column!r} while others do")
    values = parquet.read(columns=[column]).column(0)
    if not pa.types.is_integer(values.type):
        raise DatasetError(f"episode column {column!r} must hold integers, found {values.type}")
    if values.null_count:
        raise DatasetError(f"episode column {column!r} of {path.name!r} has null values")
    ids = values.to_numpy().astype(np.int64, copy=False)
    if len(ids) == 0:
        return []
    if ids.min() < 0:
        raise DatasetError(f"episode column {column!r} of {path.name!r} has negative ids")
    bounds = np.concatenate(([0], np.flatnonzero(np.diff(ids)) + 1, [len(ids)]))
    return [EpisodeRun(int(ids[a]), number, int(a), int(b)) for a, b in itertools.pairwise(bounds)]


def _persist(path: Path, index: EpisodeIndex, episode_column: str) -> None:
    doc = {
        "format": INDEX_FORMAT,
        "episode_column": episode_column,
        "has_episode_column": index.has_episode_column,
        "schema": base64.b64encode(index.schema.serialize().to_pybytes()).decode(),
        "files": [asdict(fp) for fp in index.files],
        "runs": {
            "episode": np.repeat(index.episodes, np.diff(index.episode_offsets)).tolist(),
            "file": index.run_file.tolist(),
            "start": index.run_start.tolist(),
            "stop": index.run_stop.tolist(),
        },
    }
    write_atomically(path, orjson.dumps(doc))


def _read_persisted(path: Path, episode_column: str) -> EpisodeIndex | None:
    """The persisted index, or None if absent, unreadable, of another format or another episode column."""
    try:
        doc = orjson.loads(path.read_bytes())
        if doc["format"] != INDEX_FORMAT or doc["episode_column"] != episode_column:
            return None
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(doc["schema"])))
        files = [SourceFingerprint(**fp) for fp in doc["files"]]
        r = doc["runs"]
        runs = [
            EpisodeRun(e, f, s, t) for e, f, s, t in zip(r["episode"], r["file"], r["start"], r["stop"], strict=True)
        ]
        return EpisodeIndex.from_runs(files, schema, runs, bool(doc["has_episode_column"]))
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None
