"""Source fingerprints and the episode index: episode -> runs of (source file, row_start, row_stop).

Built at dataset open without converting anything: from LeRobot metadata when it agrees with the files' row
counts, otherwise by reading only the episode column. Persisted as `index.json` next to the segments and reused
while the files' fingerprints still match, so reopening a large dataset stats its files and reads nothing else.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa

from app.errors import DatasetError
from app.sources import EpisodeRun, Source, SourceFingerprint, schema_hash
from app.store.atomic_files import write_atomically

INDEX_FORMAT = 2


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


def load_or_build_index(source: Source, episode_column: str, index_path: Path) -> EpisodeIndex:
    """The dataset's episode index, reusing `index_path` for every file whose fingerprint still matches."""
    previous = _read_persisted(index_path, episode_column)
    known = {fp.path: fp for fp in previous.files} if previous else {}
    files: list[SourceFingerprint] = []
    schemas: dict[str, pa.Schema] = {}
    for rel in source.files:
        old = known.get(rel)
        if old is not None and source.is_unchanged(old):
            files.append(old)
        else:
            fp, schemas[rel] = source.fingerprint(rel)
            files.append(fp)
    if not files:
        raise DatasetError("no parquet files found")
    if previous is not None and previous.files == files:
        return previous

    schema = _unified_schema(source, files, schemas, previous)
    has_episode_column = episode_column in schema.names
    if not has_episode_column:
        runs = [EpisodeRun(0, n, 0, fp.rows) for n, fp in enumerate(files) if fp.rows]
    else:
        runs = source.metadata_runs([fp.rows for fp in files]) or _scan_episode_column(
            source, files, episode_column, previous
        )
    index = EpisodeIndex.from_runs(files, schema, runs, has_episode_column)
    _persist(index_path, index, episode_column)
    return index


def _unified_schema(
    source: Source, files: list[SourceFingerprint], schemas: dict[str, pa.Schema], previous: EpisodeIndex | None
) -> pa.Schema:
    """One schema for every segment: the first file's column order, types unified across files."""
    if previous is not None and {fp.schema_hash for fp in files} == {fp.schema_hash for fp in previous.files}:
        return previous.schema
    for fp in files:
        if fp.path not in schemas:
            schemas[fp.path] = source.schema(fp.path)
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
    source: Source, files: list[SourceFingerprint], column: str, previous: EpisodeIndex | None
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
        runs.extend(source.scan_runs(number, fp.path, column))
    return runs


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
