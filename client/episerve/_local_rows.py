"""Rows read straight from the server's segment cache, for a client on the same machine.

With `Client(cache_dir=...)` takes ask for their rows by reference (`rows: "references"`): where the server holds
the rows in built segments (and the take asks for stored columns only), it answers with a segment file (relative
to the cache directory) and a row of it for each row asked, and this module maps each file once and gathers the
rows itself into the table the server would have sent: the same schema, columns, values and row order. A take
then costs a few bytes of answer per row, whatever the row size, and no row crosses a socket. Files are checked as
camera frames' are (`episerve._cache_files`): one rebuilt since, evicted, or of another cache is never read, and
the rows come over HTTP instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.lib.stride_tricks import sliding_window_view

from episerve._cache_files import LocalReferences, SegmentUnavailable
from episerve._numpy import fixed_width, numeric_dtype

METADATA_KEY = b"episerve.rows"  # names the description of rows by reference in the answer's schema metadata
_ROW_SLICE_MAX = 4096  # up to this many wide rows, gather by slices of the maps (one copy)...
_WIDE_ROW_BYTES = 2048  # ...where rows hold variable-width values of this many bytes on average
_SELECTIONS_REMEMBERED = 16


class LocalRows(LocalReferences["_RowSegment"]):
    """The server's cache directory as this machine sees it, and the row segment files this process has mapped."""

    noun, short_noun = "rows", "rows"
    capacity = 64  # a random batch may touch every segment of a dataset of many files

    @staticmethod
    def referenced(table: pa.Table) -> bool:
        """Whether `table` is an answer by reference (else it holds the values)."""
        metadata = table.schema.metadata
        return metadata is not None and METADATA_KEY in metadata

    def resolve(self, table: pa.Table) -> pa.Table:
        """The rows `table` references (an answer by reference), gathered from the segment files in its order
        (`SegmentUnavailable` if some referenced file cannot be read here)."""
        return self.resolve_columns(table)[0]

    def resolve_columns(self, table: pa.Table) -> tuple[pa.Table, dict[str, np.ndarray]]:
        """`resolve(table)`, and the columns of numbers and of (nested) fixed-size lists of them as the arrays they
        were gathered into, shaped `(rows, *list sizes)` as `episerve._columns.table_columns` makes them from the
        table (the same memory): a batch's columns are then not converted back from Arrow."""
        described = json.loads(table.schema.metadata[METADATA_KEY])
        segment_of = _values(table.column("segment"), np.dtype(np.int32))
        row_of = _values(table.column("row"), np.dtype(np.int64))
        return self.gather(described["columns"], described["segments"], segment_of, row_of)

    def gather(
        self, columns: list[str], entries: list[dict[str, Any]], segment_of: np.ndarray, row_of: np.ndarray
    ) -> tuple[pa.Table, dict[str, np.ndarray]]:
        """Row `row_of[i]` of the segment file `entries[segment_of[i]]` describes, for each `i`, of `columns`, as
        `resolve_columns` gives them (`SegmentUnavailable` if some file cannot be read here)."""
        self.files.drop_unlinked()
        segments = [self._segment(entry) for entry in entries]
        if not segments:
            raise SegmentUnavailable("the answer references no segment")
        if len(segment_of) and (segment_of.min() < 0 or segment_of.max() >= len(segments)):
            raise SegmentUnavailable("a reference names a segment the answer does not list")
        names = [str(name) for name in columns]
        try:
            gathered = _gather([segment.projected(names) for segment in segments], segment_of, row_of)
        except (pa.ArrowException, KeyError) as exc:  # segments of another schema than the answer's
            raise SegmentUnavailable(f"the referenced segments do not hold the rows asked: {exc}") from exc
        self.read()
        return gathered

    def _segment(self, entry: dict[str, Any]) -> _RowSegment:
        segment = self.files.mapped(entry, "rows", _RowSegment).content
        if segment.num_rows != entry["rows"]:
            raise SegmentUnavailable(f"{entry['path']} holds {segment.num_rows} rows, not the {entry['rows']} stated")
        return segment


