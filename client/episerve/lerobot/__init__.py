"""`RemoteLeRobotDataset`: the samples of LeRobot's `LeRobotDataset`, fetched from an episerve server.

`ds[i]` is the dict `LeRobotDataset.__getitem__` returns, key for key: camera keys (video frames and parquet
images) as float32 `(C, H, W)` in [0, 1] (`(T, C, H, W)` windowed), every other stored column as a tensor with
LeRobot's dtypes (floats float32, integers int64, bool), 0-d for scalar features, `delta_timestamps` windows
stacked with a bool `<key>_is_pad`, `image_transforms` applied to each camera key, and `task` as the frame's task
string; keys in LeRobot's order (video keys, stored columns, padding masks, `task`). The server computes the
windows and decodes the video frames; the client decodes parquet PNGs.

A DataLoader batch is one request (`__getitems__`), converted to LeRobot's dtypes once per batch; with
`collate_fn=episerve.lerobot.collate` the batch arrives whole and crosses from the worker as one block. torch's
default collate gives the same batch by stacking the samples again.

`meta` is LeRobot's metadata in LeRobot's shapes (`episerve.lerobot._metadata`).

Given several datasets where LeRobot takes a `repo_id` (an `episerve.Mixture`, a list of dataset ids weighted by
their rows, `"mixture:NAME"` for the server's named mixture or `"mixture:FILE.yaml"`), `RemoteLeRobotDataset`
makes a `RemoteLeRobotMixture`: LeRobot's samples of the mixture with `dataset_index`, indexed by position of the
mixture's plan, and `meta` for the mixture (`RemoteLeRobotMixtureMetadata`).

`use_server(url)` makes LeRobot's own `LeRobotDataset`, `LeRobotDatasetMetadata` and `MultiLeRobotDataset` these,
for LeRobot's unchanged training script (`episerve.lerobot._switch`; `python -m episerve.lerobot.train`).
"""

from episerve.lerobot._metadata import EpisodeTable, RemoteLeRobotDatasetMetadata
from episerve.lerobot._mixture_metadata import RemoteLeRobotMixtureMetadata
from episerve.lerobot._remote_dataset import RemoteLeRobotDataset, collate
from episerve.lerobot._remote_mixture import RemoteLeRobotMixture
from episerve.lerobot._switch import use_server

__all__ = [
    "EpisodeTable",
    "RemoteLeRobotDataset",
    "RemoteLeRobotDatasetMetadata",
    "RemoteLeRobotMixture",
    "RemoteLeRobotMixtureMetadata",
    "collate",
    "use_server",
]
