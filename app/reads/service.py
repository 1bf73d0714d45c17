"""The read service: every row read (slices, takes, windows), with its limits and ETags, for the routes, the cache
commands and the CLI alike.

A read resolves its episode selection to a view of an index snapshot, checks the limits, gathers the rows
(zero-copy slices of the memory-mapped segments, or a take: see `app.reads.takes`), applies temporal windows and
returns an `Answer`: the schema, the record batches and the headers that describe them. Encoding the answer for
the wire is the caller's business (`app.api.arrow_response`).

Each request is one `RowRead`, read once. `quick()` decides, before a row is read, whether it can be answered on
the event loop (from segments this process has mapped: `ViewRead.answerable_from_maps`); `answer()` then reads
it, on the event loop when quick, else in the thread pool, where it may load the index, build or map segments,
read source files cold, compute windows and decode camera frames.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa

from app.errors import InvalidInput, OverLimit, WouldBlock
from app.reads.episode_spec import EpisodeRanges, format_ranges, resolve_episodes
from app.reads.frames import resized_cameras, view_schema
from app.reads.pending_copies import PendingCopies
from app.reads.pieces import Piece, RowPieces
from app.reads.requests import RowLayoutRequest, RowSelection, SliceRequest, TakeRequest
from app.reads.takes import project
from app.reads.view_read import ReadOptions, RowsNeeded, ViewRead
from app.reads.windows import WindowSpec, parse_windows
from app.sources.source import VideoFeature
from app.store.dataset import Dataset
from app.store.episode_index import EpisodeIndex
from app.store.segments import SourceChanged
from app.store.views import EpisodeView


@dataclass(frozen=True)
class Answer:
    """Rows to send: `schema`, the batches (zero-copy over the maps where possible) and their `headers`.

    The batches may still lack the `pending` rows, which an encoder sends from where they lie or copies into place
    first (`PendingCopies.make`): anything that reads the batches' data otherwise makes them first."""

    schema: pa.Schema
    batches: list[pa.RecordBatch]
    headers: dict[str, str]
    codec: str | None = None  # IPC body compression, if asked for
    pending: PendingCopies | None = None
    rest: RowPieces | None = None  # the rows after `batches`, computed piece by piece as they are sent
    owned: bool = True  # whether the batches hold memory of their own (False: zero-copy views of the maps)

    def whole(self) -> Answer:
        """The answer with every piece read and its pending copies made (for readers other than an encoder)."""
        if self.rest is None:
            return self
        if self.pending:
            self.pending.make()
        batches = list(self.batches)
        for piece in self.rest:
            if piece.pending:
                piece.pending.make()
            batches.extend(piece.batches)
        return replace(self, batches=batches, pending=None, rest=None)

    @property
    def row_count(self) -> int:
        """Rows of the whole answer, `rest` included."""
        return sum(b.num_rows for b in self.batches) + (self.rest.remaining if self.rest is not None else 0)


@dataclass(frozen=True)
class NotModified:
    """The client's copy (If-None-Match) is current; `headers` describe it."""

    headers: dict[str, str]