class _RowSegment:
    """The record batches of one mapped segment file (zero-copy), and their selections."""

    def __init__(self, path: Path, data: pa.Buffer) -> None:
        try:
            reader = pa.ipc.open_file(pa.BufferReader(data))
            self.batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        except pa.ArrowException as exc:
            raise SegmentUnavailable(f"{path} is not a segment: {exc}") from exc
        self.schema, self.data = reader.schema, data
        self.offsets = np.cumsum([0, *(batch.num_rows for batch in self.batches)])
        self._selections: dict[tuple[str, ...], _Selection] = {}

    @property
    def num_rows(self) -> int:
        return int(self.offsets[-1])

    def projected(self, columns: list[str]) -> _Selection:
        """The batches restricted to `columns`, in that order (remembered for a few selections)."""
        key = tuple(columns)
        found = self._selections.get(key)
        if found is None:
            missing = [name for name in columns if self.schema.get_field_index(name) < 0]
            if missing:
                raise SegmentUnavailable(f"a segment has no column {missing[0]!r}")
            if len(self._selections) >= _SELECTIONS_REMEMBERED:
                self._selections.clear()
            whole = columns == self.schema.names
            batches = self.batches if whole else [batch.select(columns) for batch in self.batches]
            schema = self.schema if whole else pa.schema([self.schema.field(c) for c in columns], self.schema.metadata)
            found = self._selections[key] = _Selection(schema, batches, self.offsets, self.data)
        return found


class _Selection:
    """Some columns of a segment: its batches' `schema`, the `batches`, their row `offsets`, whether a row of them
    is wide (variable-width values of `_WIDE_ROW_BYTES` or more), and each column of fixed-width values without
    nulls (numbers, fixed-size lists of them) as a `_FixedColumn` of the map `data` (`fixed`; None for others)."""

    def __init__(self, schema: pa.Schema, batches: list[pa.RecordBatch], offsets: np.ndarray, data: pa.Buffer) -> None:
        self.schema, self.batches, self.offsets = schema, batches, offsets
        rows = max(1, int(offsets[-1]))
        variable = any(_variable_width(field.type) for field in schema)
        self.wide = variable and sum(batch.nbytes for batch in batches) / rows >= _WIDE_ROW_BYTES
        self.fixed = [_fixed_column(data, [batch.column(n) for batch in batches]) for n in range(len(schema))]
        self._others: dict[tuple[int, ...], list[pa.RecordBatch]] = {}

    def others(self, numbers: tuple[int, ...]) -> list[pa.RecordBatch]:
        """The batches restricted to columns `numbers` (remembered)."""
        found = self._others.get(numbers)
        if found is None:
            found = self._others[numbers] = [batch.select(list(numbers)) for batch in self.batches]
        return found


class _FixedColumn:
    """A column of fixed-width values without nulls in one segment file: its values as one array over the whole
    map (`values`), where each record batch's first value is in it (`starts`), and how many values a row holds
    (`width`). Rows anywhere in the file are then gathered by one fancy index, with no call per record batch."""

    def __init__(self, values: np.ndarray, starts: np.ndarray, width: int) -> None:
        self.values, self.starts, self.width = values, starts, width
        # Row-sized windows starting at every value: a row is then one item to copy, not `width` of them.
        self._windows = sliding_window_view(values, width) if width > 1 else values.reshape(-1, 1)

    def rows(self, batch_of: np.ndarray, within: np.ndarray) -> np.ndarray:
        """Rows `within` of batches `batch_of`, copied in that order as `(rows, width)`."""
        return self._windows[self.starts[batch_of] + within * self.width]


