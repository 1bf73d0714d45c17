"""P11: cold start of a 10 % episode pick from an object store: time to the first shuffled batch of 256 samples,
with the datasets in an S3 bucket (moto's S3 server on loopback) and empty caches.

episerve: a server already running over `s3://<bucket>/data` on an empty cache directory; the clock covers
creating `EpisodeDataset(pick)` and fetching one random batch, which reads the footers of the data files, the
episode metadata and the row groups that batch touches from the store (ranged GETs). HF `datasets`:
`load_dataset("parquet", data_files="s3://...", storage_options=..., filters=<the pick>)` into an empty cache
(through s3fs) and the same batch, in a fresh process after imports. Same as P8, but nothing is on local disk.
"""

from __future__ import annotations

import os
from pathlib import Path

from bench.context import Context
from bench.figures.p8_cold import first_batch_seconds, hf_load_args
from bench.figures.picks import cold_pick
from bench.processes import ModuleServer
from bench.report import Row
from bench.workers import run_job

BUCKET = "episerve-bench"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def _upload(endpoint: str, root: Path, names: list[str]) -> None:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=CREDENTIALS["AWS_REGION"],
    )
    client.create_bucket(Bucket=BUCKET)
    for name in names:
        for path in sorted((root / name).rglob("*")):
            if path.is_file():
                client.upload_file(str(path), BUCKET, f"data/{path.relative_to(root).as_posix()}")


def run(ctx: Context) -> list[Row]:
    os.environ.update(CREDENTIALS)  # for the servers and jobs started from here
    store = ModuleServer("moto.server", ["--host", "127.0.0.1"], ctx.logs).start()
    endpoint = f"http://127.0.0.1:{store.port}"
    rows = []
    try:
        _upload(endpoint, ctx.data_root, list(ctx.datasets))
        for name in ("vector", "image"):
            dataset = ctx.datasets[name]
            ids, batch = cold_pick(dataset.lengths, ctx.scale.p8_fraction, ctx.scale.p3_batch, seed=110)
            ours = first_batch_seconds(
                ctx, f"s3://{BUCKET}/data", name, ids, batch, "p11-episerve", {"AWS_ENDPOINT_URL_S3": endpoint}
            )
            args = hf_load_args(ctx, name, ids, batch, "p11-hf")
            args["s3"] = {"endpoint": endpoint, "bucket": BUCKET, "prefix": "data"}
            theirs, _ = run_job("hf-load-s3", args, ctx.logs / "p11.log")
            ctx.drop_scratch("p11-hf")
            rows.append(
                Row(
                    "P11",
                    f"{name} from S3 (moto on loopback), {len(ids)} of {dataset.episodes} episodes",
                    "s to first batch",
                    ours,
                    "HF datasets load_dataset(s3://, pick) + batch",
                    theirs["seconds"],
                    "≤ 0.5x",
                    ours <= 0.5 * theirs["seconds"],
                )
            )
    finally:
        store.stop()
    return rows
