"""The read service: every row read (slices, takes, windows), with its limits and ETags, for the routes, the fast
lane, the cache commands and the CLI alike.

A read resolves its episode selection to a view of the current index snapshot, checks the limits, gathers the
rows (zero-copy slices of the memory-mapped segments, or a take: see `app.reads.takes`), applies temporal windows
and returns an `Answer`: the schema, the record batches and the headers that describe them. Encoding the answer
for the wire is the caller's business (`app.api.arrow_response`).

`may_block=False` asks for a read that is quick enough to run on an event loop: when it would load the index,
map or build a segment, read a source file, reload changed sources, compute the windows of a slice, decode camera
frames or gather more than `inline_read_bytes`, it raises `WouldBlock` before doing any of that.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from app.errors import InvalidInput, OverLimit, WouldBlock
from app.reads.episode_spec import EpisodeRanges, format_ranges, resolve_episodes
from app.reads.frame_references import frame_references
from app.reads.frames import frame_columns, locate_rows, view_schema
from app.reads.pending_copies import PendingCopies
from app.reads.requests import SliceRequest, TakeRequest
from app.reads.takes import project, take_rows
from app.reads.windows import (
    DEFAULT_TOLERANCE_S,
    PAD_SUFFIX,
    WindowRequest,
    WindowSpec,
    as_windows,
    pad_column,
    parse_windows,
    window_targets,
)
from app.store.dataset import Dataset
from app.store.episode_index import EpisodeIndex
from app.store.views import EpisodeView


@dataclass(frozen=True)
class Answer:
    """Rows to send: `schema`, the batches (zero-copy over the maps where possible) and their `headers`.

    `unfilled_batches` may still lack `pending` rows, which an encoder sends from where they lie
    (`encode_stream(..., pending=answer.pending)`); `batches` has every row in place."""

    schema: pa.Schema
    unfilled_batches: list[pa.RecordBatch]
    headers: dict[str, str]
    codec: str | None = None  # IPC body compression, if asked for
    pending: PendingCopies | None = None

    @property
    def batches(self) -> list[pa.RecordBatch]:
        """The batches with every row in place (pending copies are made now)."""
        if self.pending is not None:
            self.pending.make()
        return self.unfilled_batches


@dataclass(frozen=True)
class NotModified:
    """The client's copy (If-None-Match) is current; `headers` describe it."""

    headers: dict[str, str]


@dataclass(frozen=True)
class RowSlice:
    """A contiguous slice of a view: zero-copy batches over the memory-mapped segments (camera frames from
    decoded-frame segments may be `pending`, see `Answer`)."""

    schema: pa.Schema
    batches: list[pa.RecordBatch]
    total_rows: int
    start: int
    stop: int
    digest: str
    pending: PendingCopies | None = None


@dataclass(frozen=True)
class SliceBounds:
    """The view rows a slice resolves to, and the snapshot it was resolved on."""

    total_rows: int
    start: int
    stop: int
    digest: str


@dataclass(frozen=True)
class RowTake:
    """Rows picked by view index, in the order asked (camera frames from decoded-frame segments may be
    `pending`, see `Answer`)."""

    table: pa.Table
    total_rows: int
    digest: str
    pending: PendingCopies | None = None


# -- requests ----------------------------------------------------------------------------------------------------


def answer_slice(
    dataset: Dataset, request: SliceRequest, if_none_match: str | None = None, may_block: bool = True
) -> Answer | NotModified:
    """A `GET`/`POST /rows` request: the slice, or `NotModified` when `if_none_match` names its ETag (answered
    from the view alone: a 304 never reads or builds a segment)."""
    limits = dataset.limits
    ranges = request.episode_ranges(limits)
    windows = request.windows()
    start, stop = request.start, request.stop
    if stop is not None and start > stop:
        raise InvalidInput(f"start ({start}) is greater than stop ({stop})")

    def headers_of(bounds: SliceBounds | RowSlice) -> dict[str, str]:
        query = [format_ranges(ranges) if ranges else "*", bounds.start, bounds.stop]
        query += [request.columns, windows, request.compression]
        return {
            "ETag": f'"{bounds.digest}-{hashlib.sha256("|".join(map(str, query)).encode()).hexdigest()[:16]}"',
            "X-Total-Rows": str(bounds.total_rows),
            "X-Start": str(bounds.start),
            "X-Stop": str(bounds.stop),
            "Cache-Control": "no-cache",
        }

    if if_none_match:
        headers = headers_of(slice_bounds(dataset, ranges, start, stop, may_block))
        if headers["ETag"] in [tag.strip() for tag in if_none_match.split(",")]:
            return NotModified(headers)
    selected = read_slice(
        dataset,
        ranges,
        start,
        stop,
        request.columns,
        limits.max_rows_per_response,
        windows,
        may_block,
        request.tolerance_s,
        defer_frames=True,
    )
    return Answer(selected.schema, selected.batches, headers_of(selected), request.codec, selected.pending)


