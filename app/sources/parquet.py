"""Generic parquet datasets, and the parquet file access every format here builds on.

A generic dataset is any directory of parquet files (directly in it or under `data/`); an optional
`episerve.json` gives `fps` and `episode_column`. All parquet I/O of the server lives in this module.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from app.errors import DatasetError, InvalidInput
from app.sources.files import (
    ALL_THERE,
    DatasetPath,
    FileSupply,
    is_remote_path,
    opened_etag,
    opened_parquet,
    parquet_input,
    store_reads,
)
from app.sources.fixed_lists import as_stored, readable_footer
from app.sources.json_files import read_json
from app.sources.object_store import RemotePath
from app.sources.source import (
    DatasetInfo,
    EpisodeClip,
    EpisodeRun,
    SourceFingerprint,
    SourceReplaced,
    conform_batch,
)

GENERIC_SETTINGS = Path("episerve.json")
_MAX_BATCH_ROWS = 65_536
# Decoded bytes of row groups a cold read of an object fetches at once, and how many build batches' worth a build
# reads at once: their ranges are fetched together (coalesced, side by side) instead of one GET per row group.
REMOTE_READ_BYTES = 16 * 1024 * 1024
BUILD_READ_BATCHES = 4
# A cold read's row groups in an object are fetched as Arrow's read cache would for a store of 50 ms to first byte
# and 100 MiB/s: ranges less than ~5 MB apart in one GET (the gap costs less than another request's wait), the
# GETs side by side. The bytes between the ranges are fetched, not decoded; a read spans at most this many bytes.
REMOTE_SPAN_BYTES = 64 * 1024 * 1024
# A row group of an object larger than one such read (cold read or build) is never fetched whole: it is read in
# pieces like a local file, each column chunk through a buffer of this size (its ranged GETs), decoded a batch at a
# time. Larger than a local file's buffer: each GET waits for the store's first byte.
REMOTE_BUFFER_BYTES = 4 * 1024 * 1024
_READ_BUFFER_BYTES = 1 << 20  # what a cold read of a local file holds of each column chunk it reads
_REMOTE_FORMAT = ds.ParquetFileFormat(
    default_fragment_scan_options=ds.ParquetFragmentScanOptions(
        pre_buffer=True, cache_options=pa.CacheOptions.from_network_metrics(50, 100)
    )
)


class ParquetSource:
    """A dataset whose data files are parquet; subclasses read a richer format's metadata.

    Where the dataset's `supply` fetches files as reads need them (a LeRobot dataset from the Hub), its data files
    are the ones the supply lists, and one not there yet has an absent fingerprint (`SourceFingerprint.of_absent`)
    from the row count the metadata gives it (`listed_rows`): the index is built without it, and nothing reads it
    until it is there."""

    def __init__(self, root: DatasetPath, info: DatasetInfo, files: list[str], supply: FileSupply = ALL_THERE) -> None:
        self.root = root
        self.info = info
        self.files = files
        self.supply = supply
        self._sizes: dict[str, int] = {}  # what the supply lists of the data files (files fetched on read)
        self._template: pa.Schema | None = None  # the schema of an absent file: that of the first one there
        self._all_there = not supply.fetches

    @classmethod
    def open(cls, root: DatasetPath, supply: FileSupply = ALL_THERE) -> ParquetSource:
        """A generic dataset: parquet files below `root`, settings from its optional `episerve.json`."""
        info = DatasetInfo(format="parquet")
        settings_path = root / GENERIC_SETTINGS
        if settings_path.is_file():
            settings = read_json(settings_path)
            fps = settings.get("fps")
            if fps is not None and (not isinstance(fps, int | float) or isinstance(fps, bool) or fps <= 0):
                raise DatasetError(f"{settings_path}: fps must be a positive number, got {fps!r}")
            column = settings.get("episode_column")
            if column is not None and not isinstance(column, str):
                raise DatasetError(f"{settings_path}: episode_column must be a string, got {column!r}")
            info.fps = float(fps) if fps is not None else None
            info.episode_column = column
            info.info = settings
        return cls(root, info, parquet_files(root, root), supply)

    def fingerprint(self, rel: str) -> tuple[SourceFingerprint, pa.Schema]:
        """Fingerprint one file by reading only its parquet footer (a file not fetched yet: see the class)."""
        if self.supply.fetches and not self.supply.there(rel):
            absent = self._absent_fingerprint(rel)
            if absent is not None:
                return absent
            self.supply.at_hand([rel])  # nothing to hold it by: fetched now (a 503 meanwhile), then read
        path = self.root / rel
        try:
            stat = path.stat()
            with opened_parquet(path) as handle:
                meta = pq.read_metadata(handle)
                etag = opened_etag(handle)
            schema = meta.schema.to_arrow_schema()
        except (OSError, pa.ArrowException) as exc:
            raise DatasetError(f"source file {rel!r} is unreadable: {exc}") from exc
        return SourceFingerprint.of(rel, stat, meta.num_rows, schema, etag), schema

    def is_unchanged(self, source: SourceFingerprint) -> bool:
        try:
            root = self.root
            # Every read asks: a local file's stat without building a Path.
            stat = os.stat(os.path.join(root, source.path)) if isinstance(root, Path) else (root / source.path).stat()
            # A file fingerprinted absent is unchanged until its supply has it there (downloaded and checked).
            return source.same_file(stat) or (source.absent and not self.supply.there(source.path))
        except FileNotFoundError:
            # An object deleted from a store leaves its built segment serving (on a node, the cache is the copy
            # that counts); a request for rows not cached yet gets a 503 naming the object. A deleted local file
            # is a change, unless it was fingerprinted absent: then it is still so.
            return is_remote_path(self.root) or source.absent
        except OSError:
            return False

    def schema(self, rel: str) -> pa.Schema:
        if self.supply.fetches and not self.supply.there(rel):
            return self._template_schema()
        with opened_parquet(self.root / rel) as handle:
            return pq.read_schema(handle)

    def metadata_runs(self, file_rows: list[int]) -> list[EpisodeRun] | None:
        return None  # generic parquet records no episodes: the episode column is scanned

    def listed_rows(self, rel: str) -> int | None:
        """The rows of data file `rel` as the format's metadata gives them (None: it does not)."""
        return None

    def _absent_fingerprint(self, rel: str) -> tuple[SourceFingerprint, pa.Schema] | None:
        """The fingerprint of data file `rel`, not there yet, and its schema (that of the first data file there);
        None when the supply lists no size or the metadata no row count for it (then it must be read)."""
        if not self._sizes:
            self._sizes = self.supply.listed("data/") or {}
        size, rows = self._sizes.get(rel), self.listed_rows(rel)
        if size is None or rows is None:
            return None
        schema = self._template_schema()
        return SourceFingerprint.of_absent(rel, size, rows, schema), schema

    def _template_schema(self) -> pa.Schema:
        """The schema of the first data file there (fetched before the dataset is served), taken for the others'
        until they are there: a file that arrives with another one changes its fingerprint's schema hash."""
        if self._template is None:
            first = next((rel for rel in self.files if self.supply.there(rel)), None)
            if first is None:
                self.supply.at_hand(self.files[:1])  # a 503 while it is fetched
                first = self.files[0]
            with opened_parquet(self.root / first) as handle:
                self._template = pq.read_schema(handle)
        return self._template

    def _at_hand(self, rel: str) -> None:
        """Make sure data file `rel` is there before it is read (a read fetches its files first; this is the
        backstop: a 503 while it is fetched, never a read of a file that is not there)."""
        if self.supply.fetches:
            self.supply.at_hand([rel])

    def scan_runs(self, number: int, rel: str, column: str, etag: str = "") -> list[EpisodeRun]:
        if not self._all_there:  # scanned (the metadata gives no runs): every file is needed, fetched all at once
            self.supply.at_hand(self.files)
            self._all_there = True
        path = self.root / rel
        with opened_parquet(path) as handle:
            check_version(path, etag, opened_etag(handle))
            try:
                runs = self._scan_runs(pq.ParquetFile(handle), number, rel, column)
            except (pa.ArrowInvalid, OSError):
                check_version(path, etag)  # an object re-uploaded while read is no broken file: SourceReplaced
                raise
            check_version(path, etag)  # the ranged GETs read the version fingerprinted
            return runs

    def _scan_runs(self, parquet: pq.ParquetFile, number: int, rel: str, column: str) -> list[EpisodeRun]:
        name = Path(rel).name
        if column not in parquet.schema_arrow.names:
            raise DatasetError(f"source file {name!r} has no episode column {column!r} while others do")
        values = parquet.read(columns=[column]).column(0)
        if not pa.types.is_integer(values.type):
            raise DatasetError(f"episode column {column!r} must hold integers, found {values.type}")
        if values.null_count:
            raise DatasetError(f"episode column {column!r} of {name!r} has null values")
        ids = values.to_numpy().astype(np.int64, copy=False)
        if len(ids) == 0:
            return []
        if ids.min() < 0:
            raise DatasetError(f"episode column {column!r} of {name!r} has negative ids")
        bounds = np.concatenate(([0], np.flatnonzero(np.diff(ids)) + 1, [len(ids)]))
        return [EpisodeRun(int(ids[a]), number, int(a), int(b)) for a, b in itertools.pairwise(bounds)]

    def read_batches(self, rel: str, schema: pa.Schema, batch_bytes: int, etag: str = "") -> Iterator[pa.RecordBatch]:
        self._at_hand(rel)
        path = self.root / rel
        with opened_parquet(path) as handle:
            check_version(path, etag, opened_etag(handle))
            if is_remote_path(self.root):
                metadata = open_parquet_file(handle).metadata
                batch_rows = _rows_per_batch(metadata, batch_bytes)
                batches = _batches_by_row_group(handle, metadata, batch_rows, BUILD_READ_BATCHES * batch_bytes)
            else:
                parquet = open_parquet_file(handle, buffer_size=1 << 20, pre_buffer=False)
                batch_rows = _rows_per_batch(parquet.metadata, batch_bytes)
                batches = parquet.iter_batches(batch_size=batch_rows, use_threads=False)
            for batch in batches:
                yield conform_batch(batch, schema)
            check_version(path, etag)  # the ranged GETs after the HEAD read that version too

    def row_groups(self, rel: str, etag: str = "") -> ParquetRowGroups:
        self._at_hand(rel)
        return ParquetRowGroups(self.root / rel, etag)

    def episode_clip(self, key: str, episode: int) -> EpisodeClip:
        raise InvalidInput(f"{key!r} is not a camera of this dataset")  # generic parquet records no videos


