"""Row gathers as plain byte copies out of the memory maps, straight into request order.

A take of a few hundred rows is dominated by per-call overhead when done with Arrow: one `take` kernel call per
column per touched stored batch plus a second take to restore the request order, or (for wide rows) a
concatenation of hundreds of one-row slices. But when every selected column is fixed-width (numbers,
fixed-size lists of numbers), binary or string, or a struct of those, and holds no nulls, each value is a run
of bytes at a computable address in a memory map, and a take copies those bytes to their places in the answer.
The addresses of every row and column are computed at once, in request order, over one view across the touched
segments; then each fixed-width column is one NumPy fancy-index (its values as items of their width), and each
variable-width column one fancy-index over its bytes (short values, such as paths) or one copy per row (long
ones, such as encoded frames).

Every address read lies inside a buffer of a stored batch: rows are bounded by the batch lengths, and offsets
of variable-width columns are validated once per segment (monotonic, within their data buffer).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from app.reads.segment_memo import remembered
from app.store.mapped_segments import Segment

_SHORT_VALUE_BYTES = 256  # variable-width values this long on average are gathered by one fancy-index


@dataclass(frozen=True)
class Fixed:
    """A byte-aligned fixed-width type (nested fixed-size lists included): `width` bytes per row."""

    width: int


@dataclass(frozen=True)
class Variable:
    """binary / string (or their large forms): an offsets buffer and a data buffer."""

    offset_type: type[np.signedinteger]

    @property
    def offset_size(self) -> int:
        return np.dtype(self.offset_type).itemsize


@dataclass(frozen=True)
class Struct:
    """A struct whose fields are each one of these kinds."""

    fields: tuple[Kind, ...]


Kind = Fixed | Variable | Struct


@functools.lru_cache(maxsize=256)
def gather_kinds(schema: pa.Schema) -> list[Kind] | None:
    """How each column is copied, or None when one of them cannot be."""
    kinds = [column_kind(field.type) for field in schema]
    return None if any(kind is None for kind in kinds) else kinds  # type: ignore[return-value]


def column_kind(kind: pa.DataType) -> Kind | None:
    width = fixed_row_width(kind)
    if width is not None:
        return Fixed(width)
    if pa.types.is_binary(kind) or pa.types.is_string(kind):
        return Variable(np.int32)
    if pa.types.is_large_binary(kind) or pa.types.is_large_string(kind):
        return Variable(np.int64)
    if pa.types.is_struct(kind) and kind.num_fields:
        fields = [column_kind(kind.field(i).type) for i in range(kind.num_fields)]
        return None if any(f is None for f in fields) else Struct(tuple(fields))  # type: ignore[arg-type]
    return None


def fixed_row_width(kind: pa.DataType) -> int | None:
    """Bytes per value of a byte-aligned fixed-width type (nested fixed-size lists included), else None."""
    if pa.types.is_fixed_size_list(kind):
        inner = fixed_row_width(kind.value_type)
        return None if inner is None else inner * kind.list_size
    if pa.types.is_boolean(kind) or pa.types.is_dictionary(kind) or isinstance(kind, pa.ExtensionType):
        return None
    try:
        bits = kind.bit_width
    except ValueError:  # variable width, nested or null
        return None
    return bits // 8 if bits > 0 and bits % 8 == 0 else None


def _leaf_kinds(kinds: Sequence[Kind]) -> list[Fixed | Variable]:
    found: list[Fixed | Variable] = []
    for kind in kinds:
        found.extend(_leaf_kinds(kind.fields) if isinstance(kind, Struct) else [kind])
    return found


class MappedColumns:
    """The selected columns of a segment's stored batches, located in the memory they are mapped from: per
    stored batch and leaf (a buffer-level piece of a column), where its values start (variable-width: its
    offsets) and where its data buffer starts (absolute addresses)."""

    def __init__(
        self,
        batches: list[pa.RecordBatch],
        column_kinds: list[Kind],
        starts: np.ndarray,
        data_starts: np.ndarray,
        span: tuple[int, int],
    ) -> None:
        self.batches = batches  # keeps the mapped memory alive
        self.column_kinds = column_kinds  # per column; `kinds` per leaf
        self.kinds = _leaf_kinds(column_kinds)
        self.starts, self.data_starts = starts, data_starts  # (stored batch, leaf)
        self.low, self.high = span  # every value lies in [low, high)
        self.widths = np.array([k.width if isinstance(k, Fixed) else 0 for k in self.kinds], dtype=np.int64)
        # whether some values may be copied one row at a time (long variable-width ones), not by a fancy-index
        self.copies_row_by_row = any(isinstance(k, Variable) for k in self.kinds)

    @classmethod
    def of(cls, batches: list[pa.RecordBatch], kinds: list[Kind]) -> MappedColumns | None:
        """None when a column holds nulls or there are no rows (nothing to copy from)."""
        located = [_Located() for _ in batches]
        for batch, places in zip(batches, located, strict=True):
            for column, kind in zip(batch.columns, kinds, strict=True):
                if not _locate(column, kind, places):
                    return None
        regions = [region for places in located for region in places.regions]
        if not regions:
            return None
        starts = np.array([places.starts for places in located], dtype=np.int64)
        data_starts = np.array([places.data_starts for places in located], dtype=np.int64)
        low, high = min(r[0] for r in regions), max(r[1] for r in regions)
        return cls(batches, kinds, starts, data_starts, (low, high))


class _Located:
    """Addresses found in one stored batch: per leaf, where it starts; and every byte range values lie in."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.data_starts: list[int] = []
        self.regions: list[tuple[int, int]] = []