class RowRead:
    """One row request on one dataset, read once: on the snapshot its `quick()` decision was made on when that
    says it can be answered on the event loop, else (in the thread pool) on a fresh snapshot."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self._plan: _Plan | None = None
        self._quick = False

    def quick(self) -> bool:
        """Whether the read can be answered right away from what this process has mapped, decided before any row
        is read (a problem with the request is raised: the regular route words it)."""
        index = self.dataset.current_index()
        if index is None:
            return False
        self._plan = self._planned(index)
        self._quick = self._plan.decide()
        return self._quick

    def check(self) -> None:
        """Raise the request's problems (unknown columns, positions out of range, limits) on the current snapshot,
        loading the index if need be (it may block), without reading a row; `answer` reuses what it prepared while
        the snapshot stays the same."""
        if self._plan is None:
            self._plan = self._planned(self.dataset.index())

    def files_at_hand(self) -> None:
        """After `check`: make sure the data and video files the answer is read from can be opened (see
        `ViewRead.files_at_hand`). A file fetched since the snapshot was read is read again as the answer is."""
        assert self._plan is not None, "check() first"
        with contextlib.suppress(SourceChanged):
            self._plan.files_at_hand()

    @property
    def inline_bytes(self) -> int:
        """Bytes a quick read will copy, as `quick()` estimated them."""
        return self._plan.read.inline_bytes if self._plan is not None else 0

    @property
    def frame_bytes(self) -> int:
        """Bytes of the camera frames the read answers decoded, once `quick()` or `check()` has prepared it."""
        return self._plan.frame_bytes if self._plan is not None else 0

    @property
    def view_rows(self) -> int:
        """Rows in the read's view, once `quick()` or `check()` has prepared it."""
        assert self._plan is not None, "quick() or check() first"
        return len(self._plan.read.view)

    def answer(self) -> Answer | NotModified:
        """The answer: on the event loop when `quick()` said so, else on a fresh snapshot (in the thread pool),
        reusing what the decision prepared when the snapshot is the same."""
        plan = self._plan
        if plan is not None and self._quick:
            self._quick = False  # one answer on the decided snapshot; asked again (in the pool), made afresh
            try:
                return plan.answer()
            except SourceChanged as exc:  # since the decision: reloading is the thread pool's
                self._plan = None
                raise WouldBlock(f"a source file of dataset {self.dataset.id!r} changed") from exc
            except WouldBlock:
                self._plan = None
                raise
        return self.dataset.with_fresh_index(
            lambda index: (plan if plan is not None and plan.read.index is index else self._planned(index)).answer()
        )

    def _planned(self, index: EpisodeIndex) -> _Plan:
        raise NotImplementedError


class SliceRead(RowRead):
    """A `GET`/`POST /rows` request: the slice, or `NotModified` when `if_none_match` names its ETag (answered
    from the view alone: a 304 never reads or builds a segment)."""

    def __init__(self, dataset: Dataset, request: SliceRequest, if_none_match: str | None = None) -> None:
        super().__init__(dataset)
        if request.stop is not None and request.start > request.stop:
            raise InvalidInput(f"start ({request.start}) is greater than stop ({request.stop})")
        self.request, self.if_none_match = request, if_none_match
        self.ranges = request.episode_ranges(dataset.limits)

    def quick(self) -> bool:
        # Compressing is CPU work; a conditional read checks the sources' freshness first.
        if self.request.codec is not None or self.if_none_match is not None:
            return False
        return super().quick()

    def _planned(self, index: EpisodeIndex) -> _Plan:
        return _SlicePlan(self, _prepared(self.dataset, index, self.ranges, self.request))


class TakeRead(RowRead):
    """A `POST /rows/take` request."""

    def __init__(self, dataset: Dataset, request: TakeRequest) -> None:
        super().__init__(dataset)
        limit = dataset.limits.max_take_indices
        if len(request.indices) > limit:
            raise OverLimit(f"{len(request.indices)} indices asked; the limit is {limit} per request", limit)
        self.request = request
        self.ranges = request.episode_ranges(dataset.limits)

    def _planned(self, index: EpisodeIndex) -> _Plan:
        plan = _TakePlan(_prepared(self.dataset, index, self.ranges, self.request), self.request)
        return _RowReferencePlan(plan) if self.request.rows == "references" else plan


def answer_slice(dataset: Dataset, request: SliceRequest, if_none_match: str | None = None) -> Answer | NotModified:
    """A `GET`/`POST /rows` request, read whole (see `SliceRead`)."""
    answer = SliceRead(dataset, request, if_none_match).answer()
    return answer.whole() if isinstance(answer, Answer) else answer


def answer_take(dataset: Dataset, request: TakeRequest) -> Answer:
    """A `POST /rows/take` request, read whole (see `TakeRead`)."""
    answer = TakeRead(dataset, request).answer()
    assert isinstance(answer, Answer)
    return answer.whole()