class ParquetRowGroups:
    """Row-group geometry of one parquet file, read from its footer, and reads of rows of its row groups."""

    def __init__(self, path: DatasetPath, etag: str = "") -> None:
        self.path = path
        self.etag = etag
        self.remote = is_remote_path(path)
        # Reads of an object's small row groups, several at once (`read_plan`): their column chunks fetched together
        # and decoded whole (pyarrow's dataset scan does not stream within a row group). Unused for a local file.
        self._fragment: ds.ParquetFileFragment | None = None
        self._fetching: pq.ParquetFile | None = None
        with store_reads(path):
            if self.remote:  # the footer read once, for the geometry and every read after it
                opened = parquet_input(path)
                try:
                    check_version(path, etag, opened_etag(opened))
                except SourceReplaced:
                    opened.close()
                    raise
                self._fragment = _REMOTE_FORMAT.make_fragment(opened)
                self._fragment.ensure_complete_metadata()
                metadata, schema = self._fragment.metadata, self._fragment.physical_schema
                footer = readable_footer(metadata)
                if footer is not None:  # a fragment reads through the file's own footer: a file, through this one
                    self._fragment = None
                    self._fetching = pq.ParquetFile(opened, metadata=footer, pre_buffer=True)
                # A larger row group is streamed as a local file's are, each column chunk by ranged GETs of a buffer.
                readable = metadata if footer is None else footer
                self._file = pq.ParquetFile(
                    opened, metadata=readable, pre_buffer=False, buffer_size=REMOTE_BUFFER_BYTES
                )
            else:
                # Without pre-buffering, and each column chunk read through a buffer: a pre-buffered reader keeps
                # every column chunk it read (a whole row group's compressed bytes) until the file object goes,
                # i.e. for the request's whole read, and an unbuffered one reads a whole column chunk at once.
                self._file = open_parquet_file(str(path), pre_buffer=False, buffer_size=_READ_BUFFER_BYTES)
                metadata, schema = self._file.metadata, self._file.schema_arrow
        self._metadata, self._names = metadata, schema.names
        self._leaves = _leaf_columns(schema, metadata.num_columns)
        self._leaf_sizes: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        groups = [metadata.row_group(i) for i in range(metadata.num_row_groups)]
        self.offsets = np.concatenate(([0], np.cumsum([g.num_rows for g in groups]))).astype(np.int64)
        self.sizes = np.array([g.total_byte_size for g in groups])
        # Where each group lies in the file, [start, end): what an object's read plan bounds (unused locally).
        self.spans = np.array([_byte_span(g) for g in groups] if self.remote else [], dtype=np.int64).reshape(-1, 2)

    def take(
        self, groups: list[int], wanted: pa.Schema, positions: np.ndarray, batch_rows: int
    ) -> list[pa.RecordBatch]:
        # A file lacking every wanted column still has rows: read its first column for their count.
        columns = [name for name in wanted.names if name in self._names] or self._names[:1]
        picked: list[pa.RecordBatch] = []
        at, pool, streams = 0, pa.default_memory_pool(), self.streams(groups)
        with store_reads(self.path):
            for batch in self._batches(groups, columns, batch_rows):
                lo, hi = np.searchsorted(positions, [at, at + batch.num_rows]).tolist()
                if hi > lo:
                    picked.append(conform_batch(batch.take(pa.array(positions[lo:hi] - at)), wanted))
                at += batch.num_rows
                del batch
                if streams:  # what the batch took goes back now (the allocator's pages are per thread)
                    pool.release_unused()
                if hi == len(positions):
                    break
            if self.remote:
                check_version(self.path, self.etag)  # the ranged GETs read the version the index was built from
        return picked

    def streams(self, groups: list[int]) -> bool:
        """A local file's row groups, and an object's row group larger than a read of several (`read_plan` reads
        it alone), are decoded batch by batch; an object's smaller row groups are fetched and decoded whole."""
        return not self.remote or (len(groups) == 1 and int(self.sizes[groups[0]]) > REMOTE_READ_BYTES)

    def _batches(self, groups: list[int], columns: list[str], batch_rows: int) -> Iterator[pa.RecordBatch]:
        streams = self.streams(groups)
        if self._fragment is not None and not streams:
            fragment = self._fragment.subset(row_group_ids=groups)
            # Read ahead no further than the next batch: each batch held is memory of the read's.
            batches = fragment.to_batches(columns=columns, batch_size=batch_rows, batch_readahead=1, use_threads=False)
            return iter(batches)
        parquet = self._fetching if self._fetching is not None and not streams else self._file
        return parquet.iter_batches(batch_size=batch_rows, row_groups=groups, columns=columns, use_threads=False)

    def decoded_bytes(self, groups: list[int], columns: list[str]) -> int:
        if self._leaves is None:  # an unusual schema: every column of the groups
            return int(self.sizes[groups].sum())
        leaves = self._leaves_of(columns)
        return int(sum(self._leaf_bytes(number)[0][leaves].sum() for number in groups))

    def _leaves_of(self, columns: list[str]) -> list[int] | slice:
        """The leaf columns of `columns` (all of them when the schema's leaves are not known)."""
        if self._leaves is None:
            return slice(None)
        return [leaf for name in columns for leaf in self._leaves.get(name, ())]

    def _leaf_bytes(self, number: int) -> tuple[np.ndarray, np.ndarray]:
        """Uncompressed and compressed bytes of each leaf column of row group `number` (read from the footer
        once)."""
        found = self._leaf_sizes.get(number)
        if found is None:
            group = self._metadata.row_group(number)
            chunks = [group.column(leaf) for leaf in range(group.num_columns)]
            found = self._leaf_sizes[number] = (
                np.array([chunk.total_uncompressed_size for chunk in chunks], dtype=np.int64),
                np.array([chunk.total_compressed_size for chunk in chunks], dtype=np.int64),
            )
        return found

    def read_plan(self, groups: np.ndarray) -> list[list[int]]:
        if not self.remote:
            return [[group] for group in groups.tolist()]
        plan: list[list[int]] = []
        for run in _runs_within(groups.tolist(), self.sizes, REMOTE_READ_BYTES):
            read = [run[0]]
            for group in run[1:]:  # a read fetches its span of the file whole: keep it bounded
                if self.spans[group, 1] - self.spans[read[0], 0] <= REMOTE_SPAN_BYTES:
                    read.append(group)
                else:
                    plan.append(read)
                    read = [group]
            plan.append(read)
        return plan

    def fetched_bytes(self, groups: list[int], columns: list[str]) -> int:
        """Bytes of the file a read of `groups` may fetch and hold: for an object's row groups fetched whole, their
        span (gaps included); for one streamed, a buffer of each column chunk read, at most the chunk."""
        if not self.remote:
            return 0
        if self.streams(groups):
            chunks = self._leaf_bytes(groups[0])[1][self._leaves_of(columns)]
            return int(np.minimum(chunks, REMOTE_BUFFER_BYTES).sum())
        return int(self.spans[groups[-1], 1] - self.spans[groups[0], 0])


