"""Source fingerprints and the episode index: episode -> runs of (source file, row_start, row_stop).

Built at dataset open without converting anything: from LeRobot metadata when it agrees with the files' row
counts, otherwise by reading only the episode column. Persisted as `index.json` next to the segments and reused
while the files' fingerprints still match, so reopening a large dataset stats its files and reads nothing else.

A persisted index is trusted only when its checksum matches its content, its runs tile every file's rows exactly
(no gap, no overlap, nothing past a file's row count) and, for LeRobot datasets, its runs equal what the episode
metadata says; anything else is logged, discarded and rebuilt, never served. `verify_persisted_index` goes
further and re-derives the whole index from the sources.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa

from app.atomic_files import write_atomically
from app.errors import DatasetError
from app.sources import EpisodeRun, Source, SourceFingerprint, schema_hash

INDEX_FORMAT = 4
log = logging.getLogger("episerve.cache")


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
            h.update(orjson.dumps(fp.to_dict()))
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

    def files_of(self, episodes: np.ndarray) -> list[int]:
        """The source files holding rows of `episodes` (sorted, existing ids), ascending."""
        positions = np.searchsorted(self.episodes, episodes)
        first = self.episode_offsets[positions]
        counts = self.episode_offsets[positions + 1] - first
        runs = np.repeat(first - (np.cumsum(counts) - counts), counts) + np.arange(counts.sum())
        return np.unique(self.run_file[runs]).tolist()

    def runs(self) -> list[EpisodeRun]:
        episode = np.repeat(self.episodes, np.diff(self.episode_offsets))
        return [
            EpisodeRun(int(e), int(f), int(s), int(t))
            for e, f, s, t in zip(episode, self.run_file, self.run_start, self.run_stop, strict=True)
        ]


def load_or_build_index(
    source: Source, episode_column: str, index_path: Path, current: EpisodeIndex | None = None
) -> EpisodeIndex:
    """The dataset's episode index, reusing `index_path` for every file whose fingerprint still matches.

    `current` is the index this process serves, when it reads `index_path` again (the file changed under it:
    rewritten by another process, by `verify`, or forged). Then the file's runs are trusted only where they equal
    `current`'s: the episode runs of every file on which the two disagree are read again from the sources, which
    settle it, whichever of the two was wrong. The file is rewritten only when what it says is not the result."""
    previous, problem = read_persisted_index(index_path, episode_column)
    if problem is not None:
        log.warning("discarding the episode index %s: %s; rebuilding it", index_path, problem)
    disputed = _disputed_files(current, previous) if current is not None and previous is not None else set()
    if disputed:
        log.warning(
            "the episode index %s changed under this process and disagrees with it on %d file(s) (%s); reading "
            "their episode runs from the sources again",
            index_path,
            len(disputed),
            ", ".join(sorted(disputed)[:3]) + (", ..." if len(disputed) > 3 else ""),
        )
    files, schemas = _fingerprints(source, previous)
    if previous is not None and previous.files == files and not disputed:
        problem = _disagreement_with_metadata(source, previous)
        if problem is None:
            return previous
        log.warning("discarding the episode index %s: %s; rebuilding it", index_path, problem)
        previous = None
    index = _build_index(source, episode_column, files, schemas, _without_runs_of(previous, disputed))
    if previous is None or not _same_index(index, previous):
        _persist(index_path, index, episode_column)
    return index


def _file_runs(index: EpisodeIndex) -> dict[str, tuple[SourceFingerprint, list[tuple[int, int, int]]]]:
    """Per file path: its fingerprint and its runs (episode, start, stop)."""
    runs: dict[str, tuple[SourceFingerprint, list[tuple[int, int, int]]]] = {fp.path: (fp, []) for fp in index.files}
    for run in index.runs():
        runs[index.files[run.file].path][1].append((run.episode, run.start, run.stop))
    return runs


def _disputed_files(current: EpisodeIndex, persisted: EpisodeIndex) -> set[str]:
    """Files of `persisted` whose fingerprint or runs differ from `current`'s (or that `current` lacks)."""
    ours = _file_runs(current)
    return {path for path, entry in _file_runs(persisted).items() if ours.get(path) != entry}