def answer_take(dataset: Dataset, request: TakeRequest, may_block: bool = True) -> Answer:
    """A `POST /rows/take` request."""
    limits = dataset.limits
    if len(request.indices) > limits.max_take_indices:
        raise OverLimit(
            f"{len(request.indices)} indices asked; the limit is {limits.max_take_indices} per request",
            limits.max_take_indices,
        )
    ranges = request.episode_ranges(limits)
    taken = take(
        dataset,
        ranges,
        request.indices,
        request.columns,
        request.windows(),
        may_block,
        request.tolerance_s,
        defer_frames=True,
        reference_frames=request.frames == "references",
    )
    batches = [b for b in taken.table.to_batches() if b.num_rows]
    headers = {"X-Total-Rows": str(taken.total_rows)}
    return Answer(taken.table.schema, batches, headers, request.codec, taken.pending)


def files_needed(dataset: Dataset, episodes: EpisodeRanges | None) -> list[int]:
    """Source file numbers holding rows of the selected episodes (what warming them builds)."""
    index = dataset.index()
    return sorted(set(np.unique(view_of(dataset, index, episodes).run_file).tolist()))


# -- rows of a view ----------------------------------------------------------------------------------------------


def view_of(dataset: Dataset, index: EpisodeIndex, episodes: EpisodeRanges | None) -> EpisodeView:
    """The view of the selected episodes (all when None)."""
    if episodes is None:
        return dataset.full_view(index)
    if not index.has_episode_column:
        raise InvalidInput(
            f"dataset {dataset.id!r} has no episode column {dataset.episode_column!r}: it is one episode; "
            "omit `episodes`"
        )
    return EpisodeView.of(index, resolve_episodes(episodes, index.episodes))


def slice_bounds(
    dataset: Dataset, episodes: EpisodeRanges | None, start: int, stop: int | None, may_block: bool = True
) -> SliceBounds:
    """What `read_slice` would serve, without touching any segment. The source files the slice covers are
    checked first, so a changed file never passes for unchanged."""

    def attempt(index: EpisodeIndex) -> SliceBounds:
        view = view_of(dataset, index, episodes)
        lo, hi = clamp(len(view), start, stop)
        dataset.ensure_fresh(index, {file for file, _, _ in view.spans(lo, hi)})
        return SliceBounds(len(view), lo, hi, index.digest)

    return dataset.with_fresh_index(attempt, may_block)


def read_slice(
    dataset: Dataset,
    episodes: EpisodeRanges | None,
    start: int,
    stop: int | None,
    columns: list[str] | None,
    max_rows: int,
    windows: WindowRequest | None = None,
    may_block: bool = True,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    defer_frames: bool = False,
) -> RowSlice:
    """View rows [start, stop) (clamped to the view, like a Python slice) as zero-copy batches. Windowed
    columns, when asked for, are gathered and replace the stored column in the batches. With `defer_frames`,
    camera frames found in decoded-frame segments may be left `pending` (see `Answer`)."""

    def attempt(index: EpisodeIndex) -> RowSlice:
        view = view_of(dataset, index, episodes)
        names = check_columns(view_schema(dataset, index), columns)
        spec = _window_spec(dataset, index, windows)
        total = len(view)
        lo, hi = clamp(total, start, stop)
        if hi - lo > max_rows:
            raise OverLimit(
                f"the slice holds {hi - lo} rows; the limit is {max_rows} rows per response (page with start/stop)",
                max_rows,
            )
        _check_window_size(dataset, hi - lo, spec)
        _check_frame_bytes(dataset, hi - lo, names, spec)
        base = with_window_columns(names, spec)
        stored = _stored_columns(dataset, base)
        if not may_block and spec is not None:
            raise WouldBlock("the windows of a slice are computed off the event loop")
        spans = list(view.spans(lo, hi))
        dataset.ensure_fresh(index, {file for file, _, _ in spans})
        batches = [
            piece
            for file, first, end in spans
            for piece in dataset.segment(index, file, may_block).slice(first, end, stored)
        ]
        schema = project(index.schema, stored)
        pending = PendingCopies() if defer_frames else None
        if spec is not None or stored != base:
            table = pa.Table.from_batches(batches, schema)
            rows = np.arange(lo, hi, dtype=np.int64)
            table = _complete(dataset, index, view, rows, table, base, spec, tolerance_s, may_block, pending)
            schema, batches = table.schema, table.to_batches()
        return RowSlice(schema, batches, total, lo, hi, index.digest, pending or None)

    return dataset.with_fresh_index(attempt, may_block)