def _fixed_column(data: pa.Buffer, arrays: list[pa.Array]) -> _FixedColumn | None:
    """The column of `arrays` (its record batches, all within `data`) as a `_FixedColumn`, if it holds numbers or
    (nested) fixed-size lists of them without nulls, each batch's values aligned in the map (Arrow IPC aligns
    buffers to 8 bytes)."""
    views = [_fixed_rows(array) for array in arrays]
    if not views or any(view is None for view in views):
        return None
    dtype, width = views[0].dtype, views[0].shape[1]  # type: ignore[union-attr]
    starts = []
    for view in views:
        assert view is not None
        offset = view.ctypes.data - data.address if len(view) else 0
        if offset < 0 or offset % dtype.itemsize or offset + view.nbytes > data.size:
            return None
        starts.append(offset // dtype.itemsize)
    values = np.frombuffer(data, dtype=dtype, count=data.size // dtype.itemsize)
    return _FixedColumn(values, np.array(starts, dtype=np.int64), width)


def _gather(
    segments: list[_Selection], segment_of: np.ndarray, row_of: np.ndarray
) -> tuple[pa.Table, dict[str, np.ndarray]]:
    """Row `row_of[i]` of `segments[segment_of[i]]` for each `i`, in that order, as one table, and its columns of
    fixed-width values as the arrays the table's columns lie in, shaped `(rows, *list sizes)`."""
    schema = segments[0].schema
    arrays: dict[str, np.ndarray] = {}
    if len(row_of) == 0:
        return schema.empty_table(), arrays
    if len(segments) == 1:  # most takes: no row to sort by segment
        rows_of_segment: list[Any] = [slice(None)]
        batch_of, within = _located(segments[0], row_of)
    else:
        rows_of_segment = [np.flatnonzero(segment_of == number) for number in range(len(segments))]
        batch_of, within = np.empty_like(row_of), np.empty_like(row_of)
        for segment, here in zip(segments, rows_of_segment, strict=True):
            batch_of[here], within[here] = _located(segment, row_of[here])
    columns: list[Any] = [None] * len(schema)
    others = []
    for number, field in enumerate(schema):
        fixed = [segment.fixed[number] for segment in segments]
        if any(column is None for column in fixed):
            others.append(number)
            continue
        if len(fixed) == 1:
            values = fixed[0].rows(batch_of, within)  # type: ignore[union-attr]
        else:
            values = np.empty((len(row_of), fixed[0].width), dtype=fixed[0].values.dtype)  # type: ignore[union-attr]
            for column, here in zip(fixed, rows_of_segment, strict=True):
                values[here] = column.rows(batch_of[here], within[here])  # type: ignore[union-attr]
        columns[number] = _as_arrow(values, field)
        arrays[field.name] = values.reshape(len(row_of), *_list_sizes(field.type))
    if others:
        batches = [segment.others(tuple(others)) for segment in segments]
        if segments[0].wide and len(row_of) <= _ROW_SLICE_MAX:
            taken = _sliced(batches, segment_of, batch_of, within)
        else:
            taken = _taken(batches, segment_of, batch_of, within)
        for position, number in enumerate(others):
            columns[number] = taken.column(position)
    if len(set(schema.names)) < len(schema):  # a name twice: left to the table
        arrays = {}
    return pa.Table.from_arrays(columns, schema=schema), arrays


def _list_sizes(kind: pa.DataType) -> tuple[int, ...]:
    """The sizes of (nested) fixed-size lists, outermost first; `()` for a plain type."""
    sizes = []
    while pa.types.is_fixed_size_list(kind):
        sizes.append(kind.list_size)
        kind = kind.value_type
    return tuple(sizes)


def _located(segment: _Selection, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The record batch holding each of `rows` of `segment`, and the row within it."""
    if len(rows) and (rows.min() < 0 or rows.max() >= segment.offsets[-1]):
        raise SegmentUnavailable(f"a row is past the end of a segment of {segment.offsets[-1]} rows")
    batch_of = np.searchsorted(segment.offsets, rows, side="right") - 1
    return batch_of, rows - segment.offsets[batch_of]


def _sliced(
    batches: list[list[pa.RecordBatch]], segment_of: np.ndarray, batch_of: np.ndarray, within: np.ndarray
) -> pa.Table:
    """Rows `within` of `batches[segment_of][batch_of]` in that order, for wide rows (images, long strings): a
    zero-copy slice of the map per run of consecutive rows, then a single copy; taking per batch and then
    reordering would copy every wide value twice."""
    breaks = (np.diff(segment_of) != 0) | (np.diff(batch_of) != 0) | (np.diff(within) != 1)
    starts = [0, *(np.flatnonzero(breaks) + 1).tolist()]
    stops = [*starts[1:], len(within)]
    segment_at, batch_at, within_at = (values[starts].tolist() for values in (segment_of, batch_of, within))
    pieces = [
        batches[segment][batch].slice(row, stop - start)
        for segment, batch, row, start, stop in zip(segment_at, batch_at, within_at, starts, stops, strict=True)
    ]
    return pa.Table.from_batches([pa.concat_batches(pieces)])


def _taken(
    batches: list[list[pa.RecordBatch]], segment_of: np.ndarray, batch_of: np.ndarray, within: np.ndarray
) -> pa.Table:
    """Rows `within` of `batches[segment_of][batch_of]` in that order: taken batch by batch (no whole column is
    touched), then put in order by one more take."""
    if (segment_of == segment_of[0]).all() and (batch_of == batch_of[0]).all():  # one batch: in order at once
        return pa.Table.from_batches([batches[int(segment_of[0])][int(batch_of[0])].take(pa.array(within))])
    order = np.lexsort((within, batch_of, segment_of))
    keys = segment_of[order].astype(np.int64) * (int(batch_of.max()) + 1) + batch_of[order]
    pieces = [
        batches[int(segment_of[group[0]])][int(batch_of[group[0]])].take(pa.array(within[group]))
        for group in np.split(order, np.flatnonzero(np.diff(keys)) + 1)
    ]
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    return pa.Table.from_batches(pieces).take(pa.array(inverse))


def _fixed_rows(array: pa.Array) -> np.ndarray | None:
    """The values of a column of numbers or (nested) fixed-size lists of them as a `(rows, width)` view of its
    buffer; None for other columns and for any with nulls."""
    width = 1
    while pa.types.is_fixed_size_list(array.type):
        if array.null_count:
            return None
        size = array.type.list_size
        array = array.values.slice(array.offset * size, len(array) * size)
        width *= size
    if not (pa.types.is_integer(array.type) or pa.types.is_floating(array.type)) or array.null_count:
        return None
    return fixed_width(array, numeric_dtype(array.type)).reshape(-1, width)


def _as_arrow(values: np.ndarray, field: pa.Field) -> pa.Array:
    """`(rows, width)` values gathered by `_fixed_rows`' views as an array of `field`'s type (no copy)."""
    kind = field.type
    if pa.types.is_fixed_size_list(kind):
        size = kind.list_size
        inner = _as_arrow(values.reshape(len(values) * size, -1), kind.value_field)
        return pa.FixedSizeListArray.from_arrays(inner, type=kind)
    flat = np.ascontiguousarray(values).reshape(-1)
    return pa.Array.from_buffers(kind, len(flat), [None, pa.py_buffer(flat)])


def _values(column: pa.ChunkedArray, dtype: np.dtype) -> np.ndarray:
    """A column of references without nulls as one array."""
    chunk = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    return fixed_width(chunk, dtype)


def _variable_width(kind: pa.DataType) -> bool:
    """Whether values of `kind` vary in width (binary, strings, variable lists), at any depth."""
    if pa.types.is_fixed_size_list(kind):
        return _variable_width(kind.value_type)
    if pa.types.is_struct(kind):
        return any(_variable_width(kind.field(i).type) for i in range(kind.num_fields))
    return any(
        test(kind)
        for test in (
            pa.types.is_binary,
            pa.types.is_large_binary,
            pa.types.is_string,
            pa.types.is_large_string,
            pa.types.is_list,
            pa.types.is_large_list,
            pa.types.is_binary_view,
            pa.types.is_string_view,
        )
    )
