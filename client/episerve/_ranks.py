"""Where this process sits in a training job: its distributed rank and world size, and its DataLoader worker."""

from __future__ import annotations

from typing import Any

try:
    import torch.distributed as _distributed
    from torch.utils.data import get_worker_info as _get_worker_info
except ImportError:  # numpy-only installs
    _distributed = None  # type: ignore[assignment]
    _get_worker_info = None  # type: ignore[assignment]


def worker_info() -> Any:
    """torch's DataLoader worker info in a worker process, else None."""
    return None if _get_worker_info is None else _get_worker_info()


def rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """`(rank, world_size)` as given, or from `torch.distributed` when both are None and it is initialised, or
    `(0, 1)`."""
    distributed = _distributed is not None and _distributed.is_available() and _distributed.is_initialized()
    if rank is None and world_size is None and distributed:
        return _distributed.get_rank(), _distributed.get_world_size()
    rank = 0 if rank is None else rank
    world_size = 1 if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
    return rank, world_size
