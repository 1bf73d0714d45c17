"""Reading a batch of a mixture: one take per component, all in one request, assembled into one batch.

A batch's positions are grouped by component; each group is one take of that component's view (the decoded-frame
cache and frame references work as for one dataset), and the batch's takes travel together as one `POST /takes`
(`Client.read_takes`): a batch costs one request however many components it draws from. Each component's columns
are then fitted to the mixture's schema (`_mixture_schema`): renamed, vectors padded with their `<name>_is_real`
masks, missing cameras as zeros with `<name>_is_missing`, window flags of missing features all True, and
`dataset_index` set. Camera frames go straight from each response into their rows of the batch, channels first,
in one copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from episerve._client import Client
from episerve._columns import Allocate, Columns, table_columns
from episerve._mixture_schema import DATASET_INDEX, Feature, ResolvedMixture, vector_shape


class MixtureReader:
    """Reads rows of a resolved mixture's components into batches of the mixture's schema."""

    def __init__(self, client: Client, resolved: ResolvedMixture, decode_images: bool, empty: Allocate) -> None:
        self.client = client
        self.resolved = resolved
        self.decode_images = decode_images
        self.empty = empty

    def read(self, components: np.ndarray, rows: np.ndarray, empty: Allocate | None = None) -> Columns:
        """The rows `rows[i]` of components `components[i]`, as one batch's columns in that order; camera frames
        in arrays from `empty` (by default the reader's)."""
        count = len(rows)
        groups = [(k, np.flatnonzero(components == k)) for k in np.unique(components).tolist()]
        out = self._allocate(count, empty or self.empty)
        out[DATASET_INDEX] = np.asarray(components, dtype=np.int64).copy()
        pages = self.client.read_takes([(self.resolved.components[k].selection, rows[slots]) for k, slots in groups])
        for (k, slots), page in zip(groups, pages, strict=True):
            self._fill(out, count, k, slots, page.table)
        return {name: out[name] for name in self.resolved.names}

    def _allocate(self, count: int, empty: Allocate) -> dict[str, Any]:
        """Arrays for the features whose shape the schema fixes (cameras, vectors, masks, flags); the others are
        made from the first component's values."""
        out: dict[str, Any] = {}
        for feature in self.resolved.features:
            if feature.kind == "camera":
                *lead, height, width, channels = feature.arrow_type.shape
                out[feature.name] = empty((count, *lead, channels, height, width), np.dtype(np.uint8))
                if feature.flag is not None:
                    out[feature.flag] = np.zeros(count, dtype=bool)
            elif feature.kind == "vector" and feature.mask is not None:
                dims, leaf = vector_shape(feature.arrow_type)
                out[feature.name] = np.zeros((count, *dims), dtype=leaf.to_pandas_dtype())
                out[feature.mask] = np.zeros((count, dims[-1]), dtype=bool)
        return out

    def _fill(self, out: dict[str, Any], count: int, k: int, slots: np.ndarray, table: pa.Table) -> None:
        """Component `k`'s rows (`table`, in the order of `slots`) into their slots of the batch."""
        for feature in self.resolved.features:
            source = feature.sources[k]
            if source is None:
                _fill_missing(out, count, feature, slots)
                continue
            column = table.select([source])
            if feature.kind == "camera":
                target = out[feature.name]
                table_columns(column, frames=lambda parts, target=target: _frames_into(target, slots, parts))
                continue
            values = table_columns(column, buffers=(), decode_images=self.decode_images)[source]
            if feature.kind == "vector" and feature.mask is not None:
                width = values.shape[-1]
                out[feature.name][slots, ..., :width] = values
                out[feature.mask][slots, :width] = True
                continue
            _scatter(out, feature.name, slots, values, count)


def _scatter(out: dict[str, Any], name: str, slots: np.ndarray, values: np.ndarray, count: int) -> None:
    """`values` into rows `slots` of `out[name]`, made on first use like `values` (an object array when the
    components' values differ in shape)."""
    target = out.get(name)
    if target is None:
        target = out[name] = np.empty((count, *values.shape[1:]), dtype=values.dtype)
    elif target.dtype != object and (target.shape[1:] != values.shape[1:] or target.dtype != values.dtype):
        objects = np.empty(len(target), dtype=object)
        for row, value in enumerate(target):
            objects[row] = value
        target = out[name] = objects
    if target.dtype == object and values.dtype != object:
        for slot, value in zip(slots.tolist(), values, strict=True):
            target[slot] = value
    else:
        target[slots] = values


def _fill_missing(out: dict[str, Any], count: int, feature: Feature, slots: np.ndarray) -> None:
    if feature.kind == "camera":
        out[feature.name][slots] = 0
        out[feature.flag][slots] = True  # type: ignore[index]
    elif feature.kind == "pad":
        _scatter(out, feature.name, slots, np.ones((len(slots), feature.arrow_type.list_size), dtype=bool), count)
    # a padded vector's rows are zeros and its mask False already


def _frames_into(target: np.ndarray, slots: np.ndarray, parts: list[np.ndarray]) -> None:
    """Channels-last frames `(rows, ..., H, W, C)` in parts, copied channels-first into rows `slots` of `target`:
    frame by frame, one plane at a time, each into a contiguous destination (a third faster than one fancy-indexed
    assignment per channel)."""
    rows = iter(slots.tolist())
    for part in parts:
        for source in part:
            destination = target[next(rows)]
            for channel in range(source.shape[-1]):
                destination[..., channel, :, :] = source[..., channel]