def check_version(path: DatasetPath, etag: str, found: str | None = None) -> None:
    """`SourceReplaced` unless object `path` is version `etag` (a local file, or no `etag`: nothing to check).
    `found` is the ETag an open just reported; without it the store is asked now (a HEAD). The store has no
    conditional ranged reads here, so a read is checked on both sides: the HEAD that opened the object before its
    ranged GETs, and one more after them. With the store's read-after-write consistency, an object showing the
    same ETag before and after was not replaced in between (unless replaced and restored to the very same
    content). A replacement found renews the root's listing now, so the index is rebuilt from the new object."""
    if not etag or not isinstance(path, RemotePath):
        return
    if found is None:
        with store_reads(path):
            found = path.current_etag()
    if found and found != etag:
        path.store.renew_now(path.root)
        raise SourceReplaced(f"{path} was replaced (ETag {found}, fingerprinted {etag})")


def parquet_files(root: DatasetPath, under: DatasetPath) -> list[str]:
    """Parquet files below `under` (no hidden dirs, no symlinks leaving `root`), relative to `root`, sorted."""
    if not under.is_dir():
        return []
    real_root = root.resolve()
    found = []
    for path in under.rglob("*.parquet"):
        rel = path.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or rel.parts[0] == "meta":
            continue
        if not path.resolve().is_relative_to(real_root) or not path.is_file():
            continue
        found.append(rel.as_posix())
    return sorted(found)