def answer_row_layout(dataset: Dataset, request: RowLayoutRequest) -> dict[str, object]:
    """Where the rows of a view lie in the segment cache, for a client on the server's machine to take them by
    itself for a while (see `app.reads.row_references`); 422 when a column asked is a camera (not a stored
    column)."""
    selection = request.selection()
    ranges = selection.episode_ranges(dataset.limits)

    def layout(index: EpisodeIndex) -> dict[str, object]:
        prepared = _prepared(dataset, index, ranges, selection)
        if prepared.cameras_asked:
            raise InvalidInput(
                f"a row layout covers stored columns only; {prepared.cameras_asked[0]!r} is a camera (name the other "
                "columns, and take the camera's frames with frames=references)"
            )
        return prepared.read.row_layout(prepared.stored)

    return dataset.with_fresh_index(layout)


def files_needed(dataset: Dataset, episodes: EpisodeRanges | None) -> list[int]:
    """Source file numbers holding rows of the selected episodes (what warming them builds)."""
    index = dataset.index()
    return sorted(set(np.unique(view_of(dataset, index, episodes).run_file).tolist()))


# -- one request on one snapshot ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Prepared:
    """A request's selection checked on one snapshot: its read, the columns asked (`names`, None: all) with the
    windowed ones (`base`), the stored ones to gather (`stored`) and the windows."""

    read: ViewRead
    names: list[str] | None
    base: list[str] | None
    stored: list[str] | None
    spec: WindowSpec | None

    @property
    def plain_cameras(self) -> tuple[str, ...]:
        """The cameras asked for outside windows."""
        windowed = self.spec.offsets if self.spec is not None else {}
        return tuple(n for n in self.names or () if n in self.read.cameras and n not in windowed)

    @property
    def cameras_asked(self) -> list[str]:
        """The cameras among the columns asked (every camera when every column is), windowed or not."""
        cameras = self.read.cameras
        return [name for name in (self.names if self.names is not None else cameras) if name in cameras]

    @property
    def cameras_read(self) -> tuple[str, ...]:
        """Every camera whose frames the answer holds, in windows or not."""
        windowed = self.spec.offsets if self.spec is not None else {}
        return (*self.plain_cameras, *(key for key in windowed if key in self.read.cameras))

    def files_at_hand(self, rows: np.ndarray | range) -> None:
        """Make sure the data and video files of view `rows` can be opened (see `ViewRead.files_at_hand`)."""
        self.read.files_at_hand(RowsNeeded(rows, self.stored, False, self.cameras_read))

    def check_size(self, rows: int) -> int:
        """Problems for windows or camera frames of `rows` rows beyond the limits; the bytes of their frames."""
        _check_window_size(self.read.dataset, rows, self.spec)
        return _check_frame_bytes(self.read.dataset, self.read.cameras, rows, self.names, self.spec)


def _prepared(dataset: Dataset, index: EpisodeIndex, ranges: EpisodeRanges | None, request: RowSelection) -> _Prepared:
    view = view_of(dataset, index, ranges)
    names = check_columns(view_schema(dataset, index), request.columns)
    windows = request.windows()
    spec = None
    if windows is not None:
        spec = parse_windows(
            windows.delta_timestamps,
            fps=dataset.info().fps,
            schema=view_schema(dataset, index),
            tolerance_s=windows.tolerance_s,
            max_offsets=dataset.limits.max_window_offsets,
        )
    references = isinstance(request, TakeRequest) and request.frames == "references"
    encoded = request.frames == "encoded"  # cameras without windows (windowed ones come as pixels)
    base = with_window_columns(names, spec)
    cameras = dataset.info().videos
    answered = [*(base or ()), *(spec.offsets if spec is not None else ())]
    resized = resized_cameras(cameras, [c for c in dict.fromkeys(answered) if c in cameras], request.frame_size)
    # Frames left pending go to the socket from the maps; a compressed answer would copy them all into place at
    # its first batch, so it gathers them as it reads, and a take of more than fit the inline budget is read in
    # pieces like any other (never held whole).
    deferred = request.codec is None
    options = ReadOptions(
        request.tolerance_s, defer_frames=deferred, reference_frames=references, encoded_frames=encoded, resized=resized
    )
    return _Prepared(ViewRead(dataset, index, view, options), names, base, _stored_columns(dataset, base), spec)


