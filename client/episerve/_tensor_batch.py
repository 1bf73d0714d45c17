"""Batch dicts that cross process boundaries as one block of memory rather than one per tensor (`TensorBatch`).

A DataLoader worker sends each batch to the main process through torch's multiprocessing pickler, which moves
every tensor's storage to shared memory and passes its file descriptor over a fresh connection with an
authentication handshake: seven tensors per batch cost seven handshakes, more than the batch's own data takes to
fetch. `TensorBatch` packs its tensors into one block when it is pickled, and the receiving side rebuilds them
as views of that block. A block of up to `INLINE_BLOCK_BYTES` (a 256-row batch of state/action vectors is
about 40 KB) travels inside the pickle, through the worker's result pipe: creating, passing and mapping a
shared-memory file costs more than copying that many bytes. A larger block goes to shared memory: one
descriptor per batch; the block is allocated in shared memory, so it is filled once and never copied again.
Tensors already in shared memory (a large column written there directly, see `shared_empty`) are left out of the
block and passed by descriptor as they are.
"""

from __future__ import annotations

import copy
import math
import sys
from typing import Any

import numpy as np

from episerve import _shared_blocks as shared_blocks

_ALIGN = 64
INLINE_BLOCK_BYTES = 256 * 1024


class TensorBatch(dict):
    """A batch dict (column name -> tensor or list) that pickles all its CPU tensors as one block.

    It is an ordinary `dict` in every other way, and unpickles as one: the tensors come back as views of one
    block (disjoint, writable); of a block in shared memory, `torch.save` of one column would also save its
    neighbours' bytes.
    """

    def __copy__(self) -> TensorBatch:
        return TensorBatch(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> TensorBatch:
        return TensorBatch({name: copy.deepcopy(value, memo) for name, value in self.items()})

    def __reduce__(self) -> tuple[Any, ...]:
        reduced = self._reduce()
        torch = sys.modules.get("torch")
        if torch is None:
            return reduced
        rebuild, args = reduced
        values = args[0] if rebuild is dict else {**args[2], **_first_packed(rebuild, args)}
        pooled = shared_blocks.tickets({k: v for k, v in values.items() if isinstance(v, torch.Tensor)})
        return (_watched, (rebuild, args, pooled)) if pooled else reduced

    def _reduce(self) -> tuple[Any, ...]:
        torch = sys.modules.get("torch")  # tensors only exist once torch is imported
        packed = {}
        if torch is not None:  # tensors already in shared memory travel as they are: one descriptor, no copy
            packed = {
                k: v
                for k, v in self.items()
                if isinstance(v, torch.Tensor) and v.is_cpu and not v.untyped_storage().is_shared()
            }
        if not packed or any(t.requires_grad for t in packed.values()):
            return (dict, (dict(self),))
        layout, size = _layout(packed)
        if size == 0 or (len(packed) < 2 and size > INLINE_BLOCK_BYTES):  # nothing to pack, or one large tensor
            return (dict, (dict(self),))  # that torch's pickler moves as well
        others = {k: v for k, v in self.items() if k not in packed}
        if 0 < size <= INLINE_BLOCK_BYTES:
            data = bytearray(size)
            _fill_bytes(torch, data, layout, packed)
            return (_unpack_bytes, (data, layout, others, list(self)))
        block = _shared_block(torch, size)
        _fill(block, layout, packed)
        return (_unpack, (block, layout, others, list(self)))


Layout = list[tuple[str, Any, tuple[int, ...], int]]  # per tensor: name, dtype, shape, offset in the block


def _layout(tensors: dict[str, Any]) -> tuple[Layout, int]:
    layout, size = [], 0
    for name, tensor in tensors.items():
        layout.append((name, tensor.dtype, tuple(tensor.shape), size))
        size += -(-tensor.nbytes // _ALIGN) * _ALIGN
    return layout, size


def _fill(block: Any, layout: Layout, tensors: dict[str, Any]) -> None:
    for (_, dtype, shape, offset), tensor in zip(layout, tensors.values(), strict=True):
        _view(block, dtype, shape, offset).copy_(tensor)


def _fill_bytes(torch: Any, data: bytearray, layout: Layout, tensors: dict[str, Any]) -> None:
    """`_fill` into the bytes of an inline block, through numpy where the dtype allows (a numpy view and copy cost
    about a fifth of torch's slicing and viewing, per tensor)."""
    block = None
    for (_, dtype, shape, offset), tensor in zip(layout, tensors.values(), strict=True):
        target = _numpy_view(data, dtype, shape, offset)
        if target is not None:
            try:
                target[...] = tensor.numpy()
                continue
            except (RuntimeError, TypeError):  # a tensor numpy cannot see (conjugate or negative bit set)
                pass
        if block is None:
            block = torch.frombuffer(data, dtype=torch.uint8)
        _view(block, dtype, shape, offset).copy_(tensor)


_NUMPY_DTYPES: dict[Any, np.dtype] = {}


def _numpy_dtype(dtype: Any) -> np.dtype | None:
    """The numpy dtype of torch `dtype`, None for those numpy has not (bfloat16, quantized...)."""
    found = _NUMPY_DTYPES.get(dtype)
    if found is None and dtype not in _NUMPY_DTYPES:
        torch = sys.modules["torch"]
        try:
            found = torch.empty(0, dtype=dtype).numpy().dtype
        except (RuntimeError, TypeError):
            found = None
        _NUMPY_DTYPES[dtype] = found
    return found


def _numpy_view(data: bytearray, dtype: Any, shape: tuple[int, ...], offset: int) -> np.ndarray | None:
    """A writable numpy view of the bytes of a tensor of `dtype` and `shape` at `offset` in `data` (None where
    numpy has no such dtype)."""
    numpy_dtype = _numpy_dtype(dtype)
    if numpy_dtype is None:
        return None
    return np.frombuffer(data, numpy_dtype, count=math.prod(shape), offset=offset).reshape(shape)


def shared_empty(torch: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """An uninitialised tensor in shared memory: a DataLoader worker that writes a large column there directly
    (`TensorBatch` then passes it without packing it) saves a copy of it and the page faults of a second
    allocation; in a worker it lies in a block the worker reuses (`episerve._shared_blocks`). A plain tensor
    where shared memory cannot be had."""
    pool = shared_blocks.worker_pool(torch)
    if pool is not None:
        return pool.empty(shape, dtype)
    size = math.prod(shape) * dtype.itemsize
    try:
        return torch.empty(0, dtype=dtype).set_(torch.UntypedStorage._new_shared(size), 0, shape)
    except (AttributeError, RuntimeError):
        return torch.empty(shape, dtype=dtype)


def _shared_block(torch: Any, size: int) -> Any:
    """`size` bytes allocated in shared memory, which torch's pickler then passes as they are: a block allocated
    privately would be copied into shared memory once more when pickled (236 MB a batch of 64 float32 480x640
    frames)."""
    return shared_empty(torch, (size,), torch.uint8)  # a torch without shared storages: its pickler copies it


def _first_packed(rebuild: Any, args: tuple[Any, ...]) -> dict[str, Any]:
    """A packed tensor, as the one by which the block's ticket is known ({} when the pickle carries the bytes)."""
    if rebuild is not _unpack:
        return {}
    block, layout = args[0], args[1]
    name, dtype, shape, offset = layout[0]
    return {name: _view(block, dtype, shape, offset)}


def _watched(rebuild: Any, args: tuple[Any, ...], pooled: list[Any]) -> dict[str, Any]:
    """The batch `rebuild(*args)` makes, its pooled blocks watched until nothing holds them (`_shared_blocks`)."""
    batch = rebuild(*args)
    shared_blocks.receive(batch, pooled)
    return batch


def _unpack_bytes(data: bytearray, layout: Layout, others: dict[str, Any], order: list[str]) -> dict[str, Any]:
    import torch

    storage = torch.frombuffer(data, dtype=torch.uint8).untyped_storage()
    tensors = {name: _on_storage(torch, storage, dtype, shape, offset) for name, dtype, shape, offset in layout}
    return {name: tensors[name] if name in tensors else others[name] for name in order}


def _on_storage(torch: Any, storage: Any, dtype: Any, shape: tuple[int, ...], offset: int) -> Any:
    """The tensor of `dtype` and `shape` at byte `offset` of `storage` (a multiple of the dtype's size): `_view`'s
    tensor, made by one `set_` instead of torch's slicing and two views (about half the time)."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return torch.empty(0, dtype=dtype).set_(storage, offset // dtype.itemsize, shape, tuple(reversed(strides)))


def _unpack(block: Any, layout: Layout, others: dict[str, Any], order: list[str]) -> dict[str, Any]:
    tensors = {name: _view(block, dtype, shape, offset) for name, dtype, shape, offset in layout}
    return {name: tensors[name] if name in tensors else others[name] for name in order}


def _view(block: Any, dtype: Any, shape: tuple[int, ...], offset: int) -> Any:
    return block[offset : offset + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)