def take(
    dataset: Dataset,
    episodes: EpisodeRanges | None,
    rows: list[int],
    columns: list[str] | None,
    windows: WindowRequest | None = None,
    may_block: bool = True,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    defer_frames: bool = False,
    reference_frames: bool = False,
) -> RowTake:
    """Rows at view positions `rows`, in that order (duplicates allowed), windowed columns included. With
    `defer_frames`, camera frames found in decoded-frame segments may be left `pending` (see `Answer`); with
    `reference_frames`, cameras whose frames all lie in such segments come as references to them (see
    `app.reads.frame_references`)."""

    def attempt(index: EpisodeIndex) -> RowTake:
        view = view_of(dataset, index, episodes)
        names = check_columns(view_schema(dataset, index), columns)
        spec = _window_spec(dataset, index, windows)
        wanted = np.asarray(rows, dtype=np.int64)
        total = len(view)
        bad = wanted[(wanted < 0) | (wanted >= total)]
        if len(bad):
            shown = ", ".join(map(str, bad[:10].tolist()))
            raise InvalidInput(f"indices out of range [0, {total}): {shown}")
        _check_window_size(dataset, len(wanted), spec)
        _check_frame_bytes(dataset, len(wanted), names, spec)
        base = with_window_columns(names, spec)
        stored = _stored_columns(dataset, base)
        if not may_block and spec is not None and any(key in spec.offsets for key in dataset.info().videos):
            raise WouldBlock("windows of camera frames are decoded off the event loop")
        table = take_rows(dataset, index, view, wanted, stored, may_block)
        pending = PendingCopies() if defer_frames else None
        if spec is not None or stored != base:
            table = _complete(
                dataset, index, view, wanted, table, base, spec, tolerance_s, may_block, pending, reference_frames
            )
        return RowTake(table, total, index.digest, pending or None)

    return dataset.with_fresh_index(attempt, may_block)


# -- windows -----------------------------------------------------------------------------------------------------


def _window_spec(dataset: Dataset, index: EpisodeIndex, windows: WindowRequest | None) -> WindowSpec | None:
    if windows is None:
        return None
    return parse_windows(
        windows.delta_timestamps,
        fps=dataset.info().fps,
        schema=view_schema(dataset, index),
        tolerance_s=windows.tolerance_s,
        max_offsets=dataset.limits.max_window_offsets,
    )


def _check_window_size(dataset: Dataset, rows: int, spec: WindowSpec | None) -> None:
    limit = dataset.limits.max_window_values
    if spec is not None and rows * spec.widest > limit:
        raise OverLimit(
            f"{rows} rows x {spec.widest} offsets is {rows * spec.widest} window values; "
            f"the limit is {limit} per request",
            limit,
        )


def _check_frame_bytes(dataset: Dataset, rows: int, names: list[str] | None, spec: WindowSpec | None) -> None:
    """A 413 stating how many rows fit when the camera frames asked for (a window's frames each count) would
    hold more than `max_frame_bytes`: decoded frames are built in memory, unlike stored rows."""
    cameras = dataset.info().videos
    windowed = spec.offsets if spec is not None else {}
    frames_per_row = {key: len(windowed[key]) if key in windowed else 1 for key in cameras}
    per_row = sum(
        feature.height * feature.width * feature.channels * frames_per_row[key]
        for key, feature in cameras.items()
        if key in windowed or key in (names or ())
    )
    limit = dataset.limits.max_frame_bytes
    if per_row and rows * per_row > limit:
        fit = limit // per_row
        raise OverLimit(
            f"{rows} rows of camera frames are {rows * per_row} bytes decoded; the limit is {limit} bytes per "
            f"response ({fit} rows; EPISERVE_MAX_FRAME_BYTES)",
            fit,
        )


def _apply_windows(
    dataset: Dataset,
    index: EpisodeIndex,
    view: EpisodeView,
    rows: np.ndarray,
    table: pa.Table,
    spec: WindowSpec,
    tolerance_s: float,
    may_block: bool = True,
) -> pa.Table:
    """Replace each windowed column by its windows and append the `<column>_is_pad` masks."""
    lo, hi = view.episode_bounds(rows)
    pads = []
    cameras = dataset.info().videos
    for column, offsets in spec.offsets.items():
        targets, pad = window_targets(rows, lo, hi, offsets)
        if column in cameras:
            values = frame_columns(dataset, index, view, targets.reshape(-1), [column], tolerance_s)[column]
        else:
            values = take_rows(dataset, index, view, targets.reshape(-1), [column], may_block)[column].combine_chunks()
        position = table.schema.get_field_index(column)
        windowed = _camera_windows(values, len(offsets)) if column in cameras else as_windows(values, len(offsets))
        if position < 0:
            table = table.append_column(pa.field(column, windowed.type), windowed)
        else:
            table = table.set_column(position, pa.field(column, windowed.type), windowed)
        pads.append((column + PAD_SUFFIX, pad_column(pad)))
    for name, mask in pads:
        table = table.append_column(pa.field(name, mask.type), mask)
    return table