class _Plan:
    """A request prepared on one snapshot: `decide` whether it is quick, then `answer` it."""

    read: ViewRead
    frame_bytes = 0  # decoded camera frames the answer holds (a take's, once checked against the limit)

    def decide(self) -> bool:
        raise NotImplementedError

    def files_at_hand(self) -> None:
        raise NotImplementedError

    def answer(self) -> Answer | NotModified:
        raise NotImplementedError


class _SlicePlan(_Plan):
    def __init__(self, slice_read: SliceRead, prepared: _Prepared) -> None:
        self.of, self.prepared, self.read = slice_read, prepared, prepared.read
        request, limit = slice_read.request, slice_read.dataset.limits.max_rows_per_response
        total = len(self.read.view)
        self.lo, self.hi = clamp(total, request.start, request.stop)
        if self.hi - self.lo > limit:
            raise OverLimit(
                f"the slice holds {self.hi - self.lo} rows; the limit is {limit} rows per response (page with "
                "start/stop)",
                limit,
            )
        prepared.check_size(self.hi - self.lo)

    def decide(self) -> bool:
        """Quick when it has no windows (computed off the event loop) and its segments are mapped."""
        if self.prepared.spec is not None:
            return False
        rows = RowsNeeded(range(self.lo, self.hi), self.prepared.stored, False, self.prepared.plain_cameras)
        return self.read.answerable_from_maps(rows)

    def files_at_hand(self) -> None:
        self.prepared.files_at_hand(range(self.lo, self.hi))

    def headers(self) -> dict[str, str]:
        request, read = self.of.request, self.read
        query = [format_ranges(self.of.ranges) if self.of.ranges else "*", self.lo, self.hi]
        query += [request.columns, request.windows(), request.compression, request.frame_size, request.frames]
        # A tier switch, another served size or a video file replaced changes the frames, not the index's digest.
        query += [(camera.tier, camera.shape) for camera in read.cameras.values()]
        query += self._video_files()
        return {
            "ETag": f'"{read.index.digest}-{hashlib.sha256("|".join(map(str, query)).encode()).hexdigest()[:16]}"',
            "X-Total-Rows": str(len(read.view)),
            "X-Start": str(self.lo),
            "X-Stop": str(self.hi),
            "Cache-Control": "no-cache",
        }

    def _video_files(self) -> list[dict[str, object]]:
        """The fingerprints of the video files the slice's cameras are read from, in a stable order."""
        cameras = self.prepared.cameras_read
        if not cameras or self.hi <= self.lo:
            return []
        files = self.read.video_files(RowsNeeded(range(self.lo, self.hi), self.prepared.stored, False, cameras))
        fingerprint = self.read.dataset.frames.file_fingerprint
        return [fingerprint(path).to_dict() for key in sorted(files) for path in sorted(files[key])]

    def answer(self) -> Answer | NotModified:
        """View rows [lo, hi) as zero-copy batches, windowed columns gathered in place of the stored ones."""
        read, prepared = self.read, self.prepared
        if self.of.if_none_match:
            read.dataset.ensure_fresh(read.index, {file for file, _, _ in read.view.spans(self.lo, self.hi)})
            headers = self.headers()
            if headers["ETag"] in [tag.strip() for tag in self.of.if_none_match.split(",")]:
                return NotModified(headers)
        self.files_at_hand()
        if prepared.spec is None and prepared.stored != prepared.base and read.may_block and self.hi > self.lo:
            return _in_pieces(self, np.arange(self.lo, self.hi, dtype=np.int64), self.headers(), self.of.request.codec)
        batches = read.slice_batches(self.lo, self.hi, prepared.stored)
        schema = project(read.index.schema, prepared.stored)
        if prepared.spec is None and prepared.stored == prepared.base:
            return Answer(schema, batches, self.headers(), self.of.request.codec, read.pending or None, owned=False)
        table = pa.Table.from_batches(batches, schema)
        table = read.complete(np.arange(self.lo, self.hi, dtype=np.int64), table, prepared.base, prepared.spec)
        return Answer(table.schema, table.to_batches(), self.headers(), self.of.request.codec, read.pending or None)

    def piece(self, rows: np.ndarray) -> Piece:
        """View rows `rows` (contiguous, ascending) with their camera frames."""
        read, prepared = self.read, self.prepared
        read.fresh_pending()
        lo, hi = int(rows[0]), int(rows[-1]) + 1
        table = pa.Table.from_batches(
            read.slice_batches(lo, hi, prepared.stored), project(read.index.schema, prepared.stored)
        )
        table = read.complete(rows, table, prepared.base, prepared.spec)
        return Piece(table.schema, [b for b in table.to_batches() if b.num_rows], read.pending or None)