def _without_runs_of(index: EpisodeIndex | None, paths: set[str]) -> EpisodeIndex | None:
    """`index` with no runs for the files `paths` (so they are scanned again, not reused)."""
    if index is None or not paths:
        return index
    kept = [run for run in index.runs() if index.files[run.file].path not in paths]
    return EpisodeIndex.from_runs(index.files, index.schema, kept, index.has_episode_column)


def _same_index(a: EpisodeIndex, b: EpisodeIndex) -> bool:
    return (
        a.files == b.files
        and a.has_episode_column == b.has_episode_column
        and a.schema.equals(b.schema, check_metadata=True)
        and a.runs() == b.runs()
    )


def verify_persisted_index(source: Source, episode_column: str, index_path: Path) -> str | None:
    """None if `index_path` is absent, sound, or merely out of date (sources changed since: it is rebuilt on
    load); else what is wrong with it. Re-derives the whole index from the sources (reads every episode column)."""
    persisted, problem = read_persisted_index(index_path, episode_column)
    if persisted is None:
        return problem
    files, schemas = _fingerprints(source, None)
    if persisted.files != files:
        return None
    fresh = _build_index(source, episode_column, files, schemas, None)
    if fresh.has_episode_column != persisted.has_episode_column:
        return "its episode column flag differs from the sources'"
    if not fresh.schema.equals(persisted.schema, check_metadata=True):
        return "its unified schema differs from the sources'"
    return _first_difference(fresh.runs(), persisted.runs(), "the sources")


def _fingerprints(
    source: Source, previous: EpisodeIndex | None
) -> tuple[list[SourceFingerprint], dict[str, pa.Schema]]:
    """Every source file's fingerprint (reused from `previous` where the file is unchanged), and the schemas of
    the files whose footers had to be read."""
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
    return files, schemas


def _build_index(
    source: Source,
    episode_column: str,
    files: list[SourceFingerprint],
    schemas: dict[str, pa.Schema],
    previous: EpisodeIndex | None,
) -> EpisodeIndex:
    """The index of `files`: runs from the metadata, or from the episode column (reusing `previous` runs of
    unchanged files)."""
    schema = _unified_schema(source, files, schemas, previous)
    has_episode_column = episode_column in schema.names
    if not has_episode_column:
        runs = [EpisodeRun(0, n, 0, fp.rows) for n, fp in enumerate(files) if fp.rows]
    else:
        runs = source.metadata_runs([fp.rows for fp in files]) or _scan_episode_column(
            source, files, episode_column, previous
        )
    return EpisodeIndex.from_runs(files, schema, runs, has_episode_column)


def _disagreement_with_metadata(source: Source, index: EpisodeIndex) -> str | None:
    """What the index says differently from the format's episode metadata (None when it agrees, or when the
    metadata gives no runs: then the index was built from the episode column)."""
    if not index.has_episode_column:
        return None
    expected = source.metadata_runs([fp.rows for fp in index.files])
    if expected is None:
        return None
    return _first_difference(expected, index.runs(), "the episode metadata")


def _first_difference(expected: list[EpisodeRun], found: list[EpisodeRun], source: str) -> str | None:
    ordered = sorted(expected, key=lambda r: (r.episode, r.file, r.start))
    if ordered == found:
        return None
    for want, got in zip(ordered, found, strict=False):
        if want != got:
            return f"it has {_describe(got)} where {source} say {_describe(want)}"
    return f"it has {len(found)} episode runs where {source} give {len(ordered)}"


def _describe(run: EpisodeRun) -> str:
    return f"episode {run.episode} at rows [{run.start}, {run.stop}) of file {run.file}"