def _locate(array: pa.Array, kind: Kind, places: _Located) -> bool:
    """Record where `array`'s leaves lie; False when it holds nulls or invalid offsets."""
    if array.null_count:
        return False
    if isinstance(kind, Struct):
        return all(_locate(array.field(i), field, places) for i, field in enumerate(kind.fields))
    if isinstance(kind, Variable):
        try:
            array.validate(full=True)  # offsets monotonic and inside the data: every copy stays in bounds
        except pa.ArrowInvalid:
            return False
        _, offsets, data = array.buffers()
        start = offsets.address + array.offset * kind.offset_size
        places.starts.append(start)
        places.data_starts.append(data.address if data is not None else 0)
        if len(array):
            places.regions.append((start, start + (len(array) + 1) * kind.offset_size))
            if data is not None and data.size:
                places.regions.append((data.address, data.address + data.size))
        return True
    leaf, first = array, 0
    while pa.types.is_fixed_size_list(leaf.type):
        if leaf.null_count:
            return False
        first = (first + leaf.offset) * leaf.type.list_size
        leaf = leaf.values
    if leaf.null_count:
        return False
    start = leaf.buffers()[1].address + (first + leaf.offset) * (leaf.type.bit_width // 8)
    places.starts.append(start)
    places.data_starts.append(0)
    if len(array):
        places.regions.append((start, start + len(array) * kind.width))
    return True


@dataclass(frozen=True)
class Part:
    """Rows of one segment for a take: stored batch and row within it, and their positions in the answer."""

    mapped: MappedColumns
    positions: np.ndarray
    batches: np.ndarray
    rows: np.ndarray


def gather(schema: pa.Schema, parts: list[Part], length: int) -> pa.Table:
    """The answer of `length` rows, each copied from the part that holds it (all parts of one selection)."""
    kinds = parts[0].mapped.column_kinds
    leaves = iter(_gather_leaves(parts))
    arrays = [_assemble(field.type, kind, leaves, length) for field, kind in zip(schema, kinds, strict=True)]
    return pa.Table.from_batches([pa.RecordBatch.from_arrays(arrays, schema=schema)])


def _gather_leaves(parts: list[Part]) -> list[list[pa.Buffer | None]]:
    """Each leaf's buffers: the addresses of every row and leaf, in request order, then one gather per leaf."""
    low = min(p.mapped.low for p in parts)
    memory = _memory(low, max(p.mapped.high for p in parts), [p.mapped.batches for p in parts])
    if len(parts) == 1:
        positions, rows, batches = parts[0].positions, parts[0].rows, parts[0].batches
        starts = parts[0].mapped.starts[batches] - low  # (row, leaf)
        data_starts = parts[0].mapped.data_starts[batches] - low
    else:
        positions = np.concatenate([p.positions for p in parts])
        rows = np.concatenate([p.rows for p in parts])
        starts = np.concatenate([p.mapped.starts[p.batches] for p in parts]) - low
        data_starts = np.concatenate([p.mapped.data_starts[p.batches] for p in parts]) - low
    if len(positions) and not (positions[0] == 0 and (np.diff(positions) == 1).all()):  # one segment: in order
        order = np.empty_like(positions)
        order[positions] = np.arange(len(positions))
        rows, starts, data_starts = rows[order], starts[order], data_starts[order]
    addresses = starts + rows[:, None] * parts[0].mapped.widths  # fixed-width leaves: where each value starts
    columns: list[list[pa.Buffer | None]] = []
    for n, kind in enumerate(parts[0].mapped.kinds):
        if isinstance(kind, Variable):
            columns.append(_copy_variable(memory, starts[:, n] + rows * kind.offset_size, data_starts[:, n], kind))
            continue
        item = _item_type(kind.width)
        items = np.ndarray((len(memory) - kind.width + 1,), item, memory, strides=(1,))  # one at every address
        columns.append([None, pa.py_buffer(items[addresses[:, n]])])
    return columns


@functools.cache
def _item_type(width: int) -> np.dtype:
    return np.dtype((np.void, width))


def _memory(low: int, high: int, owner: object) -> np.ndarray:
    """Bytes [low, high) of the address space, kept alive by `owner` (record batches over memory maps). Only
    addresses inside those batches' buffers are ever read through it."""
    return np.frombuffer(pa.foreign_buffer(low, high - low, base=owner), dtype=np.uint8)


def _copy_variable(
    memory: np.ndarray, offsets_at: np.ndarray, data_starts: np.ndarray, kind: Variable
) -> list[pa.Buffer | None]:
    """A variable-width leaf's offsets and values, rows in request order (`offsets_at`: where each row's pair of
    offsets lies)."""
    offset_type = np.dtype(kind.offset_type)
    bounds = memory[offsets_at[:, None] + np.arange(2 * offset_type.itemsize)].view(offset_type).astype(np.int64)
    lengths = bounds[:, 1] - bounds[:, 0]
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > np.iinfo(offset_type).max:
        raise OverflowError("the gathered values do not fit their offsets")
    sources = data_starts + bounds[:, 0]
    if offsets[-1] <= _SHORT_VALUE_BYTES * len(lengths):
        values = _short_values(memory, sources, lengths, offsets)
    else:
        values = pa.allocate_buffer(int(offsets[-1]))  # from Arrow's pool: reused pages, not fresh ones each time
        target, source = memoryview(values).cast("B"), memoryview(memory)
        copies = zip(offsets[:-1].tolist(), sources.tolist(), lengths.tolist(), strict=True)
        for target_at, source_at, count in copies:
            target[target_at : target_at + count] = source[source_at : source_at + count]
    return [None, pa.py_buffer(offsets.astype(offset_type)), values]


def _short_values(memory: np.ndarray, sources: np.ndarray, lengths: np.ndarray, offsets: np.ndarray) -> pa.Buffer:
    """Short values (paths, labels) in one fancy-index over their bytes: cheaper than a copy per row."""
    addresses = np.arange(offsets[-1], dtype=np.int64) + np.repeat(sources - offsets[:-1], lengths)
    return pa.py_buffer(memory[addresses])


def _assemble(kind: pa.DataType, plan: Kind, leaves: Iterator[list[pa.Buffer | None]], length: int) -> pa.Array:
    if isinstance(plan, Struct):
        children = [_assemble(kind.field(i).type, field, leaves, length) for i, field in enumerate(plan.fields)]
        return pa.Array.from_buffers(kind, length, [None], children=children)
    buffers = next(leaves)
    if isinstance(plan, Variable):
        return pa.Array.from_buffers(kind, length, buffers)
    return _fixed_array(kind, length, buffers[1])


def _fixed_array(kind: pa.DataType, length: int, data: pa.Buffer) -> pa.Array:
    if pa.types.is_fixed_size_list(kind):
        child = _fixed_array(kind.value_type, length * kind.list_size, data)
        return pa.Array.from_buffers(kind, length, [None], children=[child])
    return pa.Array.from_buffers(kind, length, [None, data])


def mapped_columns(segment: Segment, columns: list[str] | None) -> MappedColumns | None:
    """The selected columns of `segment` located in its map (remembered by the segment); None when a column
    cannot be copied byte-wise (see `gather_kinds`) or holds nulls."""

    def locate() -> MappedColumns | None:
        batches = segment.projected(columns)
        kinds = gather_kinds(batches[0].schema) if batches else None
        return None if kinds is None else MappedColumns.of(batches, kinds)

    return remembered(segment, ("mapped-columns", None if columns is None else tuple(columns)), locate)


def segment_part(segment: Segment, positions: np.ndarray, rows: np.ndarray, columns: list[str] | None) -> Part | None:
    """Stored `rows` of `segment`, going to answer `positions`, located for `gather`; None when a column cannot
    be copied byte-wise."""
    mapped = mapped_columns(segment, columns)
    if mapped is None:
        return None
    numbers = np.searchsorted(segment.batch_offsets, rows, side="right") - 1
    return Part(mapped, positions, numbers, rows - segment.batch_offsets[numbers])
