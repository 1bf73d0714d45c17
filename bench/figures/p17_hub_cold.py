"""P17: a cold 10 % episode pick of a Hugging Face Hub dataset, time to the first shuffled batch of 64 and bytes
downloaded: episerve serving the repo by id against LeRobot's own `LeRobotDataset` downloading it.

The Hub is the test suite's local one (`tests/hub_server.py`: the Hub's HTTP API for the calls `huggingface_hub`
makes, in a thread of the bench on loopback, so the figure measures protocol and work, not a network). It serves
each of the bench's LeRobot v3.0 datasets (`vector`; `image`, whose camera is a 64x64 PNG column LeRobot decodes) as
the repo `bench/<name>`, its `main` branch tagged `v3.0` as LeRobot tags a dataset's codebase version.

- episerve: a server (2 workers) with an empty cache and an empty `HF_HOME`, allowed to fetch `bench/*`
  (`EPISERVE_HUB_ALLOW`), started before the clock; in a fresh process, clock after imports,
  `RemoteLeRobotDataset(url, repo, episodes=pick)` and the first batch of a DataLoader (batch 64, shuffled,
  `RemoteLeRobotDataset.collate`): the server resolves and pins the revision and downloads the metadata and data
  files, answering 503 with the progress meanwhile, which the client waits out on the clock.
- LeRobot 0.4.4: `LeRobotDataset(repo, episodes=pick)` into an empty `HF_HOME`, in a fresh process, clock after
  imports, through the first batch of the same DataLoader (torch's default collate): its version check (the repo's
  refs), `meta/`, the data files holding the pick, their conversion by HF `datasets`.
- Bytes: the file bodies the Hub sent for each side (and how many files).

No target is set for this figure: the rows are for information.
"""

from __future__ import annotations

from typing import Any

from bench.context import Context
from bench.datasets import GeneratedDataset
from bench.figures.picks import cold_pick
from bench.hub_first_batch import BATCH
from bench.processes import EpiserveServer
from bench.report import Row
from bench.workers import run_job

# The local Hub lives with the tests that need it (the issue keeps it there); the bench imports it as it is.
from tests.hub_server import FakeHub, HubRepo

OWNER = "bench"
LEROBOT_TAG = "v3.0"  # the codebase version LeRobot 0.4.4 looks for among the repo's tags
SEED = 170


def run(ctx: Context) -> list[Row]:
    rows: list[Row] = []
    for name in ("vector", "image"):
        rows += _dataset_rows(ctx, ctx.datasets[name])
    ctx.notes.append(
        "P17: the local Hub on loopback (tests/hub_server.py) serving the bench datasets as `bench/<name>`; "
        f"episerve: `RemoteLeRobotDataset(url, repo, episodes=pick)` against a running server with an empty cache "
        f"and `HF_HOME`; LeRobot 0.4.4: `LeRobotDataset(repo, episodes=pick)` into an empty `HF_HOME`; each through "
        f"its first DataLoader batch of {BATCH}, shuffled, in a fresh process after imports. MB: file bodies the Hub "
        "sent. For information (no target)."
    )
    return rows


def _dataset_rows(ctx: Context, dataset: GeneratedDataset) -> list[Row]:
    """Both sides on one dataset, each against the same freshly published repo."""
    ids, _ = cold_pick(dataset.lengths, ctx.scale.p8_fraction, BATCH, seed=SEED)
    repo_id = f"{OWNER}/{dataset.name}"
    case = f"{dataset.name}, {len(ids)} of {dataset.episodes} episodes"
    with FakeHub() as hub:
        repo = hub.repos[repo_id] = HubRepo()
        repo.commit(dataset.path)
        repo.tag(LEROBOT_TAG)
        ours = _measured(hub, repo_id, lambda: _episerve(ctx, hub, repo_id, ids))
        theirs = _measured(hub, repo_id, lambda: _lerobot(ctx, hub, repo_id, ids))
    peer = "LeRobotDataset downloading the pick"
    files = f"episerve {ours['files']} files, LeRobot {theirs['files']}"
    return [
        Row("P17", case, "s to first batch", ours["seconds"], peer, theirs["seconds"], "info"),
        Row("P17", case, "MB from the Hub", ours["bytes"] / 1e6, peer, theirs["bytes"] / 1e6, "info", note=files),
    ]


def _measured(hub: FakeHub, repo_id: str, side: Any) -> dict[str, Any]:
    """`side()`'s result, with the bytes and files the Hub sent for `repo_id` meanwhile."""
    sent, fetched = hub.served.get(repo_id, 0), len(hub.fetched)
    result = side()
    files = sum(1 for repo, _ in hub.fetched[fetched:] if repo == repo_id)
    return result | {"bytes": hub.served.get(repo_id, 0) - sent, "files": files}


def _hub_args(ctx: Context, hub: FakeHub, scratch: str, repo_id: str, ids: list[int]) -> dict[str, Any]:
    hf_home = ctx.scratch(scratch)
    return {"endpoint": hub.url, "hf_home": str(hf_home), "repo_id": repo_id, "episodes": ids, "seed": SEED}


def _episerve(ctx: Context, hub: FakeHub, repo_id: str, ids: list[int]) -> dict[str, Any]:
    """The episerve side: a server on an empty cache and `HF_HOME`, and the client's job against it."""
    args = _hub_args(ctx, hub, "p17-episerve-hf", repo_id, ids)
    settings = {"EPISERVE_HUB_ALLOW": f"{OWNER}/*", "HF_ENDPOINT": hub.url, "HF_HOME": args["hf_home"]}
    settings |= {
        "HF_LEROBOT_HOME": f"{args['hf_home']}/lerobot",
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    root, cache = ctx.scratch("p17-root"), ctx.scratch("p17-cache")
    try:
        with EpiserveServer(root, cache, ctx.logs, workers=2, settings=settings) as server:  # type: ignore[arg-type]
            result, _ = run_job("episerve-hub-batch", args | {"url": server.url}, ctx.logs / "p17.log")
        return result
    finally:
        for scratch in ("p17-episerve-hf", "p17-root", "p17-cache"):
            ctx.drop_scratch(scratch)


def _lerobot(ctx: Context, hub: FakeHub, repo_id: str, ids: list[int]) -> dict[str, Any]:
    """The peer: LeRobot's own download of the pick into an empty `HF_HOME`, in its job."""
    args = _hub_args(ctx, hub, "p17-lerobot-hf", repo_id, ids)
    try:
        result, _ = run_job("lerobot-hub-batch", args, ctx.logs / "p17.log")
        return result
    finally:
        ctx.drop_scratch("p17-lerobot-hf")