class _TakePlan(_Plan):
    def __init__(self, prepared: _Prepared, request: TakeRequest) -> None:
        self.prepared, self.read, self.request = prepared, prepared.read, request
        self.rows = np.asarray(request.indices, dtype=np.int64)
        total = len(self.read.view)
        bad = self.rows[(self.rows < 0) | (self.rows >= total)]
        if len(bad):
            shown = ", ".join(map(str, bad[:10].tolist()))
            raise InvalidInput(f"indices out of range [0, {total}): {shown}")
        self.frame_bytes = prepared.check_size(len(self.rows))

    def decide(self) -> bool:
        """Quick when no camera is windowed (decoded off the event loop) and its rows, their windows and frames
        lie in mapped segments, within the inline budget."""
        spec = self.prepared.spec
        if spec is not None and any(key in spec.offsets for key in self.read.cameras):
            return False
        rows = RowsNeeded(self.rows, self.prepared.stored, True, self.prepared.plain_cameras)
        return self.read.answerable_from_maps(rows, spec)

    def files_at_hand(self) -> None:
        self.prepared.files_at_hand(self.rows)

    def answer(self) -> Answer:
        """Rows at view positions `rows`, in that order (duplicates allowed), windowed columns included: read
        piece by piece when the read may block (the first piece now, the rest as it is sent), except for frame
        references (small, and described by the segments of the whole answer)."""
        read = self.read
        self.files_at_hand()
        headers = {"X-Total-Rows": str(len(read.view))}
        if read.may_block and not read.options.reference_frames and len(self.rows):
            return _in_pieces(self, self.rows, headers, self.request.codec)
        piece = self.piece(self.rows)
        return Answer(piece.schema, piece.batches, headers, self.request.codec, piece.pending)

    def piece(self, rows: np.ndarray) -> Piece:
        """View positions `rows` of the answer, windowed columns and camera frames included."""
        read, prepared = self.read, self.prepared
        if read.may_block:
            read.fresh_pending()
        if not prepared.plain_cameras:
            table = read.take_rows(rows, prepared.stored)
            if prepared.spec is not None or prepared.stored != prepared.base:
                table = read.complete(rows, table, prepared.base, prepared.spec)
        else:  # the rows' episodes and timestamps, which locate their frames, gathered with them
            table = read.take_rows(rows, read.locating_columns(prepared.stored))
            table = read.complete(rows, table, prepared.base, prepared.spec, read.locate_in(rows, table))
        return Piece(table.schema, [b for b in table.to_batches() if b.num_rows], read.pending or None)


class _RowReferencePlan(_Plan):
    """A take asking for its rows by reference (`rows: "references"`): where they lie in the segments, for a client
    that reads the cache directory itself (`app.reads.row_references`), when every column it asks for is stored
    and unwindowed and every row's segment is built; otherwise, the same take answered with the values."""

    def __init__(self, values: _TakePlan) -> None:
        self.values, self.read, self.frame_bytes = values, values.read, values.frame_bytes
        prepared = values.prepared
        self.referable = prepared.spec is None and len(values.rows) > 0 and not prepared.cameras_asked

    def decide(self) -> bool:
        """Quick when the rows' segments are mapped (the references copy no row); else as the values' take."""
        if not self.referable:
            return self.values.decide()
        return self.read.answerable_from_maps(RowsNeeded(self.values.rows, self.values.prepared.stored, False))

    def files_at_hand(self) -> None:
        self.values.files_at_hand()  # the values' answer may be given instead

    def answer(self) -> Answer:
        if self.referable:
            references = self.read.row_references(self.values.rows, self.values.prepared.stored)
            if references is not None:
                headers = {"X-Total-Rows": str(len(self.read.view))}
                return Answer(references.schema, [references], headers, self.values.request.codec)
        return self.values.answer()