def data_files(root: DatasetPath, supply: FileSupply) -> list[str]:
    """A LeRobot dataset's data files (`data/**/*.parquet`), relative to `root`, sorted: those its supply lists
    where it fetches files as reads need them, else those on disk."""
    listed = supply.listed("data/")
    if listed is None:
        return parquet_files(root, root / "data")
    visible = (rel for rel in listed if not any(part.startswith(".") for part in rel.split("/")))
    return sorted(rel for rel in visible if rel.endswith(".parquet"))


def has_parquet_files(path: DatasetPath) -> bool:
    """Parquet files directly in `path` or anywhere under its `data/`."""
    if any(p.suffix == ".parquet" and p.is_file() for p in _safe_iterdir(path)):
        return True
    data = path / "data"
    return data.is_dir() and any(data.rglob("*.parquet"))


def read_parquet_rows(path: DatasetPath, columns: list[str]) -> list[dict[str, Any]]:
    """The given columns of a (small, metadata) parquet file as Python rows."""
    with opened_parquet(path) as handle:
        return _read_whole(handle, columns).to_pylist()


def read_parquet_table(path: DatasetPath) -> pa.Table:
    """A whole (small, metadata) parquet file. (`pq.read_table` would import pandas, seconds on a first request.)"""
    with opened_parquet(path) as handle:
        return _read_whole(handle, None)


