"""Parquet files whose fixed-size list columns hold nulls, on a pyarrow that cannot read them.

pyarrow before 26 fails to read a fixed-size list column with null entries from parquet ("Expected all lists to be
of size=3 but index 2 had size=0": its reader assembles the list without slots for the null entries, Arrow issue
35692), and pyarrow 25 is the newest release for Python 3.10. Such a file is read there through a footer whose Arrow
schema says plain lists for those columns; the reader then builds ordinary lists, and casting them back to the
fixed-size type (`conform_batch`, or `as_stored`) gives the column the file holds, nulls included.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

READS_NULL_FIXED_LISTS = int(pa.__version__.split(".", 1)[0]) >= 26


def readable_footer(metadata: pq.FileMetaData) -> pq.FileMetaData | None:
    """A footer this pyarrow reads the file through, or None when the file's own does (no fixed-size list column
    that may hold nulls, or a pyarrow that reads them)."""
    if READS_NULL_FIXED_LISTS:
        return None
    schema = metadata.schema.to_arrow_schema()
    first_leaf = 0
    plain = []
    changed = False
    for field in schema:
        leaves = _leaf_count(field.type)
        if _has_fixed_list(field.type) and _may_hold_nulls(metadata, range(first_leaf, first_leaf + leaves)):
            field = field.with_type(_plain_lists(field.type))
            changed = True
        plain.append(field)
        first_leaf += leaves
    if not changed:
        return None
    sink = pa.BufferOutputStream()
    pq.ParquetWriter(sink, pa.schema(plain, metadata=schema.metadata)).close()  # the plain schema's empty file
    footer = pq.read_metadata(pa.BufferReader(sink.getvalue()))
    footer.append_row_groups(metadata)  # the file's row groups: the same parquet columns, read by another schema
    return footer


def as_stored(table: pa.Table, stored: pa.Schema) -> pa.Table:
    """A table read through `readable_footer`, with the column types of the file's own schema."""
    return table if table.schema.equals(stored, check_metadata=False) else table.cast(stored)


def _may_hold_nulls(metadata: pq.FileMetaData, leaves: range) -> bool:
    """Whether any of the given leaf columns counts a null in some row group (or does not say)."""
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for leaf in leaves:
            stats = row_group.column(leaf).statistics
            if stats is None or not stats.has_null_count or stats.null_count > 0:
                return True
    return False


def _has_fixed_list(kind: pa.DataType) -> bool:
    if pa.types.is_fixed_size_list(kind):
        return True
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _has_fixed_list(kind.value_type)
    if pa.types.is_struct(kind):
        return any(_has_fixed_list(kind.field(i).type) for i in range(kind.num_fields))
    return False


def _plain_lists(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_fixed_size_list(kind) or pa.types.is_list(kind):
        return pa.list_(kind.value_field.with_type(_plain_lists(kind.value_type)))
    if pa.types.is_large_list(kind):
        return pa.large_list(kind.value_field.with_type(_plain_lists(kind.value_type)))
    if pa.types.is_struct(kind):
        return pa.struct([kind.field(i).with_type(_plain_lists(kind.field(i).type)) for i in range(kind.num_fields)])
    return kind


def _leaf_count(kind: pa.DataType) -> int:
    """How many parquet leaf columns an Arrow type is stored as."""
    if pa.types.is_fixed_size_list(kind) or pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _leaf_count(kind.value_type)
    if pa.types.is_struct(kind):
        return sum(_leaf_count(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_map(kind):
        return _leaf_count(kind.key_type) + _leaf_count(kind.item_type)
    return 1
