"""One read of one index snapshot: `ViewRead` carries what every step of a row read needs, and its methods are
the steps (rows of segments, rows by position, row references, camera frames, frame references, windows).

Whether a read may block is decided once, before any row is read (`ViewRead.answerable_from_maps`): a read that is
to be answered on the event loop first finds every segment it will touch mapped by this process and holds on to
them, so none of its steps waits for a build, a map, a source file or a decoder. A read that may block builds,
maps, reads cold or decodes whatever it needs. Should a quick read find, against its decision, that it would have
to wait, it raises `WouldBlock` before doing so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa

from app.errors import InvalidInput, WouldBlock
from app.reads.arrow_ipc import OWN_CHUNK_BYTES
from app.reads.frame_references import reference_column
from app.reads.frames import (
    FRAME_BLOCKS,
    TIMESTAMP,
    LocatedRows,
    camera_windows,
    empty_frames,
    encoded_frames,
    frame_times,
    gather_pictures,
    nearest_in_segment,
    nearest_pictures,
    places_of,
    tensor_column,
)
from app.reads.pending_copies import PendingCopies
from app.reads.row_references import layout_document, reference_batch
from app.reads.takes import gather_rows, project
from app.reads.windows import DEFAULT_TOLERANCE_S, PAD_SUFFIX, WindowSpec, as_windows, pad_column, window_targets
from app.sources.frame_tiers import hot_tier, wire_encoding
from app.sources.source import VideoFeature
from app.sources.video import check_tolerance, decode_nearest_side_by_side, frame_schema, hot_camera
from app.store.cold_reads import ColdRows
from app.store.dataset import Dataset
from app.store.episode_index import EpisodeIndex
from app.store.mapped_segments import Segment
from app.store.row_files import RowSource
from app.store.segments import SourceChanged
from app.store.views import EpisodeView


@dataclass(frozen=True)
class ReadOptions:
    """How a read answers: the frame tolerance, whether frames from decoded-frame segments may be left pending
    (sent from the map by the encoder, see `app.reads.pending_copies`), whether cameras may come as references
    (see `app.reads.frame_references`) and the cameras it asks for at another size than they are served at
    (`app.reads.frames.resized_cameras`: decoded on demand at that size, never read from or built into the
    decoded-frame cache, which holds the served size)."""

    tolerance_s: float = DEFAULT_TOLERANCE_S
    defer_frames: bool = False
    reference_frames: bool = False
    encoded_frames: bool = False  # cameras without windows come as encoded images (`frames=encoded`)
    resized: Mapping[str, VideoFeature] = field(default_factory=dict)


class ViewRead:
    """One read of `view` on the `index` snapshot of `dataset`: whether it may block, what it found mapped, and the
    frame copies it leaves `pending`."""

    def __init__(self, dataset: Dataset, index: EpisodeIndex, view: EpisodeView, options: ReadOptions) -> None:
        self.dataset, self.index, self.view, self.options = dataset, index, view, options
        self.may_block = True
        self.inline_bytes = 0  # what a quick read will copy, as its decision estimated it
        self.pending = PendingCopies() if options.defer_frames else None
        self._segments: dict[int, Segment] = {}  # source file -> its segment, mapped already (a quick read's)
        self._frame_segments: dict[str, Segment] = {}  # video file -> its decoded-frame segment, likewise
        self._hot_segments: dict[str, Segment] = {}  # video file -> its hot pixel segment, likewise

    def fresh_pending(self) -> None:
        """Start another piece of the answer: frame copies left pending from here on are that piece's."""
        if self.options.defer_frames:
            self.pending = PendingCopies()

    @property
    def cameras(self) -> dict[str, VideoFeature]:
        """The dataset's cameras at the sizes this read serves them."""
        videos = self.dataset.info().videos
        return {**videos, **self.options.resized} if self.options.resized else videos

    # -- deciding ------------------------------------------------------------------------------------------------

    def answerable_from_maps(self, rows: RowsNeeded, windows: WindowSpec | None = None) -> bool:
        """Whether the read of `rows` (and the `windows` of its non-camera columns) can be answered from segments
        this process has mapped, within `inline_read_bytes` of copies, without waiting: decided before any row is
        read. When it can, the read no longer may block and keeps the segments it found for its steps, and
        `inline_bytes` says about how many bytes it will copy (what the budget counted)."""
        self.inline_bytes = 0
        quick = self._rows_mapped(rows) and self._frames_mapped(rows)
        if quick and windows is not None:
            lo, hi = self.view.episode_bounds(rows.positions())
            for column, offsets in windows.offsets.items():
                targets, _ = window_targets(rows.positions(), lo, hi, offsets)
                needed = RowsNeeded(targets.reshape(-1), [column], budgeted=True)
                quick = quick and column not in self.cameras and self._rows_mapped(needed)
        self.may_block = not quick
        return quick

    def _rows_mapped(self, rows: RowsNeeded) -> bool:
        budget = self.dataset.limits.inline_read_bytes
        copied = 0
        for number in rows.files(self.view):
            segment = self._segments.get(number) or self.dataset.rows.mapped(self.index, number)
            if segment is None:
                return False
            if rows.budgeted:
                copied = max(copied, rows.count * segment.row_bytes(rows.stored))
                if copied > budget:
                    return False
            self._segments[number] = segment
        self.inline_bytes += copied
        return True

    def _frames_mapped(self, rows: RowsNeeded) -> bool:
        """Whether the frames of the cameras `rows` asks for all lie in mapped decoded-frame segments, and those
        that would be copied (smaller than `OWN_CHUNK_BYTES`, or none left pending) fit `inline_read_bytes`."""
        if not rows.cameras or rows.count == 0:
            return True
        if self.dataset.limits.video_cache_policy == "on-demand" or set(rows.cameras) & set(self.options.resized):
            return False
        if self.options.encoded_frames:
            return False  # an encode per frame: not on the event loop
        copied = 0
        for key, paths in self.video_files(rows).items():
            feature = self.cameras[key]
            if not all(self._pixels_mapped(path, feature) for path in paths):
                return False
            frame_bytes = feature.height * feature.width * feature.channels
            if self.pending is None or frame_bytes < OWN_CHUNK_BYTES:
                copied += rows.count * frame_bytes
        self.inline_bytes += copied
        return copied <= self.dataset.limits.inline_read_bytes

    def _pixels_mapped(self, path: str, feature: VideoFeature) -> bool:
        """Whether this process has a segment of `path` mapped that `feature`'s pixels are read from without a
        decode (its raw segment, or the hot pixels over its encoded tier), kept for the read's steps."""
        if not feature.tier.decodes:
            store, found = self.dataset.frames, self._frame_segments
        elif self.dataset.hot_frames is not None and hot_tier(feature.tier) is not None:
            store, found = self.dataset.hot_frames, self._hot_segments
        else:
            return False  # a decode per frame: not on the event loop
        segment = store.mapped_segment(path)
        if segment is None:
            return False
        found[path] = segment
        return True

    def video_files(self, rows: RowsNeeded) -> dict[str, set[str]]:
        """The video files holding the frames of each camera `rows` asks for (windows lie in the same episodes)."""
        source = self.dataset.source()
        return {key: {source.episode_clip(key, e).path for e in self._episodes(rows)} for key in rows.cameras}

    def _episodes(self, rows: RowsNeeded) -> list[int]:
        positions = rows.positions()
        return distinct(self.view.episodes[np.searchsorted(self.view.episode_offsets, positions, side="right") - 1])

    def files_at_hand(self, rows: RowsNeeded) -> None:
        """Make sure every file the read of `rows` touches can be opened, before a row is read: the data files of
        the rows' episodes (their windows lie in them too) and the video files their frames lie in. Where the
        dataset's files are fetched as reads need them (from the Hub), those not there yet are fetched, all at once,
        and the read is answered 503 with the progress meanwhile, so an answer sent in pieces is never cut short by
        a file missing midway. A data file this snapshot holds as absent is there by then: `SourceChanged`, so the
        read starts over on the index read again, before any piece. A quick read found every row and frame in a
        mapped segment already."""
        if self.dataset.supply.fetches and self.may_block and rows.count:
            episodes = np.asarray(self._episodes(rows), dtype=np.int64)
            data = [self.index.files[number] for number in self.index.files_of(episodes)]
            self.dataset.supply.at_hand({f.path for f in data}.union(*self.video_files(rows).values()))
            absent = next((fingerprint for fingerprint in data if fingerprint.absent), None)
            if absent is not None:
                raise SourceChanged(f"{absent.path} was fetched")

    # -- segments ------------------------------------------------------------------------------------------------

    def segment(self, number: int) -> Segment:
        """The segment of source file `number`: the one found mapped, or (when the read may block) built."""
        segment = self._segments.get(number)
        if segment is not None:
            return segment
        if not self.may_block:
            raise WouldBlock(f"segment of {self.index.files[number].path} is not mapped")
        return self.dataset.rows.segment(self.index, number)

    def frame_segment(self, path: str, feature: VideoFeature) -> Segment | None:
        """The decoded-frame segment of a video file, as the cache policy has it: built on first touch (budget
        allowing), used only where `warm` built it, or never (None: decode on demand)."""
        policy = self.dataset.limits.video_cache_policy
        if policy == "on-demand" or feature.key in self.options.resized:
            return None
        segment = self._frame_segments.get(path)
        if segment is not None:
            return segment
        if not self.may_block:
            raise WouldBlock(f"the decoded-frame segment of {path} is not mapped")
        return self.dataset.frames.segment(path, frame_schema(feature), build=policy == "first-touch")

    def pixel_segment(self, path: str, feature: VideoFeature, hot: bool = True) -> KeptFrames | None:
        """The segment to read `feature`'s pixels of video file `path` from: its hot pixel segment where one is
        built (the tier's round trip as raw pixels, `app.sources.frame_tiers.HotPixels`), else its tier's own
        (`frame_segment`); None: decode on demand. A touch of a file of an encoded tier queues its hot segment's
        build where the policy builds on first touch and the hot budget has room. Without `hot`, the tier's own
        segment only."""
        segment = self._hot_segment(path, feature) if hot else None
        if segment is not None:
            return KeptFrames(segment, hot_camera(feature))
        segment = self.frame_segment(path, feature)
        return None if segment is None else KeptFrames(segment, feature)

    def _hot_segment(self, path: str, feature: VideoFeature) -> Segment | None:
        """The hot pixel segment of a video file of `feature`, if built (and, on first touch, its build queued);
        None without one: no hot layer, a raw tier, a resized read or on-demand frames."""
        hot_frames, policy = self.dataset.hot_frames, self.dataset.limits.video_cache_policy
        if hot_frames is None or hot_tier(feature.tier) is None or policy == "on-demand":
            return None
        segment = self._hot_segments.get(path)
        if segment is not None or not self.may_block or feature.key in self.options.resized:
            return segment
        schema = frame_schema(hot_camera(feature))
        segment = hot_frames.segment(path, schema, build=False)
        if segment is None and policy == "first-touch":
            self.frame_segment(path, feature)  # queued first (one build at a time): the hot one is made from it
            segment = hot_frames.segment(path, schema, build=True)
        return segment

    def _row_sources(self, files: np.ndarray, stored: np.ndarray) -> dict[int, RowSource]:
        numbers = distinct(files)
        if all(number in self._segments for number in numbers):
            return {number: self._segments[number] for number in numbers}
        if not self.may_block:
            raise WouldBlock("rows of segments not mapped")
        return self.dataset.rows.sources(self.index, files, stored)

    # -- rows ----------------------------------------------------------------------------------------------------

    def slice_batches(self, lo: int, hi: int, columns: list[str] | None) -> list[pa.RecordBatch]:
        """View rows [lo, hi) of `columns` as zero-copy slices of the mapped segments."""
        spans = list(self.view.spans(lo, hi))
        self.dataset.ensure_fresh(self.index, {file for file, _, _ in spans})
        return [piece for file, first, end in spans for piece in self.segment(file).slice(first, end, columns)]

    def take_rows(self, rows: np.ndarray, names: list[str] | None) -> pa.Table:
        """View `rows` (in range) of the stored columns `names`, in that order; rows of files whose segments are
        not built yet are read cold (see `app.reads.takes`)."""
        located = files, stored = self.view.locate(rows)
        touched = distinct(files)
        self.dataset.ensure_fresh(self.index, touched)
        if len(rows) == 0:
            return project(self.index.schema, names).empty_table()
        sources = self._row_sources(files, stored)
        cold = [number for number, source in sources.items() if not isinstance(source, Segment)]
        try:
            table = gather_rows(sources, located, self.index.schema, names, self._cold_take)
        finally:
            self.dataset.rows.queue_builds(self.index, cold)
        if cold:
            self.dataset.ensure_fresh(self.index, touched)  # the source files read must not have changed meanwhile
        return table

    def row_references(self, rows: np.ndarray, names: list[str] | None) -> pa.RecordBatch | None:
        """View `rows` (in range, not empty) of the stored columns `names` (None: all) as references into their
        segments (see `app.reads.row_references`); None if some row's segment is not built, or its file is no
        longer the one at its path (send the values)."""
        files, stored = self.view.locate(rows)
        touched = distinct(files)
        self.dataset.ensure_fresh(self.index, touched)
        segments = [self._segment_at_path(number) for number in touched]
        if any(segment is None for segment in segments):
            return None
        if len(touched) == 1:
            segment_of = np.zeros(len(files), dtype=np.int32)
        else:
            segment_of = np.searchsorted(np.asarray(touched), files).astype(np.int32)
        columns = names if names is not None else self.index.schema.names
        root = self.dataset.segments.cache_root
        return reference_batch(segments, segment_of, stored, columns, root)  # type: ignore[arg-type]

    def row_layout(self, names: list[str] | None) -> dict[str, object]:
        """The layout of the whole view's rows of the stored columns `names` (None: all) in the segment cache (see
        `app.reads.row_references`): its runs and, of its source files (checked fresh), the segments this process
        has mapped and finds at their paths. Never maps or builds one: a layout is asked every second, and mapping
        a segment verifies it, so the rows of the others are taken with a request, which maps or builds them."""
        files = distinct(self.view.run_file)
        self.dataset.ensure_fresh(self.index, files)
        mapped = {number: self.dataset.rows.mapped(self.index, number) for number in files}
        segments = {number: segment for number, segment in mapped.items() if segment is not None and segment.at_path()}
        columns = names if names is not None else self.index.schema.names
        seconds = self.dataset.limits.row_layout_s
        return layout_document(self.view, columns, segments, self.dataset.segments.cache_root, seconds)

    def _segment_at_path(self, number: int) -> Segment | None:
        """The segment of source file `number` if it is built and the file at its path is the one mapped (what
        a client reading that path finds); None otherwise. Never builds; `WouldBlock` for a quick read that would
        have to map a file."""
        segment = self._segments.get(number)
        if segment is not None and segment.at_path():
            return segment
        if not self.may_block:
            raise WouldBlock(f"segment of {self.index.files[number].path} is not mapped as it is on disk")
        if segment is None:
            segment = self.dataset.rows.built(self.index, number)
        if segment is not None and not segment.at_path():  # evicted or rebuilt by another process since mapped
            self.dataset.rows.forget(segment)
            segment = self.dataset.rows.built(self.index, number)
        if segment is None or not segment.at_path():
            return None
        self._segments[number] = segment
        return segment

    def _cold_take(self, source: ColdRows, rows: np.ndarray, names: list[str] | None) -> pa.Table:
        return self.dataset.rows.cold_take(self.index, source, rows, names)

    # -- camera frames -------------------------------------------------------------------------------------------

    def check_locatable(self) -> None:
        """A problem unless the dataset's rows have what LeRobot's frame rule needs."""
        if TIMESTAMP not in self.index.schema.names or not self.index.has_episode_column:
            raise InvalidInput(
                f"dataset {self.dataset.id!r} has no {TIMESTAMP!r} and episode columns to locate frames by"
            )

    def locate(self, rows: np.ndarray) -> LocatedRows:
        """The episode, timestamp and frame number of each distinct one of view `rows` (not empty)."""
        self.check_locatable()
        unique, inverse = np.unique(rows, return_inverse=True)
        located = self.locate_in(unique, self.take_rows(unique, [self.dataset.episode_column, TIMESTAMP]))
        assert located is not None, "the locating columns were gathered"
        return replace(located, order=inverse)

    def locating_columns(self, names: list[str] | None) -> list[str] | None:
        """`names` (stored columns; None: all), plus the columns that locate frames (`locate_in`) when the dataset
        has them."""
        if names is None:
            return None
        wanted = [self.dataset.episode_column, TIMESTAMP]
        if not all(name in self.index.schema.names for name in wanted):
            return names
        return [*names, *(name for name in wanted if name not in names)]

    def locate_in(self, rows: np.ndarray, table: pa.Table) -> LocatedRows | None:
        """View `rows` located from their own `table` (gathered with `locating_columns`), without reading them
        again; None when the table lacks the locating columns."""
        episode_column = self.dataset.episode_column
        if len(rows) == 0 or episode_column not in table.column_names or TIMESTAMP not in table.column_names:
            return None
        first, _ = self.view.episode_bounds(rows)
        return LocatedRows(
            table[episode_column].to_numpy(),
            table[TIMESTAMP].to_numpy().astype(np.float64),
            rows - first,
            np.arange(len(rows)),
        )

    def frame_columns(
        self, rows: np.ndarray, keys: list[str], located: LocatedRows | None = None
    ) -> dict[str, pa.Array]:
        """The frames of `keys` for view `rows` (any order, duplicates allowed), one column per key. Frames found
        in decoded-frame segments are left `pending` when the read defers them (and they are at least
        `OWN_CHUNK_BYTES` each). `located`: `rows` located already (`locate`)."""
        self.check_locatable()
        if len(rows) == 0:
            return {key: empty_frames(self.cameras[key].arrow_type) for key in keys}
        located = located if located is not None else self.locate(rows)
        return {key: tensor_column(self._frames(self.cameras[key], located), self.cameras[key]) for key in keys}

    def _frames(
        self, feature: VideoFeature, located: LocatedRows, defer: bool = True, exact: bool = False
    ) -> np.ndarray:
        """The frames of `feature` for the `located` rows in request order, checked against the tolerance. Each
        frame is written once: copied from the decoded-frame segment's memory map (or left pending, to be sent from
        the map) or converted from the decoder straight into the result. With `exact`, the exact frames even under
        a lossy tier (to be encoded as its build encodes them), not the tier's round trip."""
        order = located.order
        times_of = frame_times(self.dataset.source(), feature, located.episodes, located.timestamps)
        frames = FRAME_BLOCKS.empty((len(order), feature.height, feature.width, feature.channels))
        deferred = self.pending if defer and len(order) and frames[0].nbytes >= OWN_CHUNK_BYTES else None
        found = np.empty(len(located.episodes))
        file_of_position = times_of.file_of_row[order]
        for file, path in enumerate(times_of.paths):
            here = times_of.rows_in(file)
            times, back = np.unique(times_of.wanted[here], return_inverse=True)
            if len(here) == len(located.episodes):  # every row in this one file
                positions, picks = np.arange(len(order)), back[order]
            else:
                picture_of_row = np.full(len(located.episodes), -1)
                picture_of_row[here] = back
                positions = np.flatnonzero(file_of_position == file)
                picks = picture_of_row[order[positions]]  # which of `times` each of `positions` shows
            # Exact pixels come from a segment of exact frames (a raw tier's) or from the source, never from an
            # encoded tier's segments or their hot layer: those hold its round trip.
            kept = None if exact and feature.tier.lossy else self.pixel_segment(path, feature, hot=not exact)
            if kept is None:
                if not self.may_block:
                    raise WouldBlock("camera frames are decoded off the event loop")
                places, root, decoders = (
                    places_of(positions, picks, len(times)),
                    self.dataset.path,
                    self.dataset.decoders,
                )
                at = decode_nearest_side_by_side(frames, places, root, path, times, feature, decoders)
                if not exact:  # as the tier keeps them, so a cold answer equals a warm one
                    feature.tier.as_kept(frames, positions)
                found[here] = at[back]
                continue
            pictures, batch_of, row_in_batch, at = nearest_pictures(kept.segment, times, kept.camera)
            if deferred is not None and not kept.camera.tier.decodes:  # views of the map: sent from it
                places = zip(batch_of[picks].tolist(), row_in_batch[picks].tolist(), strict=True)
                deferred.add(frames, positions, [pictures[batch][row] for batch, row in places])
            else:
                gather_pictures(frames, positions, pictures, batch_of[picks], row_in_batch[picks])
            found[here] = at[back]
        check_tolerance(
            feature.key, located.episodes, located.frame_index, times_of.wanted, found, self.options.tolerance_s
        )
        return frames

    def frame_references(self, feature: VideoFeature, located: LocatedRows) -> tuple[pa.Field, pa.Array] | None:
        """The camera column of `feature` for the `located` rows as references into decoded-frame segments
        (field and column), checked against the tolerance like pixels are; None if some frame is not in a built
        segment, or the read asks for the camera at another size than the segments hold (send pixels)."""
        if feature.key in self.options.resized:
            return None
        times_of = frame_times(self.dataset.source(), feature, located.episodes, located.timestamps)
        referable = self._referable(times_of.paths, feature)
        if referable is None:
            return None
        segments, camera = referable
        found = np.empty(len(located.episodes))
        segment_of = np.empty(len(located.episodes), dtype=np.int32)
        row_of = np.empty(len(located.episodes), dtype=np.int64)
        for number, segment in enumerate(segments):
            here = times_of.rows_in(number)
            times, back = np.unique(times_of.wanted[here], return_inverse=True)
            rows, at = nearest_in_segment(segment, times)
            segment_of[here], row_of[here], found[here] = number, rows[back], at[back]
        wanted, tolerance_s = times_of.wanted, self.options.tolerance_s
        check_tolerance(feature.key, located.episodes, located.frame_index, wanted, found, tolerance_s)
        order = located.order
        return reference_column(camera, segments, segment_of[order], row_of[order], self.dataset.frames.cache_root)

    def _referable(self, paths: list[str], feature: VideoFeature) -> tuple[list[Segment], VideoFeature] | None:
        """Segments of every one of `paths` that a client reads at their paths, all of one kind (one column
        describes one), and the camera as they keep its frames: the hot layer's where every file is hot, else the
        tier's own; None if some file is in neither (send pixels)."""
        for hot in (True, False):
            kept = [self._at_path(path, feature, hot) for path in paths]
            kinds = {k.camera for k in kept if k is not None}
            if None not in kept and len(kinds) == 1:
                return [k.segment for k in kept if k is not None], kinds.pop()
        return None

    def _at_path(self, path: str, feature: VideoFeature, hot: bool) -> KeptFrames | None:
        """`pixel_segment` of `path` if the file at its path is the one mapped (what a client reading that path
        finds)."""
        kept = self.pixel_segment(path, feature, hot)
        if kept is not None and not kept.segment.at_path():
            # Evicted or rebuilt by another process since this one mapped it: a client could not read the file
            # this map holds. Map the one there now (if any).
            self.dataset.frames.forget(kept.segment)
            self._frame_segments.pop(path, None)
            self._hot_segments.pop(path, None)
            kept = self.pixel_segment(path, feature, hot)
        return kept if kept is not None and kept.segment.at_path() else None

    def encoded_frame_column(self, feature: VideoFeature, located: LocatedRows) -> tuple[pa.Field, pa.Array]:
        """The camera column of `feature` for the `located` rows as encoded images (`frames=encoded`), checked
        against the tolerance like pixels are: the bytes as the encoded tier keeps them where its segments are
        built, else the frames read as pixels and encoded here."""
        wire = wire_encoding(feature.tier)
        field_ = wire.field(feature.key, feature.shape)
        if feature.tier.decodes and feature.key not in self.options.resized:
            kept = self._kept_encoded(feature, located)
            if kept is not None:
                return field_, kept
        if not self.may_block:
            raise WouldBlock("camera frames are encoded off the event loop")
        # Frames decoded on demand are encoded once from the exact pixels: the same bytes a JPEG tier's build keeps.
        pixels = self._frames(feature, located, defer=False, exact=True)
        return field_, pa.array([wire.encode(frame) for frame in pixels], pa.binary())

    def _kept_encoded(self, feature: VideoFeature, located: LocatedRows) -> pa.Array | None:
        """The encoded frames of the `located` rows from built segments of the encoded tier, in request order;
        None if some frame is not in a built segment."""
        times_of = frame_times(self.dataset.source(), feature, located.episodes, located.timestamps)
        found = np.empty(len(located.episodes))
        chunks: list[pa.Array] = []
        row_of_distinct = np.empty(len(located.episodes), dtype=np.int64)
        for number, path in enumerate(times_of.paths):
            segment = self.frame_segment(path, feature)
            if segment is None:
                return None
            here = times_of.rows_in(number)
            times, back = np.unique(times_of.wanted[here], return_inverse=True)
            rows, at = nearest_in_segment(segment, times)
            kept = encoded_frames(segment, rows[back])
            if kept is None:
                return None
            found[here] = at[back]
            row_of_distinct[here] = sum(len(c) for c in chunks) + np.arange(len(here))
            chunks.append(kept)
        check_tolerance(
            feature.key, located.episodes, located.frame_index, times_of.wanted, found, self.options.tolerance_s
        )
        gathered = pa.concat_arrays(chunks) if len(chunks) != 1 else chunks[0]
        return gathered.take(pa.array(row_of_distinct[located.order]))

    # -- completing the stored columns ---------------------------------------------------------------------------

    def complete(
        self,
        rows: np.ndarray,
        table: pa.Table,
        names: list[str] | None,
        spec: WindowSpec | None,
        located: LocatedRows | None = None,
    ) -> pa.Table:
        """The stored columns of view `rows` in `table`, completed: camera frames decoded (or left pending where
        a decoded-frame segment holds them, or referenced there when the read asks for references), windows
        applied, and the columns in the order asked (windows' `<column>_is_pad` masks last). `located`: `rows`
        located already (`locate_in`)."""
        cameras = self.cameras
        windowed = spec.offsets if spec is not None else {}
        plain = [name for name in names or [] if name in cameras and name not in windowed]
        if plain and self.options.encoded_frames:
            located = located if located is not None or not len(rows) else self.locate(rows)
            for key in plain:
                if located is None:
                    feature = cameras[key]
                    table = table.append_column(
                        wire_encoding(feature.tier).field(key, feature.shape), pa.array([], pa.binary())
                    )
                else:
                    table = table.append_column(*self.encoded_frame_column(cameras[key], located))
            plain = []
        if plain and self._references_possible(rows):
            located = located if located is not None else self.locate(rows)
            for key in list(plain):
                referenced = self.frame_references(cameras[key], located)
                if referenced is not None:
                    table = table.append_column(*referenced)
                    plain.remove(key)
        if plain:
            for key, frames in self.frame_columns(rows, plain, located).items():
                table = table.append_column(pa.field(key, frames.type), frames)
        if spec is not None:
            table = self.apply_windows(rows, table, spec)
        order = names if names is not None else [*self.index.schema.names, *(c for c in windowed if c in cameras)]
        pads = [column + PAD_SUFFIX for column in windowed]
        return table.select([*order, *pads])

    def _references_possible(self, rows: np.ndarray) -> bool:
        """Whether cameras of `rows` may come as references: asked for, and frames are cached at all."""
        return self.options.reference_frames and len(rows) > 0 and self.dataset.limits.video_cache_policy != "on-demand"

    def apply_windows(self, rows: np.ndarray, table: pa.Table, spec: WindowSpec) -> pa.Table:
        """Replace each windowed column by its windows and append the `<column>_is_pad` masks."""
        lo, hi = self.view.episode_bounds(rows)
        pads = []
        cameras = self.cameras
        for column, offsets in spec.offsets.items():
            targets, pad = window_targets(rows, lo, hi, offsets)
            if column in cameras:
                values = self.frame_columns(targets.reshape(-1), [column])[column]
                windowed = camera_windows(values, len(offsets))
            else:
                values = self.take_rows(targets.reshape(-1), [column])[column].combine_chunks()
                windowed = as_windows(values, len(offsets))
            position = table.schema.get_field_index(column)
            if position < 0:
                table = table.append_column(pa.field(column, windowed.type), windowed)
            else:
                table = table.set_column(position, pa.field(column, windowed.type), windowed)
            pads.append((column + PAD_SUFFIX, pad_column(pad)))
        for name, mask in pads:
            table = table.append_column(pa.field(name, mask.type), mask)
        return table


