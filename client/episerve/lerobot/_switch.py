"""The switch: LeRobot's own `LeRobotDataset`, `LeRobotDatasetMetadata` and `MultiLeRobotDataset` served by an
episerve server, for LeRobot's unchanged training script.

Several datasets are a mixture (`RemoteLeRobotMixture`): `MultiLeRobotDataset(repo_ids)`, and LeRobot's
`make_dataset` for `--dataset.repo_id='[a,b]'` (weights proportional to the datasets' rows),
`--dataset.repo_id=mixture:NAME` (the server's named mixture) or `--dataset.repo_id=mixture:FILE.yaml` (a
mixture document), which LeRobot 0.4.4 itself refuses or cannot read: the dataset is made as LeRobot makes one
(windows from the policy's delta indices and the metadata's fps, image transforms, ImageNet statistics).

`LeRobotDatasetMetadata` of such a `repo_id` is the mixture's metadata, and a `TrainPipelineConfig` whose
`dataset.repo_id` is a Python list passes LeRobot's validation as the `[a,b]` text (`lerobot_train.train(cfg)`).

`use_server(url)` replaces those three classes, and `make_dataset`, wherever an imported module holds them
(`lerobot.datasets.lerobot_dataset`, `lerobot.datasets.factory`, `lerobot.scripts.lerobot_train`, and a user's
module that imported `LeRobotDataset` by name before the switch), and `TrainPipelineConfig.validate`; modules
imported later take the replacements from LeRobot's modules. The server's URL
is also put in the environment (`EPISERVE_LEROBOT_URL`, and `EPISERVE_LEROBOT_TOKEN`), and this module applies
the switch when it is imported in a process that has it: DataLoader workers that are forked inherit the switch,
and spawned ones get it back when they unpickle the dataset (whose class lives here).

Written for LeRobot 0.4.4; everything that depends on LeRobot's module layout is in this module, so that a reader
for another release (LeRobot's main picks a storage reader by `storage_format` in info.json) can take its place.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from episerve._client import Client
from episerve.lerobot._metadata import RemoteLeRobotDatasetMetadata
from episerve.lerobot._mixture_metadata import RemoteLeRobotMixtureMetadata
from episerve.lerobot._mixture_repo import dataset_ids, is_mixture_repo, lerobot_mixture
from episerve.lerobot._remote_dataset import RemoteLeRobotDataset
from episerve.lerobot._remote_mixture import RemoteLeRobotMixture

__all__ = [
    "ServedLeRobotDataset",
    "ServedLeRobotDatasetMetadata",
    "ServedMultiLeRobotDataset",
    "served_url",
    "use_server",
]

URL_VARIABLE = "EPISERVE_LEROBOT_URL"
TOKEN_VARIABLE = "EPISERVE_LEROBOT_TOKEN"
EPISODES_OF_SEVERAL = (
    "episerve: --dataset.episodes picks episodes of one dataset; to pick episodes of several, write a mixture "
    "document with each component's `episodes` and pass --dataset.repo_id=mixture:FILE.yaml"
)
STREAMING_NOT_SERVED = (
    "episerve: --dataset.streaming=true (StreamingLeRobotDataset) is not served through the LeRobot switch; "
    "leave it false: the map-style dataset already streams from the server, one request per batch."
)

_server: dict[str, Any] = {"url": None, "token": None, "client": None, "pid": None}
_originals: dict[str, Any] = {}


def use_server(url: str, token: str | None = None) -> None:
    """From now on, in this process and its DataLoader workers, LeRobot's datasets are served by the episerve
    server at `url`: `LeRobotDataset(repo_id, ...)` is `ServedLeRobotDataset` over the server's dataset `repo_id`,
    `LeRobotDatasetMetadata` its metadata, and several datasets a mixture (see the module docstring). `token`
    (default: `$EPISERVE_TOKEN`) authenticates to the server. Needs LeRobot installed; may be called again to
    change the server."""
    _server.update(url=url, token=token, client=None, pid=None)
    os.environ[URL_VARIABLE] = url
    if token is not None:
        os.environ[TOKEN_VARIABLE] = token
    else:
        os.environ.pop(TOKEN_VARIABLE, None)
    _replace_in_lerobot()


def served_url() -> str | None:
    """The URL `use_server` set in this process, None before."""
    return _server["url"]


def _client() -> Client:
    """This process's client of the switched server (one per process; a fork makes its own)."""
    if _server["url"] is None:
        raise RuntimeError("episerve.lerobot.use_server(url) has not been called in this process")
    if _server["client"] is None or _server["pid"] != os.getpid():
        _server.update(client=Client(_server["url"], _server["token"]), pid=os.getpid())
    return _server["client"]


