"""episerve client: episode-filtered Arrow rows over HTTP, and torch datasets on top of them.

`Client` speaks the HTTP API and returns `pyarrow.Table`s. `EpisodeDataset` (map-style, one request per batch)
and `EpisodeIterableDataset` (streamed chunks, sharded and resumable) feed a torch `DataLoader`; `collate` is the
`collate_fn` that passes their batches through whole. A `Mixture` of weighted datasets is read as one by
`MixtureDataset` and `MixtureIterableDataset` (or wherever a dataset id is accepted). `decode_jpeg` decodes the
camera frames of a `Client(frames="jpeg")` batch, on the GPU where there is one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from episerve._client import Client, __version__
from episerve._collate import Batch, collate
from episerve._encoded_frames import decode_jpeg
from episerve._errors import (
    ConnectionFailed,
    EpiserveError,
    InvalidRequest,
    NotFound,
    ServerError,
    TooLarge,
    Unauthorized,
    Unavailable,
)
from episerve._mixture import Component, Mixture, MixtureError
from episerve._plan import MixturePlan
from episerve._retry import Retries
from episerve._selection import Pages, Selection
from episerve._tensor_batch import TensorBatch

if TYPE_CHECKING:
    from episerve._dataset import EpisodeDataset
    from episerve._iterable import EpisodeIterableDataset
    from episerve._mixture_dataset import MixtureDataset, MixtureSampler
    from episerve._mixture_iterable import MixtureIterableDataset

__all__ = [
    "Batch",
    "Client",
    "Component",
    "ConnectionFailed",
    "EpiserveError",
    "EpisodeDataset",
    "EpisodeIterableDataset",
    "InvalidRequest",
    "Mixture",
    "MixtureDataset",
    "MixtureError",
    "MixtureIterableDataset",
    "MixturePlan",
    "MixtureSampler",
    "NotFound",
    "Pages",
    "Retries",
    "Selection",
    "ServerError",
    "TensorBatch",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "__version__",
    "collate",
    "decode_jpeg",
]


def _public(value: Any) -> Any:
    """Name `value` as part of the `episerve` package (so errors print as `episerve.NotFound`)."""
    if isinstance(value, type):
        value.__module__ = "episerve"
    return value


for _name in __all__:
    if _name in globals():
        _public(globals()[_name])

_LAZY = {
    "EpisodeDataset": "episerve._dataset",
    "EpisodeIterableDataset": "episerve._iterable",
    "MixtureDataset": "episerve._mixture_dataset",
    "MixtureSampler": "episerve._mixture_dataset",
    "MixtureIterableDataset": "episerve._mixture_iterable",
}


def __getattr__(name: str) -> Any:
    # The datasets import torch (when installed), which takes seconds; `Client` users should not pay for it.
    if name in _LAZY:
        import importlib

        value = _public(getattr(importlib.import_module(_LAZY[name]), name))
        globals()[name] = value
        return value
    raise AttributeError(f"module 'episerve' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