@dataclass(frozen=True)
class KeptFrames:
    """A segment a camera's pixels are read from, and the camera as that segment keeps its frames (its tier's, or
    the hot layer's over it)."""

    segment: Segment
    camera: VideoFeature


@dataclass(frozen=True)
class RowsNeeded:
    """The rows a read will touch, as its decision sees them: view rows `[lo, hi)` or at `rows`, of the stored
    columns `stored` (None: all) and of the `cameras` asked for; `budgeted` when their bytes are copied (a take),
    not sent from the maps (a slice)."""

    rows: np.ndarray | range
    stored: list[str] | None
    budgeted: bool
    cameras: tuple[str, ...] = ()

    @property
    def count(self) -> int:
        return len(self.rows)

    def positions(self) -> np.ndarray:
        rows = self.rows
        return np.arange(rows.start, rows.stop, dtype=np.int64) if isinstance(rows, range) else rows

    def files(self, view: EpisodeView) -> list[int]:
        """The source files holding the rows."""
        if isinstance(self.rows, range):
            return sorted({file for file, _, _ in view.spans(self.rows.start, self.rows.stop)})
        return distinct(view.locate(self.rows)[0])


def distinct(values: np.ndarray) -> list[int]:
    """The distinct values, ascending, as ints: at once when they are all one (a take from one source file, or
    one episode), which is most of the time."""
    if len(values) == 0:
        return []
    first = values[0]
    if (values == first).all():
        return [int(first)]
    return np.unique(values).tolist()