def _in_pieces(plan: _SlicePlan | _TakePlan, rows: np.ndarray, headers: dict[str, str], codec: str | None) -> Answer:
    """The answer over view `rows` cut into pieces: the first read now (a problem with it is still an error
    response), the rest as the encoder asks for them."""
    prepared = plan.prepared
    cameras = any(name in prepared.read.cameras for name in prepared.names or prepared.read.cameras)
    pieces = RowPieces(rows, _guessed_row_bytes(prepared, rows), plan.piece, read_ahead=cameras)
    first = pieces.next_piece()
    rest = pieces if pieces.remaining else None
    return Answer(first.schema, first.batches, headers, codec, first.pending, rest=rest)


def _guessed_row_bytes(prepared: _Prepared, rows: np.ndarray) -> float:
    """Bytes a row of the answer may hold, before any is read: its camera frames (windows counted) and its stored
    columns: as the mapped segments of `rows` hold them, else the fixed-width ones and, for the others, four
    times the source files' bytes per row (at least `_UNKNOWN_ROW_BYTES`)."""
    read = prepared.read
    index, cameras = read.index, read.cameras
    windowed = prepared.spec.offsets if prepared.spec is not None else {}
    frames = sum(
        f.height * f.width * f.channels * (len(windowed[k]) if k in windowed else 1)
        for k, f in cameras.items()
        if k in windowed or k in (prepared.names or ())
    )
    segments = [read.dataset.rows.mapped(index, n) for n in np.unique(read.view.locate(rows)[0]).tolist()]
    if all(segment is not None for segment in segments):
        return frames + max((s.row_bytes(prepared.stored) for s in segments if s is not None), default=0)
    schema = project(index.schema, prepared.stored)
    fixed = sum(field.type.byte_width for field in schema if _fixed_width(field.type))
    variable = any(not _fixed_width(field.type) for field in schema)
    source = 4 * sum(fp.size for fp in index.files) / max(1, index.total_rows)
    return frames + fixed + (max(source, _UNKNOWN_ROW_BYTES) if variable else 0)


_UNKNOWN_ROW_BYTES = 4096


def _fixed_width(kind: pa.DataType) -> bool:
    try:
        return kind.byte_width > 0
    except ValueError:
        return False


# -- limits ------------------------------------------------------------------------------------------------------


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


def _check_window_size(dataset: Dataset, rows: int, spec: WindowSpec | None) -> None:
    limit = dataset.limits.max_window_values
    if spec is not None and rows * spec.widest > limit:
        raise OverLimit(
            f"{rows} rows x {spec.widest} offsets is {rows * spec.widest} window values; "
            f"the limit is {limit} per request",
            limit,
        )


def _check_frame_bytes(
    dataset: Dataset, cameras: dict[str, VideoFeature], rows: int, names: list[str] | None, spec: WindowSpec | None
) -> int:
    """A 413 stating how many rows fit when the camera frames asked for (at the sizes asked, a window's frames
    each counting) would hold more than `max_frame_bytes`: decoded frames are built in memory, unlike stored rows.
    The bytes of those frames otherwise."""
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
    return rows * per_row


def _stored_columns(dataset: Dataset, names: list[str] | None) -> list[str] | None:
    """The stored columns of a selection (None: all of them); when it names only cameras, the episode column,
    which locates their frames (dropped from the answer)."""
    if names is None:
        return None
    cameras = dataset.info().videos
    stored = [name for name in names if name not in cameras]
    return stored if stored or len(stored) == len(names) else [dataset.episode_column]


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