def open_parquet_file(source: Any, **options: Any) -> pq.ParquetFile:
    """`pq.ParquetFile(source, **options)`, through a footer this pyarrow reads every column with (a fixed-size list
    column holding nulls, before pyarrow 26: see `app.sources.fixed_lists`); its batches may then hold plain lists
    where the file has fixed-size ones, which `conform_batch` casts back."""
    parquet = pq.ParquetFile(source, **options)
    footer = readable_footer(parquet.metadata)
    return parquet if footer is None else pq.ParquetFile(source, metadata=footer, **options)


def _read_whole(handle: Any, columns: list[str] | None) -> pa.Table:
    parquet = pq.ParquetFile(handle)
    footer = readable_footer(parquet.metadata)
    if footer is None:
        return parquet.read(columns=columns)
    table = pq.ParquetFile(handle, metadata=footer).read(columns=columns)
    stored = parquet.schema_arrow
    return as_stored(table, pa.schema([stored.field(name) for name in table.column_names], metadata=stored.metadata))


def parquet_column_names(path: DatasetPath) -> list[str]:
    with opened_parquet(path) as handle:
        return pq.read_schema(handle).names


def _batches_by_row_group(
    handle: Any, metadata: pq.FileMetaData, batch_rows: int, read_bytes: int
) -> Iterator[pa.RecordBatch]:
    """Every row of an object's parquet file (`handle`, read through `metadata`) in batches of `batch_rows`, read a
    few neighbouring row groups at a time (up to `read_bytes` decoded): their column chunks arrive in a few
    coalesced ranged GETs (pre-buffered) and are let go once decoded, so memory holds about that much and one
    batch (pre-buffering the whole file at once would hold all of it), and a file of many small row groups
    (LeRobot writes one per episode) is not one request per row group. A row group larger than `read_bytes` is
    not fetched whole (it would be held whole): it is streamed as a local file is, each column chunk through a
    buffer of `REMOTE_BUFFER_BYTES`. The batches are cut exactly as a local file's `iter_batches` cuts them
    (across row groups), so a segment built from the store is byte for byte the one built from a local copy."""
    sizes = np.array([metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups)])
    pending: list[pa.RecordBatch] = []
    pending_rows = 0
    for groups in _runs_within(list(range(metadata.num_row_groups)), sizes, read_bytes):
        whole = len(groups) > 1 or sizes[groups[0]] <= read_bytes
        options = {"pre_buffer": True} if whole else {"pre_buffer": False, "buffer_size": REMOTE_BUFFER_BYTES}
        # A reader per read: a pre-buffered one keeps what it fetched until it goes.
        reader = pq.ParquetFile(handle, metadata=metadata, **options)
        for piece in reader.iter_batches(batch_size=batch_rows, row_groups=groups, use_threads=False):
            pending.append(piece)
            pending_rows += piece.num_rows
            while pending_rows >= batch_rows:
                taken, rest = _split_rows(pending, batch_rows)
                yield _one_batch(taken)
                pending, pending_rows = rest, pending_rows - batch_rows
    if pending_rows:
        yield _one_batch(pending)


