"""`MixtureDataset`: map-style access to a mixture by position, and `MixtureSampler`, the ranks' share of it.

A mixture's epoch is a sequence of positions (`MixturePlan`); the dataset's index `i` is position `i % len(ds)` of
epoch `i // len(ds)`, so an index says everything about a sample and DataLoader workers need no epoch of their
own. `MixtureSampler` is the batch sampler that hands each rank its positions of each global step
(`GlobalSteps`) and saves where the run is as a global position.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from episerve._client import Client, connect
from episerve._collate import Batch
from episerve._columns import Allocate, Columns
from episerve._global_steps import GlobalSteps, check_state, resume_state
from episerve._mixture import Mixture
from episerve._mixture_reads import MixtureReader
from episerve._mixture_schema import ResolvedMixture, resolve
from episerve._mixture_stats import Stats, component_stats, merge_stats
from episerve._outputs import Formatter, Output, formatter
from episerve._plan import MixturePlan, quotas
from episerve._ranks import rank_and_world
from episerve._retry import Retries
from episerve._selection import DeltaTimestamps

try:
    from torch.utils.data import Dataset as _Base
    from torch.utils.data import Sampler as _SamplerBase
except ImportError:  # numpy-only installs
    _Base = object  # type: ignore[assignment,misc]
    _SamplerBase = object  # type: ignore[assignment,misc]


class MixtureSource:
    """What both mixture datasets share: the resolved mixture, its plan, and a reader of its positions."""

    def __init__(
        self,
        client: Client,
        mixture: Mixture,
        columns: Sequence[str] | None,
        delta_timestamps: DeltaTimestamps | None,
        tolerance_s: float | None,
        decode_images: bool,
        output: Output | Formatter | None,
        seed: int,
        epoch_size: int | None,
    ) -> None:
        self.client = client
        self.mixture = mixture
        self.resolved: ResolvedMixture = resolve(client, mixture, columns, delta_timestamps, tolerance_s)
        sizes = self.resolved.sizes
        self.plan = MixturePlan(quotas(mixture.weights), sizes, seed, sum(sizes) if epoch_size is None else epoch_size)
        self.plan.locate(0, [0] if self.plan.epoch_size else [])  # computes the period once, before any fork
        self.output = formatter(output)
        self.reader = MixtureReader(client, self.resolved, decode_images, self.output.empty)

    @property
    def version(self) -> str:
        return self.resolved.version

    def read(self, epochs: np.ndarray | int, positions: np.ndarray) -> dict[str, Any]:
        """The samples at `positions` of `epochs` (one epoch, or one per position), as a batch dict."""
        return self.output.format(self.read_columns(epochs, positions))

    def read_columns(self, epochs: np.ndarray | int, positions: np.ndarray, empty: Allocate | None = None) -> Columns:
        """The samples at `positions` of `epochs` as columns, not formatted yet; camera frames in arrays from
        `empty` (by default the output's)."""
        positions = np.asarray(positions, dtype=np.int64).reshape(-1)
        epochs = np.broadcast_to(np.asarray(epochs, dtype=np.int64), positions.shape)
        components = np.empty(len(positions), dtype=np.int64)
        rows = np.empty(len(positions), dtype=np.int64)
        for epoch in np.unique(epochs).tolist():
            mine = epochs == epoch
            components[mine], rows[mine] = self.plan.locate(epoch, positions[mine])
        return self.reader.read(components, rows, empty)

    def stats(self) -> Stats:
        return merge_stats(component_stats(self.client, self.mixture.components))


class MixtureDataset(_Base):  # type: ignore[misc]
    """The samples of a `Mixture` by position, as dicts of tensors (numpy arrays without torch).

    `len(ds)` is the positions per epoch (`epoch_size`, by default the components' rows together); index `i` is
    position `i % len(ds)` of epoch `i // len(ds)`. Which component and row fill a position is the mixture's plan
    (seeded by `seed`; see `episerve.MixturePlan`): weights hold in every prefix of an epoch within one sample,
    rows are drawn without replacement per pass of a component. `columns` and `delta_timestamps` use the mixture's
    names; windows are resolved per component at its own fps. Samples have the mixture's schema (padded vectors
    with `<name>_is_real`, missing cameras as zeros with `<name>_is_missing`) and `dataset_index`.

    Use `ds.sampler(batch_size)` as the DataLoader's `batch_sampler` (with `collate_fn=episerve.collate`): each
    batch is one request (a take per component, together in one `POST /takes`). `stats()` are the components'
    statistics merged as LeRobot merges them.
    """

    def __init__(
        self,
        url: str | Client,
        mixture: Mixture,
        columns: Sequence[str] | None = None,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        delta_timestamps: DeltaTimestamps | None = None,
        *,
        tolerance_s: float | None = None,
        decode_images: bool = False,
        output: Output | Formatter | None = None,
        token: str | None = None,
        retries: Retries | int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        seed: int = 0,
        epoch_size: int | None = None,
    ) -> None:
        self.client = connect(url, token, retries, cache_dir)
        self.source = MixtureSource(
            self.client, mixture, columns, delta_timestamps, tolerance_s, decode_images, output, seed, epoch_size
        )
        self.transform = transform

    @property
    def mixture(self) -> Mixture:
        return self.source.mixture

    @property
    def plan(self) -> MixturePlan:
        return self.source.plan

    @property
    def version(self) -> str:
        """The resolved mixture's version (document and every component's data)."""
        return self.source.version

    @property
    def features(self) -> list[str]:
        """The keys of every sample."""
        return self.source.resolved.names

    def __len__(self) -> int:
        return self.plan.epoch_size

    def __repr__(self) -> str:
        return f"MixtureDataset({self.client.url!r}, {self.mixture!r}, positions={len(self)})"

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([operator.index(index)])[0]

    def __getitems__(self, indices: Sequence[int]) -> Batch | list[Any]:
        """The samples at `indices` (epoch * len + position), read in one request (a take per component)."""
        wanted = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(wanted) and wanted.min() < 0:
            raise IndexError("mixture indices are non-negative: epoch * len(dataset) + position")
        epochs, positions = np.divmod(wanted, max(1, len(self)))
        batch = Batch(self.source.read(epochs, positions), len(wanted))
        if self.transform is None:
            return batch
        return [self.transform(sample) for sample in batch]

    def sampler(
        self, batch_size: int, rank: int | None = None, world_size: int | None = None, *, drop_last: bool = False
    ) -> MixtureSampler:
        """The batch sampler of this rank (by default from `torch.distributed` when it is initialised)."""
        return MixtureSampler(self, batch_size, rank, world_size, drop_last=drop_last)

    def stats(self) -> Stats:
        """The mixture's feature statistics (see `episerve._mixture_stats`)."""
        return self.source.stats()


class MixtureSampler(_SamplerBase):  # type: ignore[misc]
    """A DataLoader `batch_sampler` over a `MixtureDataset`: this rank's positions of each global step.

    Global step `s` covers positions `[s G, (s + 1) G)` of the epoch, `G = batch_size * world_size`, split into
    consecutive per-rank parts. `set_epoch(e)` before each epoch. `state_dict(batches)` is the global position
    after `batches` batches of this loader (every rank has taken as many steps); `load_state_dict` continues from
    it on any world size, worker count or per-rank batch.
    """

    def __init__(
        self,
        dataset: MixtureDataset,
        batch_size: int,
        rank: int | None = None,
        world_size: int | None = None,
        *,
        drop_last: bool = False,
    ) -> None:
        self.epoch_size = len(dataset)
        self.version = dataset.version
        self.seed = dataset.plan.seed
        self.batch_size = batch_size
        self.rank, self.world_size = rank_and_world(rank, world_size)
        self.drop_last = drop_last
        self.epoch = 0
        self.start = 0
        self._steps()  # validates

    def _steps(self) -> GlobalSteps:
        return GlobalSteps(self.epoch_size, self.start, self.batch_size, self.world_size, self.drop_last)

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.start = 0
        self.epoch = epoch

    def __len__(self) -> int:
        return self._steps().num_steps

    def __iter__(self) -> Iterator[list[int]]:
        steps = self._steps()
        base = self.epoch * self.epoch_size
        for step in range(steps.num_steps):
            low, high = steps.span(step, self.rank)
            if low < high:  # a last step shorter than the ranks may leave this rank out
                yield list(range(base + low, base + high))

    def state_dict(self, batches: int) -> dict[str, Any]:
        """Where the run is after this loader delivered `batches` batches since this epoch's iteration began."""
        return resume_state(self.version, self.seed, self.epoch, self._steps().position_after(batches))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.start = check_state(state, self.version, self.seed, self.epoch_size)


def mixture_dataset(url: Any, mixture: Mixture, args: tuple[Any, ...], kwargs: dict[str, Any]) -> MixtureDataset:
    """`EpisodeDataset(url, mixture, ...)`: the same arguments, for a mixture (episodes belong to its components)."""
    episodes, *rest = args or (None,)
    if episodes is not None or kwargs.pop("episodes", None) is not None:
        raise ValueError("a mixture picks episodes per component: Mixture([{'dataset': ..., 'episodes': ...}])")
    if kwargs.pop("image_size", None) is not None:
        raise ValueError("a mixture states the size of its cameras itself: Mixture([...], image_size=(h, w))")
    return MixtureDataset(url, mixture, *rest, **kwargs)