def _camera_windows(frames: pa.FixedShapeTensorArray, width: int) -> pa.FixedShapeTensorArray:
    """Frames gathered row-major (n * width) as one (width, height, width, channels) tensor per row."""
    if len(frames) == 0:  # pyarrow cannot build a tensor array from an empty ndarray (a count: `stop=0`)
        kind = pa.fixed_shape_tensor(frames.type.value_type, [width, *frames.type.shape])
        storage = pa.FixedSizeListArray.from_arrays(pa.array([], frames.type.value_type), kind.storage_type.list_size)
        return pa.ExtensionArray.from_storage(kind, storage)
    stacked = frames.to_numpy_ndarray()
    return pa.FixedShapeTensorArray.from_numpy_ndarray(stacked.reshape(-1, width, *stacked.shape[1:]))


# -- camera frames -----------------------------------------------------------------------------------------------


def _stored_columns(dataset: Dataset, names: list[str] | None) -> list[str] | None:
    """The stored columns of a selection (None: all of them); when it names only cameras, the episode column,
    which locates their frames (dropped from the answer)."""
    if names is None:
        return None
    cameras = dataset.info().videos
    stored = [name for name in names if name not in cameras]
    return stored if stored or len(stored) == len(names) else [dataset.episode_column]


def _complete(
    dataset: Dataset,
    index: EpisodeIndex,
    view: EpisodeView,
    rows: np.ndarray,
    table: pa.Table,
    names: list[str] | None,
    spec: WindowSpec | None,
    tolerance_s: float,
    may_block: bool = True,
    pending: PendingCopies | None = None,
    reference_frames: bool = False,
) -> pa.Table:
    """The stored columns of view `rows` in `table`, completed: camera frames decoded (or left `pending` where
    a decoded-frame segment holds them, or with `reference_frames` referenced there), windows applied, and the
    columns in the order asked (windows' `<column>_is_pad` masks last)."""
    cameras = dataset.info().videos
    windowed = spec.offsets if spec is not None else {}
    plain = [name for name in names or [] if name in cameras and name not in windowed]
    located = None
    if plain and reference_frames and len(rows) and dataset.limits.video_cache_policy != "on-demand":
        located = locate_rows(dataset, index, view, rows, may_block)
        source = dataset.source()
        for key in list(plain):
            referenced = frame_references(dataset, source, source.info.videos[key], located, tolerance_s, may_block)
            if referenced is not None:
                table = table.append_column(*referenced)
                plain.remove(key)
    if plain:
        columns = frame_columns(dataset, index, view, rows, plain, tolerance_s, pending, may_block, located)
        for key, frames in columns.items():
            table = table.append_column(pa.field(key, frames.type), frames)
    if spec is not None:
        table = _apply_windows(dataset, index, view, rows, table, spec, tolerance_s, may_block)
    order = names if names is not None else [*index.schema.names, *(c for c in windowed if c in cameras)]
    pads = [column + PAD_SUFFIX for column in windowed]
    return table.select([*order, *pads])


# -- selections --------------------------------------------------------------------------------------------------


def clamp(total: int, start: int, stop: int | None) -> tuple[int, int]:
    """[start, stop) clamped to a view of `total` rows, like a Python slice of non-negative bounds."""
    return min(start, total), total if stop is None else min(stop, total)


def check_columns(schema: pa.Schema, columns: list[str] | None) -> list[str] | None:
    """Validate a column selection: known names, no duplicates, not empty."""
    if columns is None:
        return None
    if not columns:
        raise InvalidInput("columns selection is empty; omit it to get every column")
    unknown = [c for c in columns if c not in schema.names]
    if unknown:
        raise InvalidInput(f"unknown columns: {', '.join(map(repr, unknown))}; available: {schema.names}")
    duplicated = sorted({c for c in columns if columns.count(c) > 1})
    if duplicated:
        raise InvalidInput(f"columns listed more than once: {', '.join(map(repr, duplicated))}")
    return columns


def with_window_columns(columns: list[str] | None, spec: WindowSpec | None) -> list[str] | None:
    """The selection plus any windowed column it left out (windows are always returned)."""
    if columns is None or spec is None:
        return columns
    return columns + [c for c in spec.offsets if c not in columns]