def index_problem(index: EpisodeIndex) -> str | None:
    """None if the runs tile every file's rows exactly and episode ids are plausible, else the first violation."""
    if len(index.run_file) and (index.run_file.min() < 0 or index.run_file.max() >= len(index.files)):
        return "a run names a source file that is not in the index"
    if not index.has_episode_column and len(index.episodes) > 1:
        return "it has several episodes but no episode column"
    if len(index.episodes) and index.episodes[0] < 0:
        return "it has negative episode ids"
    order = np.lexsort((index.run_start, index.run_file))
    run_file, start, stop = index.run_file[order], index.run_start[order], index.run_stop[order]
    if np.any(stop <= start):
        return "it has an empty or reversed run"
    first = np.concatenate(([True], run_file[1:] != run_file[:-1]))
    last = np.concatenate((run_file[1:] != run_file[:-1], [True]))
    expected_start = np.where(first, 0, np.concatenate(([0], stop[:-1])))
    rows = np.fromiter((fp.rows for fp in index.files), dtype=np.int64, count=len(index.files))
    covered = np.zeros(len(rows), dtype=bool)
    covered[run_file] = True
    bad = np.flatnonzero(start != expected_start)
    if len(bad):
        return f"its runs of {index.files[run_file[bad[0]]].path!r} overlap or leave a gap"
    bad = np.flatnonzero(stop[last] != rows[run_file[last]])
    if len(bad):
        fp = index.files[run_file[last][bad[0]]]
        return f"its runs of {fp.path!r} end at row {stop[last][bad[0]]}, not at the file's {fp.rows} rows"
    bad = np.flatnonzero(~covered & (rows > 0))
    if len(bad):
        return f"it has no runs for the rows of {index.files[bad[0]].path!r}"
    return None


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
        runs.extend(source.scan_runs(number, fp.path, column, fp.etag))
    return runs


def file_identity(path: Path) -> tuple[int, ...] | None:
    """(size, mtime, ctime, inode) of `path`, None if it is missing: changes whenever the file is rewritten."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def _persist(path: Path, index: EpisodeIndex, episode_column: str) -> None:
    doc: dict[str, object] = {
        "format": INDEX_FORMAT,
        "episode_column": episode_column,
        "has_episode_column": index.has_episode_column,
        "schema": base64.b64encode(index.schema.serialize().to_pybytes()).decode(),
        "files": [fp.to_dict() for fp in index.files],
        "runs": {
            "episode": np.repeat(index.episodes, np.diff(index.episode_offsets)).tolist(),
            "file": index.run_file.tolist(),
            "start": index.run_start.tolist(),
            "stop": index.run_stop.tolist(),
        },
    }
    doc["checksum"] = _content_checksum(doc)
    write_atomically(path, orjson.dumps(doc))


def _content_checksum(doc: dict) -> str:
    """Checksum of everything in the document but the checksum itself (keys sorted)."""
    content = {key: value for key, value in doc.items() if key != "checksum"}
    return "sha256:" + hashlib.sha256(orjson.dumps(content, option=orjson.OPT_SORT_KEYS)).hexdigest()


def read_persisted_index(path: Path, episode_column: str) -> tuple[EpisodeIndex | None, str | None]:
    """(index, None) for a sound persisted index; (None, None) if absent, of another format or another episode
    column (nothing wrong: it is rebuilt); (None, problem) if damaged."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"unreadable ({exc})"
    try:
        doc = orjson.loads(raw)
        if doc.get("format") != INDEX_FORMAT or doc.get("episode_column") != episode_column:
            return None, None
        if doc.get("checksum") != _content_checksum(doc):
            return None, "its checksum does not match its content"
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(doc["schema"])))
        files = [SourceFingerprint(**fp) for fp in doc["files"]]
        r = doc["runs"]
        runs = [
            EpisodeRun(e, f, s, t) for e, f, s, t in zip(r["episode"], r["file"], r["start"], r["stop"], strict=True)
        ]
        index = EpisodeIndex.from_runs(files, schema, runs, bool(doc["has_episode_column"]))
    except (ValueError, KeyError, TypeError, AttributeError, pa.ArrowException) as exc:
        return None, f"malformed ({type(exc).__name__}: {exc})"
    if index.has_episode_column != (episode_column in schema.names):
        return None, "its episode column flag contradicts its schema"
    problem = index_problem(index)
    return (None, problem) if problem is not None else (index, None)
