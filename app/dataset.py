"""A served dataset: its layout, episode index and segment store, and the row reads the API exposes.

Every read works on one snapshot of the episode index. Source files a read touches are checked against the
snapshot's fingerprints first; when one changed, the index is reloaded and the read starts over, so a stale
row is never served. Every `rescan_interval_s`, the dataset's directories, metadata files and source files are
stat'ed again, so files added, removed or rewritten are noticed (and the index rebuilt) without a restart.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from app.cold_reads import ParquetRows
from app.episode_index import EpisodeIndex, load_or_build_index
from app.episode_spec import EpisodeRanges, resolve_episodes
from app.errors import DatasetError, InvalidRequest, TooLarge, Unavailable, WouldBlock
from app.gather import gather
from app.layouts import Layout, read_layout, stamp, watched_paths
from app.segments import Segment, SegmentLRU, SegmentStore, SourceChanged
from app.settings import Settings
from app.views import EpisodeView
from app.windows import PAD_SUFFIX, WindowRequest, WindowSpec, as_windows, pad_column, parse_windows, window_targets

_ATTEMPTS = 3
_ROW_SLICE_MAX = 4096  # up to this many wide rows, gather by per-row slices (see _gather_row_slices)
_WIDE_ROW_BYTES = 2048
T = TypeVar("T")
log = logging.getLogger("episerve.cache")


@dataclass(frozen=True)
class RowSlice:
    """A contiguous slice of a view: zero-copy batches over the memory-mapped segments."""

    schema: pa.Schema
    batches: list[pa.RecordBatch]
    total_rows: int
    start: int
    stop: int
    digest: str


@dataclass(frozen=True)
class SliceBounds:
    """The view rows a slice request resolves to, and the snapshot it was resolved on."""

    total_rows: int
    start: int
    stop: int
    digest: str


@dataclass(frozen=True)
class RowTake:
    """Rows picked by view index, in the order asked."""

    table: pa.Table
    total_rows: int
    digest: str


class Dataset:
    """One dataset directory under a root, with its cache directory."""

    def __init__(
        self,
        dataset_id: str,
        path: Path,
        cache_dir: Path,
        episode_column: str,
        lru: SegmentLRU,
        limits: Settings,
    ) -> None:
        self.id = dataset_id
        self.path = path
        self.cache_dir = cache_dir
        self.default_episode_column = episode_column
        self.episode_column = episode_column
        self.limits = limits
        self.segments = SegmentStore(cache_dir / "segments", path, lru, limits.build_batch_bytes, limits.verify_on_open)
        self._lock = threading.Lock()
        self._layout: Layout | None = None
        self._index: EpisodeIndex | None = None
        self._watched: list[str] = []
        self._stamp: tuple = ()
        self._looking = threading.Lock()
        self._looked_at = 0.0  # time.monotonic() of the last look at the files
        self.checked_at: float | None = None  # epoch seconds of the same moment

    @staticmethod
    def cache_key(dataset_id: str, path: Path) -> str:
        """Directory name of the dataset's cache: readable, and distinct for distinct source directories."""
        digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
        return f"{dataset_id.replace('/', '__')}-{digest}"

    def layout(self) -> Layout:
        """The layout the current index was read with."""
        if self._layout is None:
            self.index()
        assert self._layout is not None
        return self._layout

    def index(self) -> EpisodeIndex:
        """The current episode index snapshot, opened on first use, and re-checked against the files on disk
        when `rescan_interval_s` has passed since the last look."""
        with self._lock:
            if self._index is None:
                self._load()
            index = self._index
        assert index is not None
        return self._look_again(index) if self._look_due() else index

    def _load(self) -> None:
        """Read the layout and the index (the caller holds `_lock`). The directories are stamped before they are
        listed, so a file added meanwhile is noticed at the next look."""
        self._mark_looked()
        watched = watched_paths(self.path)
        stamped = stamp(watched)
        layout = read_layout(self.path)
        column = layout.episode_column or self.default_episode_column
        self._index = load_or_build_index(self.path, layout, column, self.cache_dir / "index.json")
        self._layout, self.episode_column, self._watched, self._stamp = layout, column, watched, stamped

    def _mark_looked(self) -> None:
        self._looked_at, self.checked_at = time.monotonic(), time.time()

    def _look_due(self) -> bool:
        return time.monotonic() - self._looked_at >= self.limits.rescan_interval_s

    def _look_again(self, index: EpisodeIndex) -> EpisodeIndex:
        """`index`, or a rebuilt one when files were added, removed or changed since it was read. One thread looks
        at a time; the others go on with the snapshot they have."""
        if not self._looking.acquire(blocking=False):
            return index
        try:
            self._mark_looked()
            if stamp(self._watched) == self._stamp and self._sources_unchanged(index):
                return index
            log.info("dataset %s: source files or metadata changed; re-reading its index", self.id)
            with self._lock:
                if self._index is index:
                    try:
                        self._load()
                    except DatasetError as exc:  # e.g. a file still being written: keep the snapshot, look again
                        log.warning("dataset %s: cannot re-read its index yet: %s", self.id, exc.detail)
                        self._index = index
                return self._index or index
        finally:
            self._looking.release()

    def _sources_unchanged(self, index: EpisodeIndex) -> bool:
        try:
            self._ensure_fresh(index, range(len(index.files)))
        except SourceChanged:
            return False
        return True

    def reload(self, seen: EpisodeIndex | None = None) -> EpisodeIndex:
        """Re-read the layout and fingerprints (unless another thread already replaced `seen`)."""
        with self._lock:
            if seen is None or self._index is seen:
                self._index = None
        return self.index()

    def resolve(self, index: EpisodeIndex, episodes: EpisodeRanges | None) -> EpisodeView:
        """The view of the selected episodes (all when None)."""
        if episodes is None:
            return index.full_view
        if not index.has_episode_column:
            raise InvalidRequest(
                f"dataset {self.id!r} has no episode column {self.episode_column!r}: it is one episode; omit `episodes`"
            )
        return EpisodeView.of(index, resolve_episodes(episodes, index.episodes))

    def slice_bounds(self, episodes: EpisodeRanges | None, start: int, stop: int | None) -> SliceBounds:
        """What `read_slice` would serve, without touching any segment (for conditional requests).

        The source files the slice covers are checked first, so a changed file never passes for unchanged.
        """

        def attempt(index: EpisodeIndex) -> SliceBounds:
            view = self.resolve(index, episodes)
            lo, hi = clamp(len(view), start, stop)
            self._ensure_fresh(index, {file for file, _, _ in view.spans(lo, hi)})
            return SliceBounds(len(view), lo, hi, index.digest)

        return self._with_fresh_index(attempt)

    def read_slice(
        self,
        episodes: EpisodeRanges | None,
        start: int,
        stop: int | None,
        columns: list[str] | None,
        max_rows: int,
        windows: WindowRequest | None = None,
        inline: bool = False,
    ) -> RowSlice:
        """View rows [start, stop) (clamped to the view, like a Python slice) as zero-copy batches.

        Windowed columns, when asked for, are gathered and replace the stored column in the batches. With
        `inline`, the slice must be quick enough to run on an event loop: when it would load the index, map or
        build a segment, reload changed sources or compute windows, it raises `WouldBlock` before doing any of
        that.
        """

        def attempt(index: EpisodeIndex) -> RowSlice:
            view = self.resolve(index, episodes)
            names = check_columns(index.schema, columns)
            spec = self._window_spec(index, windows)
            total = len(view)
            lo, hi = clamp(total, start, stop)
            if hi - lo > max_rows:
                raise TooLarge(
                    f"the slice holds {hi - lo} rows; the limit is {max_rows} rows per response (page with start/stop)",
                    max_rows,
                )
            self._check_window_size(hi - lo, spec)
            if inline and spec is not None:
                raise WouldBlock("windows are computed off the event loop")
            spans = list(view.spans(lo, hi))
            self._ensure_fresh(index, {file for file, _, _ in spans})
            base = with_window_columns(names, spec)
            batches = [
                piece
                for file, first, end in spans
                for piece in self._segment(index, file, inline).slice(first, end, base)
            ]
            schema = project(index.schema, base)
            if spec is not None:
                table = pa.Table.from_batches(batches, schema)
                table = self._apply_windows(index, view, np.arange(lo, hi, dtype=np.int64), table, spec)
                schema, batches = table.schema, table.to_batches()
            return RowSlice(schema, batches, total, lo, hi, index.digest)

        return self._with_fresh_index(attempt, waits=not inline)

    def _segment(self, index: EpisodeIndex, number: int, mapped_only: bool) -> Segment:
        """The segment of source file `number`; with `mapped_only`, only if this process has it mapped already
        (else `WouldBlock`)."""
        source = index.files[number]
        if not mapped_only:
            return self.segments.open(source, index.schema)
        segment = self.segments.opened(source)
        if segment is None:
            raise WouldBlock(f"segment of {source.path} is not mapped yet")
        return segment

    def take(
        self,
        episodes: EpisodeRanges | None,
        rows: list[int],
        columns: list[str] | None,
        windows: WindowRequest | None = None,
        inline_bytes: int | None = None,
    ) -> RowTake:
        """Rows at view positions `rows`, in that order (duplicates allowed), windowed columns included.

        With `inline_bytes`, the take must be quick enough to run on an event loop: when it would load the
        index, map or build a segment, read parquet, reload changed sources, or gather more than about
        `inline_bytes` bytes, it raises `WouldBlock` before doing any of that.
        """

        def attempt(index: EpisodeIndex) -> RowTake:
            view = self.resolve(index, episodes)
            names = check_columns(index.schema, columns)
            spec = self._window_spec(index, windows)
            wanted = np.asarray(rows, dtype=np.int64)
            total = len(view)
            bad = wanted[(wanted < 0) | (wanted >= total)]
            if len(bad):
                shown = ", ".join(map(str, bad[:10].tolist()))
                raise InvalidRequest(f"indices out of range [0, {total}): {shown}")
            self._check_window_size(len(wanted), spec)
            table = self._gather(index, view, wanted, with_window_columns(names, spec), inline_bytes)
            if spec is not None:
                table = self._apply_windows(index, view, wanted, table, spec, inline_bytes)
            return RowTake(table, total, index.digest)

        return self._with_fresh_index(attempt, waits=inline_bytes is None)

    def _gather(
        self,
        index: EpisodeIndex,
        view: EpisodeView,
        rows: np.ndarray,
        names: list[str] | None,
        inline_bytes: int | None = None,
    ) -> pa.Table:
        """View rows (in range) in the given order: sorted by segment and batch, taken, then put back in order."""
        files, stored = view.locate(rows)
        touched = np.unique(files).tolist()
        self._ensure_fresh(index, touched)
        schema = project(index.schema, names)
        if len(rows) == 0:
            return schema.empty_table()
        if inline_bytes is None:
            sources = self._row_sources(index, files, stored)
        else:
            sources = self._mapped_sources(index, touched, len(rows), names, inline_bytes)
        segments_only = all(isinstance(s, Segment) for s in sources.values())
        if segments_only:
            copied = self._gather_by_copy(sources, files, stored, touched, names, schema)
            if copied is not None:
                return copied
        if segments_only and len(rows) <= _ROW_SLICE_MAX and has_variable_width(schema):
            first = sources[int(files[0])]
            if first.row_bytes(names) >= _WIDE_ROW_BYTES:
                return self._gather_row_slices(sources, files, stored, names, schema)
        order = np.lexsort((stored, files))
        pieces: list[pa.RecordBatch] = []
        bounds = np.flatnonzero(np.diff(files[order])) + 1
        for group in np.split(order, bounds):
            source = sources[int(files[group[0]])]
            if isinstance(source, Segment):
                pieces.extend(source.take(stored[group], names))
            else:
                pieces.extend(self._cold_take(index, source, stored[group], names).to_batches())
        if not segments_only:
            self._ensure_fresh(index, touched)  # the parquet files read must not have changed meanwhile
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        return pa.Table.from_batches(pieces, schema=schema).take(pa.array(inverse))

    def _mapped_sources(
        self, index: EpisodeIndex, touched: list[int], rows: int, names: list[str] | None, inline_bytes: int
    ) -> dict[int, Segment | ParquetRows]:
        """The touched files' segments if all are mapped already and `rows` of them fit `inline_bytes`."""
        sources: dict[int, Segment | ParquetRows] = {}
        for number in touched:
            segment = self._segment(index, number, mapped_only=True)
            if rows * segment.row_bytes(names) > inline_bytes:
                raise WouldBlock(f"{rows} rows are more than {inline_bytes} bytes")
            sources[number] = segment
        return sources

    def _row_sources(
        self, index: EpisodeIndex, files: np.ndarray, stored: np.ndarray
    ) -> dict[int, Segment | ParquetRows]:
        """Per touched file, its segment; or, while the segment is not built yet, its parquet row groups (if they
        fit the cold-read budget) with a build queued in the background."""
        budget = self.limits.cold_read_bytes
        sources: dict[int, Segment | ParquetRows] = {}
        for number in np.unique(files).tolist():
            source = index.files[number]
            segment = self.segments.open_if_built(source, index.schema) if budget else None
            if segment is None and budget:
                try:
                    parquet = ParquetRows(self.path / source.path)
                except (OSError, pa.ArrowException) as exc:
                    raise SourceChanged(source.path) from exc
                cost = parquet.row_group_bytes(stored[files == number])
                if cost <= budget:
                    budget -= cost
                    sources[number] = parquet
                    self.segments.build_in_background(source, index.schema)
                    continue
            sources[number] = segment or self.segments.open(source, index.schema)
        return sources

    @staticmethod
    def _cold_take(index: EpisodeIndex, parquet: ParquetRows, rows: np.ndarray, names: list[str] | None) -> pa.Table:
        try:
            return parquet.take(rows, index.schema, names)
        except (OSError, IndexError, pa.ArrowException) as exc:  # the file changed under us: reload, retry
            raise SourceChanged(str(parquet.path)) from exc

    @staticmethod
    def _gather_by_copy(
        sources: dict[int, Segment | ParquetRows],
        files: np.ndarray,
        stored: np.ndarray,
        touched: list[int],
        names: list[str] | None,
        schema: pa.Schema,
    ) -> pa.Table | None:
        """Rows copied byte-wise from the maps straight into request order (see `app.gather`); None when a
        column cannot be copied so, or when too many rows would be copied one by one."""
        parts = []
        for number in touched:
            segment = sources[number]
            assert isinstance(segment, Segment)
            positions = np.flatnonzero(files == number)
            part = segment.gather_part(positions, stored[positions], names)
            if part is None:
                return None
            parts.append(part)
        if len(files) > _ROW_SLICE_MAX and parts[0].mapped.copies_row_by_row:
            return None
        return gather(schema, parts, len(files))

    def _gather_row_slices(
        self,
        sources: dict[int, Segment | ParquetRows],
        files: np.ndarray,
        stored: np.ndarray,
        names: list[str] | None,
        schema: pa.Schema,
    ) -> pa.Table:
        """Wide rows (images, strings) in request order: one zero-copy slice per row, then a single copy.

        Taking per stored batch and then reordering would copy every wide value twice; for the few hundred rows
        of a training batch, slicing row by row is the cheaper path.
        """
        pieces = [sources[f].row(r, names) for f, r in zip(files.tolist(), stored.tolist(), strict=True)]
        return pa.Table.from_batches([pa.concat_batches(pieces)], schema=schema)

    def _window_spec(self, index: EpisodeIndex, windows: WindowRequest | None) -> WindowSpec | None:
        if windows is None:
            return None
        return parse_windows(
            windows.delta_timestamps,
            fps=self.layout().fps,
            schema=index.schema,
            tolerance_s=windows.tolerance_s,
            max_offsets=self.limits.max_window_offsets,
        )

    def _check_window_size(self, rows: int, spec: WindowSpec | None) -> None:
        if spec is not None and rows * spec.widest > self.limits.max_window_values:
            raise TooLarge(
                f"{rows} rows x {spec.widest} offsets is {rows * spec.widest} window values; "
                f"the limit is {self.limits.max_window_values} per request",
                self.limits.max_window_values,
            )

    def _apply_windows(
        self,
        index: EpisodeIndex,
        view: EpisodeView,
        rows: np.ndarray,
        table: pa.Table,
        spec: WindowSpec,
        inline_bytes: int | None = None,
    ) -> pa.Table:
        """Replace each windowed column by its windows and append the `<column>_is_pad` masks."""
        lo, hi = view.episode_bounds(rows)
        pads = []
        for column, offsets in spec.offsets.items():
            targets, pad = window_targets(rows, lo, hi, offsets)
            values = self._gather(index, view, targets.reshape(-1), [column], inline_bytes)[column].combine_chunks()
            position = table.schema.get_field_index(column)
            windowed = as_windows(values, len(offsets))
            table = table.set_column(position, pa.field(column, windowed.type), windowed)
            pads.append((column + PAD_SUFFIX, pad_column(pad)))
        for name, mask in pads:
            table = table.append_column(pa.field(name, mask.type), mask)
        return table

    def _with_fresh_index(self, attempt: Callable[[EpisodeIndex], T], waits: bool = True) -> T:
        """`attempt` on the current index, reloaded and retried when a source file changed under it. Unless it
        `waits`, an index that still has to be loaded or reloaded raises `WouldBlock` instead."""
        index = self._index
        if index is None or self._look_due():
            if not waits:
                raise WouldBlock(f"the index of dataset {self.id!r} is not loaded yet, or its files are due a look")
            index = self.index()
        for _ in range(_ATTEMPTS):
            try:
                return attempt(index)
            except SourceChanged:
                if not waits:
                    raise WouldBlock(f"a source file of dataset {self.id!r} changed") from None
                index = self.reload(index)
        raise Unavailable(f"source files of dataset {self.id!r} keep changing; retry later")

    def _ensure_fresh(self, index: EpisodeIndex, files: Iterable[int]) -> None:
        root = str(self.path)
        for number in files:
            source = index.files[number]
            try:
                unchanged = source.same_file(os.stat(os.path.join(root, source.path)))
            except OSError:
                unchanged = False
            if not unchanged:
                raise SourceChanged(source.path)

    def cache_status(self) -> dict[str, Any]:
        """Segments built / total and their bytes on disk."""
        index = self.index()
        sizes = [self.segments.built_size(fp, index.schema) for fp in index.files]
        built = [size for size in sizes if size is not None]
        return {"segments_built": len(built), "segments_total": len(index.files), "bytes": sum(built)}


