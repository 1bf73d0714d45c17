"""Rows picked by view index, in request order: the cheapest of four ways to gather them.

1. Byte copies straight out of the memory maps into request order (`app.reads.byte_gather`), when every column
   allows it;
2. for a few hundred wide rows (images, strings), one zero-copy slice per row, then a single concatenation;
3. otherwise Arrow `take` per stored batch, then one reorder;
4. rows of files whose segments are not built yet are read cold from the source's row groups (the segment is
   built in the background meanwhile).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

from app.reads.byte_gather import gather, segment_part
from app.store.cold_reads import ColdRows
from app.store.mapped_segments import Segment
from app.store.row_files import RowSource

_ROW_SLICE_MAX = 4096  # up to this many wide rows, gather by per-row slices (see _gather_row_slices)
_WIDE_ROW_BYTES = 2048

ColdTake = Callable[[ColdRows, np.ndarray, "list[str] | None"], pa.Table]  # stored rows (ascending) read cold


def gather_rows(
    sources: dict[int, RowSource],
    located: tuple[np.ndarray, np.ndarray],
    schema: pa.Schema,
    names: list[str] | None,
    cold: ColdTake,
) -> pa.Table:
    """The rows at `located` (source file, stored row) of the stored columns `names` (of `schema`), in that order
    (not empty), from each file's source the cheapest way it allows (see the module's docstring); rows of a file
    read cold come from `cold`."""
    files, stored = located
    schema = project(schema, names)
    if _all_segments(sources):
        copied = _gather_by_copy(sources, files, stored, names, schema)
        if copied is not None:
            return copied
        if len(files) <= _ROW_SLICE_MAX and has_variable_width(schema):
            first = sources[int(files[0])]
            assert isinstance(first, Segment)
            if first.row_bytes(names) >= _WIDE_ROW_BYTES:
                return _gather_row_slices(sources, files, stored, names, schema)
    order = np.lexsort((stored, files))
    pieces: list[pa.RecordBatch] = []
    bounds = np.flatnonzero(np.diff(files[order])) + 1
    for group in np.split(order, bounds):
        source = sources[int(files[group[0]])]
        if isinstance(source, Segment):
            pieces.extend(source.take(stored[group], names))
        else:
            pieces.extend(cold(source, stored[group], names).to_batches())
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    return pa.Table.from_batches(pieces, schema=schema).take(pa.array(inverse))


def _all_segments(sources: dict[int, RowSource]) -> bool:
    return all(isinstance(source, Segment) for source in sources.values())


def _gather_by_copy(
    sources: dict[int, RowSource],
    files: np.ndarray,
    stored: np.ndarray,
    names: list[str] | None,
    schema: pa.Schema,
) -> pa.Table | None:
    """Rows copied byte-wise from the maps straight into request order; None when a column cannot be copied so,
    or when too many rows would be copied one by one."""
    parts = []
    for number, segment in sources.items():
        assert isinstance(segment, Segment)
        positions = np.flatnonzero(files == number)
        part = segment_part(segment, positions, stored[positions], names)
        if part is None:
            return None
        parts.append(part)
    if len(files) > _ROW_SLICE_MAX and parts[0].mapped.copies_row_by_row:
        return None
    return gather(schema, parts, len(files))


def _gather_row_slices(
    sources: dict[int, RowSource],
    files: np.ndarray,
    stored: np.ndarray,
    names: list[str] | None,
    schema: pa.Schema,
) -> pa.Table:
    """Wide rows (images, strings) in request order: one zero-copy slice per row, then a single copy.

    Taking per stored batch and then reordering would copy every wide value twice; for the few hundred rows
    of a training batch, slicing row by row is the cheaper path.
    """
    pieces = [sources[f].row(r, names) for f, r in zip(files.tolist(), stored.tolist(), strict=True)]  # type: ignore[union-attr]
    return pa.Table.from_batches([pa.concat_batches(pieces)], schema=schema)


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


def project(schema: pa.Schema, columns: list[str] | None) -> pa.Schema:
    """`schema` restricted to `columns` (in that order), keeping its metadata."""
    if columns is None:
        return schema
    return pa.schema([schema.field(c) for c in columns], metadata=schema.metadata)
