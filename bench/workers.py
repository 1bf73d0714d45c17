"""One-shot jobs run in a fresh subprocess so their anonymous memory can be sampled on its own.

Protocol: the child imports what the job needs, prints `ready`, waits for a line on stdin, runs the job, and
prints one JSON line with its result (timings are taken inside the job, so interpreter start-up is excluded).
The parent samples the child's RssAnon between `ready` and the result: `baseline` is the idle process, `peak`
the highest value seen while the job ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.memory import RssSampler
from bench.processes import _clean_env, app_dir


def _episerve_build(args: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """Build every segment of one dataset with the server's own warm-up (what `episerve-server warm` runs), at
    the default settings."""
    from app.settings import Settings
    from app.store.catalog import Catalog
    from app.store.warming import warm

    settings = Settings(roots=[Path(args["root"])], cache_dir=Path(args["cache_dir"]))
    dataset = Catalog(settings, settings.roots).get(args["dataset"])

    def run() -> dict[str, Any]:
        start = time.perf_counter()
        built = warm(dataset)
        return {"seconds": time.perf_counter() - start, "segments": built}

    return run


def _hf_load(args: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """HF `datasets` conversion of the dataset (or an episode pick) into an empty cache, then one batch."""
    from bench.datasets import describe
    from bench.peers import hf

    hf.configure_offline(Path(args["hf_home"]))
    import datasets  # noqa: F401  (imported before `ready`, so the import is not timed)

    dataset = describe(Path(args["root"]), args["dataset"])

    def run() -> dict[str, Any]:
        start = time.perf_counter()
        loaded = hf.load(dataset, Path(args["cache_dir"]), args.get("episodes")).with_format("torch")
        converted = time.perf_counter() - start
        batch = args.get("first_batch")
        if batch:
            loaded[batch]
        return {"seconds": time.perf_counter() - start, "convert_seconds": converted, "rows": len(loaded)}

    return run


def _hf_load_s3(args: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """HF `datasets` loading the dataset's parquet files (an episode pick) from an S3 bucket through s3fs into an
    empty cache, then one batch: `load_dataset("parquet", data_files="s3://...", storage_options=...)`."""
    from bench.datasets import describe
    from bench.peers import hf

    hf.configure_offline(Path(args["hf_home"]))
    os.environ["HF_DATASETS_OFFLINE"] = "0"  # the files are in the bucket on loopback; the Hub stays offline
    import datasets
    import pyarrow.dataset as pads

    local = describe(Path(args["root"]), args["dataset"])
    s3 = args["s3"]
    root = Path(args["root"])
    files = [f"s3://{s3['bucket']}/{s3['prefix']}/{f.relative_to(root).as_posix()}" for f in local.files]
    options = {
        "key": os.environ["AWS_ACCESS_KEY_ID"],
        "secret": os.environ["AWS_SECRET_ACCESS_KEY"],
        "client_kwargs": {"endpoint_url": s3["endpoint"], "region_name": os.environ.get("AWS_REGION", "us-east-1")},
    }

    def run() -> dict[str, Any]:
        start = time.perf_counter()
        loaded = datasets.load_dataset(
            "parquet",
            data_files=files,
            split="train",
            storage_options=options,
            cache_dir=args["cache_dir"],
            features=hf._features(local),
            filters=pads.field("episode_index").isin(list(args["episodes"])),
        ).with_format("torch")
        converted = time.perf_counter() - start
        loaded[args["first_batch"]]
        return {"seconds": time.perf_counter() - start, "convert_seconds": converted, "rows": len(loaded)}

    return run


def _inram(args: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    from bench.peers.inram import serve_everything

    def run() -> dict[str, Any]:
        start = time.perf_counter()
        produced = serve_everything(args["files"], args["page_rows"])
        return {"seconds": time.perf_counter() - start, "bytes": produced}

    return run


def _hub_job(side: str) -> Callable[[dict[str, Any]], Callable[[], dict[str, Any]]]:
    """P17's cold Hub pick, read from episerve or downloaded by LeRobot (`bench/hub_first_batch.py`)."""

    def job(args: dict[str, Any]) -> Callable[[], dict[str, Any]]:
        from bench import hub_first_batch

        return hub_first_batch.episerve_job(args) if side == "episerve" else hub_first_batch.lerobot_job(args)

    return job


JOBS: dict[str, Callable[[dict[str, Any]], Callable[[], dict[str, Any]]]] = {
    "episerve-build": _episerve_build,
    "episerve-hub-batch": _hub_job("episerve"),
    "lerobot-hub-batch": _hub_job("lerobot"),
    "hf-load": _hf_load,
    "hf-load-s3": _hf_load_s3,
    "inram": _inram,
}


def run_job(job: str, args: dict[str, Any], log_path: Path) -> tuple[dict[str, Any], RssSampler]:
    """Run `job` in a subprocess; its JSON result and the RssAnon sampled while it ran."""
    command = [sys.executable, "-m", "bench.workers", job, json.dumps(args)]
    with open(log_path, "ab") as log:
        child = subprocess.Popen(
            command,
            cwd=app_dir(),
            env=_clean_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    assert child.stdin is not None and child.stdout is not None
    try:
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError(f"job {job} failed to start: see {log_path}")
        with RssSampler(child.pid, interval_s=0.01) as sampler:
            child.stdin.write("go\n")
            child.stdin.flush()
            line = child.stdout.readline()
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if not line:
        raise RuntimeError(f"job {job} failed: see {log_path}")
    return json.loads(line), sampler


def main() -> None:
    job, args = sys.argv[1], json.loads(sys.argv[2])
    run = JOBS[job](args)
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps(run()), flush=True)


if __name__ == "__main__":
    main()