def _byte_span(group: pq.RowGroupMetaData) -> tuple[int, int]:
    """Where a row group's column chunks lie in the file: [first byte, end)."""
    starts, ends = [], []
    for i in range(group.num_columns):
        chunk = group.column(i)
        first = chunk.data_page_offset
        if chunk.has_dictionary_page and chunk.dictionary_page_offset is not None:
            first = min(first, chunk.dictionary_page_offset)
        starts.append(first)
        ends.append(first + chunk.total_compressed_size)
    return (min(starts), max(ends)) if starts else (0, 0)


def _runs_within(groups: list[int], sizes: np.ndarray, limit: int) -> list[list[int]]:
    """`groups` (ascending) in order, cut into lists of at most `limit` decoded bytes together (a larger group
    alone). One read of a list fetches its groups' ranges together: neighbours in coalesced GETs, the others side
    by side (pyarrow's pre-buffering), not one after the other."""
    runs: list[list[int]] = []
    total = 0
    for group in groups:
        size = int(sizes[group])
        if runs and total + size <= limit:
            runs[-1].append(group)
            total += size
        else:
            runs.append([group])
            total = size
    return runs


def _split_rows(batches: list[pa.RecordBatch], rows: int) -> tuple[list[pa.RecordBatch], list[pa.RecordBatch]]:
    """The first `rows` rows of `batches`, and the rest (zero-copy slices)."""
    taken: list[pa.RecordBatch] = []
    for number, batch in enumerate(batches):
        if batch.num_rows >= rows:
            taken.append(batch.slice(0, rows))
            rest = [batch.slice(rows)] if batch.num_rows > rows else []
            return taken, rest + batches[number + 1 :]
        taken.append(batch)
        rows -= batch.num_rows
    return taken, []


def _one_batch(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(batches) == 1:
        return batches[0]
    combined = pa.Table.from_batches(batches).combine_chunks().to_batches()
    return combined[0] if combined else batches[0].slice(0, 0)


def _rows_per_batch(metadata: pq.FileMetaData, batch_bytes: int) -> int:
    if metadata.num_rows == 0:
        return 1
    uncompressed = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
    per_row = max(1, uncompressed // metadata.num_rows)
    return int(max(1, min(_MAX_BATCH_ROWS, batch_bytes // per_row)))


def _safe_iterdir(path: DatasetPath) -> list[Any]:
    try:
        return list(path.iterdir())
    except OSError:
        return []


def _leaf_columns(schema: pa.Schema, leaves: int) -> dict[str, range] | None:
    """The parquet leaf columns of each top-level column of `schema` (nested types have several), or None when they
    do not add up to the file's `leaves`."""
    found: dict[str, range] = {}
    start = 0
    for field in schema:
        count = _leaf_count(field.type)
        found[field.name] = range(start, start + count)
        start += count
    return found if start == leaves else None


def _leaf_count(kind: pa.DataType) -> int:
    if isinstance(kind, pa.ExtensionType):
        return _leaf_count(kind.storage_type)
    if pa.types.is_struct(kind):
        return sum(_leaf_count(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_map(kind):
        return _leaf_count(kind.key_type) + _leaf_count(kind.item_type)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _leaf_count(kind.value_type)
    return 1