class ServedLeRobotDatasetMetadata(RemoteLeRobotDatasetMetadata):
    """`LeRobotDatasetMetadata` with LeRobot's signature, served by the switched server. A `repo_id` naming several
    datasets (`"mixture:NAME"`, `"[a,b]"`) makes the mixture's metadata, a `RemoteLeRobotMixtureMetadata`."""

    def __new__(
        cls,
        repo_id: str,
        root: str | os.PathLike[str] | None = None,
        revision: str | None = None,
        force_cache_sync: bool = False,
        metadata_buffer_size: int = 10,
    ) -> Any:
        if not is_mixture_repo(repo_id):
            return super().__new__(cls)
        client = _client()
        mixture, label, _ = lerobot_mixture(client, repo_id)
        return RemoteLeRobotMixtureMetadata(client, mixture, label, root=root, revision=revision)

    def __getnewargs__(self) -> tuple[str]:
        return (self.repo_id,)  # pickle (spawned DataLoader workers) passes it to `__new__`

    def __init__(
        self,
        repo_id: str,
        root: str | os.PathLike[str] | None = None,
        revision: str | None = None,
        force_cache_sync: bool = False,
        metadata_buffer_size: int = 10,
    ) -> None:
        super().__init__(
            _client(),
            repo_id,
            root=root,
            revision=revision,
            force_cache_sync=force_cache_sync,
            metadata_buffer_size=metadata_buffer_size,
        )


class ServedLeRobotDataset(RemoteLeRobotDataset):
    """`LeRobotDataset` with LeRobot 0.4.4's signature (positional order included), served by the switched server:
    `RemoteLeRobotDataset` over dataset `repo_id`. See `episerve.lerobot._arguments` for the arguments that change
    nothing on a server and those refused. A `repo_id` naming several datasets makes a `RemoteLeRobotMixture`."""

    @classmethod
    def _instead(cls, *args: Any, **kwargs: Any) -> Any:
        """A `RemoteLeRobotMixture` over the switched server for a `repo_id` naming several datasets."""
        arguments = inspect.signature(cls.__init__).bind_partial(None, *args, **kwargs).arguments
        arguments.pop("self")
        repo_id = arguments.pop("repo_id", None)
        return RemoteLeRobotMixture(_client(), repo_id, **arguments) if is_mixture_repo(repo_id) else None

    def __init__(
        self,
        repo_id: str,
        root: str | os.PathLike[str] | None = None,
        episodes: list[int] | None = None,
        image_transforms: Callable[[Any], Any] | None = None,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        tolerance_s: float = 1e-4,
        revision: str | None = None,
        force_cache_sync: bool = False,
        download_videos: bool = True,
        video_backend: str | None = None,
        batch_encoding_size: int = 1,
        vcodec: str = "libsvtav1",
        streaming_encoding: bool = False,
        encoder_queue_maxsize: int = 30,
        encoder_threads: int | None = None,
    ) -> None:
        super().__init__(
            _client(),
            repo_id,
            episodes,
            delta_timestamps,
            image_transforms,
            tolerance_s,
            root=root,
            revision=revision,
            force_cache_sync=force_cache_sync,
            download_videos=download_videos,
            video_backend=video_backend,
            batch_encoding_size=batch_encoding_size,
            vcodec=vcodec,
            streaming_encoding=streaming_encoding,
            encoder_queue_maxsize=encoder_queue_maxsize,
            encoder_threads=encoder_threads,
        )


class ServedMultiLeRobotDataset(RemoteLeRobotMixture):
    """`MultiLeRobotDataset` with LeRobot 0.4.4's signature, served by the switched server: the mixture of
    `repo_ids` weighted by their rows (`episodes`: `{repo_id: [episode ids]}`), so that an epoch holds every row
    once as LeRobot's concatenation did. Unlike LeRobot's, features only some datasets have are kept where they
    can be (vectors padded with `<name>_is_real`, cameras flagged `<camera>_is_missing`) and `delta_timestamps`
    are honoured; `tolerances_s` (`{repo_id: seconds}`) must give every dataset one tolerance."""

    def __init__(
        self,
        repo_ids: list[str],
        root: str | os.PathLike[str] | None = None,
        episodes: dict | None = None,
        image_transforms: Callable[[Any], Any] | None = None,
        delta_timestamps: dict[str, list[float]] | None = None,
        tolerances_s: dict | None = None,
        download_videos: bool = True,
        video_backend: str | None = None,
    ) -> None:
        tolerances = set((tolerances_s or {}).values()) or {1e-4}
        if len(tolerances) > 1:
            raise ValueError(f"a mixture is read with one tolerance for all its datasets, got {tolerances_s}")
        super().__init__(
            _client(),
            list(repo_ids),
            episodes,
            delta_timestamps,
            image_transforms,
            tolerances.pop(),
            root=root,
            download_videos=download_videos,
            video_backend=video_backend,
        )
        self.tolerances_s = dict(tolerances_s) if tolerances_s else dict.fromkeys(self.repo_ids, self.tolerance_s)