def clamp(total: int, start: int, stop: int | None) -> tuple[int, int]:
    """[start, stop) clamped to a view of `total` rows, like a Python slice of non-negative bounds."""
    return min(start, total), total if stop is None else min(stop, total)


def check_columns(schema: pa.Schema, columns: list[str] | None) -> list[str] | None:
    """Validate a column selection: known names, no duplicates, not empty."""
    if columns is None:
        return None
    if not columns:
        raise InvalidRequest("columns selection is empty; omit it to get every column")
    unknown = [c for c in columns if c not in schema.names]
    if unknown:
        raise InvalidRequest(f"unknown columns: {', '.join(map(repr, unknown))}; available: {schema.names}")
    duplicated = sorted({c for c in columns if columns.count(c) > 1})
    if duplicated:
        raise InvalidRequest(f"columns listed more than once: {', '.join(map(repr, duplicated))}")
    return columns


def has_variable_width(schema: pa.Schema) -> bool:
    """Whether any column holds variable-width values (binary, strings, variable lists), at any depth."""
    return any(_variable_width(field.type) for field in schema)


def _variable_width(kind: pa.DataType) -> bool:
    if pa.types.is_fixed_size_list(kind):
        return _variable_width(kind.value_type)
    if pa.types.is_struct(kind):
        return any(_variable_width(kind.field(i).type) for i in range(kind.num_fields))
    return (
        pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_list(kind)
        or pa.types.is_large_list(kind)
        or pa.types.is_binary_view(kind)
        or pa.types.is_string_view(kind)
    )


def with_window_columns(columns: list[str] | None, spec: WindowSpec | None) -> list[str] | None:
    """The selection plus any windowed column it left out (windows are always returned)."""
    if columns is None or spec is None:
        return columns
    return columns + [c for c in spec.offsets if c not in columns]


def project(schema: pa.Schema, columns: list[str] | None) -> pa.Schema:
    """`schema` restricted to `columns` (in that order), keeping its metadata."""
    if columns is None:
        return schema
    return pa.schema([schema.field(c) for c in columns], metadata=schema.metadata)