def _served_make_dataset(cfg: Any) -> Any:
    """LeRobot's `make_dataset` over the served classes; several datasets a mixture; streaming refused."""
    if getattr(cfg.dataset, "streaming", False):
        raise NotImplementedError(STREAMING_NOT_SERVED)
    if is_mixture_repo(cfg.dataset.repo_id):
        return _make_mixture(cfg)
    return _originals["make_dataset"](cfg)


def _make_mixture(cfg: Any) -> RemoteLeRobotMixture:
    """What LeRobot 0.4.4's `make_dataset` does for one dataset, for a mixture: the metadata first, windows from
    the policy's delta indices at its fps, the configured image transforms, ImageNet statistics for cameras."""
    import lerobot.datasets.factory as factory
    import torch
    from lerobot.datasets.transforms import ImageTransforms

    if cfg.dataset.episodes is not None:
        raise ValueError(EPISODES_OF_SEVERAL)
    client = _client()
    mixture, label, _ = lerobot_mixture(client, cfg.dataset.repo_id)
    meta = RemoteLeRobotMixtureMetadata(client, mixture, label, root=cfg.dataset.root, revision=cfg.dataset.revision)
    transforms = cfg.dataset.image_transforms
    dataset = RemoteLeRobotMixture(
        client,
        cfg.dataset.repo_id,
        delta_timestamps=factory.resolve_delta_timestamps(cfg.policy, meta),
        image_transforms=ImageTransforms(transforms) if transforms.enable else None,
        tolerance_s=cfg.tolerance_s,
        root=cfg.dataset.root,
        revision=cfg.dataset.revision,
        video_backend=cfg.dataset.video_backend,
    )
    if cfg.dataset.use_imagenet_stats and dataset.meta.stats is not None:
        for key in dataset.meta.camera_keys:
            for name, values in factory.IMAGENET_STATS.items():
                dataset.meta.stats.setdefault(key, {})[name] = torch.tensor(values, dtype=torch.float32)
    return dataset


def _served_validate(cfg: Any) -> None:
    """LeRobot's `TrainPipelineConfig.validate`, with a list of dataset ids (`DatasetConfig(repo_id=[a, b])`, which
    LeRobot 0.4.4 refuses as "not currently implemented") first turned into the text `[a,b]` the command line
    gives: `lerobot_train.train(cfg)` called from Python then trains on the mixture, as `--dataset.repo_id='[a,b]'`."""
    if isinstance(cfg.dataset.repo_id, list | tuple):
        cfg.dataset.repo_id = "[" + ",".join(dataset_ids(cfg.dataset.repo_id)) + "]"
    _originals["validate"](cfg)


_REPLACEMENTS: dict[str, Any] = {
    "LeRobotDataset": ServedLeRobotDataset,
    "LeRobotDatasetMetadata": ServedLeRobotDatasetMetadata,
    "MultiLeRobotDataset": ServedMultiLeRobotDataset,
    "make_dataset": _served_make_dataset,
}


def _replace_in_lerobot() -> None:
    """Put the replacements wherever an imported module holds LeRobot's originals."""
    try:
        import lerobot.datasets.factory as factory
        import lerobot.datasets.lerobot_dataset as lerobot_dataset
        from lerobot.configs.train import TrainPipelineConfig
    except ImportError as exc:
        raise ImportError("episerve.lerobot.use_server needs LeRobot: pip install lerobot") from exc
    if not _originals:
        for name in ("LeRobotDataset", "LeRobotDatasetMetadata", "MultiLeRobotDataset"):
            _originals[name] = getattr(lerobot_dataset, name)
        _originals["make_dataset"] = factory.make_dataset
        _originals["validate"] = TrainPipelineConfig.validate
    for module in _modules():
        for name, original in _originals.items():
            if name in _REPLACEMENTS and vars(module).get(name) is original:
                setattr(module, name, _REPLACEMENTS[name])
    TrainPipelineConfig.validate = _served_validate


def _modules() -> list[Any]:
    """The imported modules that may hold LeRobot's classes: all but episerve's own."""
    return [
        module
        for name, module in list(sys.modules.items())
        if name.partition(".")[0] != "episerve" and isinstance(getattr(module, "__dict__", None), dict)
    ]


def _restore_lerobot() -> None:
    """Undo `use_server` in this process (LeRobot's own classes back, the environment cleared): for tests."""
    for module in _modules():
        for name, replacement in _REPLACEMENTS.items():
            if vars(module).get(name) is replacement:
                setattr(module, name, _originals[name])
    if "validate" in _originals:
        from lerobot.configs.train import TrainPipelineConfig

        TrainPipelineConfig.validate = _originals["validate"]
    _server.update(url=None, token=None, client=None, pid=None)
    os.environ.pop(URL_VARIABLE, None)
    os.environ.pop(TOKEN_VARIABLE, None)


if os.environ.get(URL_VARIABLE) and _server["url"] is None:  # a worker or child of a switched process
    use_server(os.environ[URL_VARIABLE], os.environ.get(TOKEN_VARIABLE))
