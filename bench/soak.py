"""The soak a release runs: one real server shared by mixed trainers for a long time, with faults on the way.

    python -m bench.soak --minutes 30 [--workers 2] [--trainers 4]

One `episerve-server serve` (supervised workers) over a generic parquet dataset, a camera dataset and an `s3://`
root on a local moto server (see `bench.soak_data`). Client processes (`bench.soak_trainers`) read meanwhile:
trainers mixing slices, takes, `delta_timestamps` windows, camera frames and object-store takes through the real
client; a slow reader taking large answers at a trickle; stalling readers that stop reading mid-response for longer
than the send timeout. At 40 % of the run one mapped segment is truncated in place; at 60 % one object is
re-uploaded with another episode layout. Every answer is checked against oracles computed from the source files.

The report (Markdown) gives requests, rows and wrong rows by kind, 5xx answers, client errors and retries by
kind, stalled readers cut off, worker deaths (from the supervisor's log lines, against the workers seen to go) and
the server's RssAnon: its peak and the peak of every 10 s, a line per minute. The run fails (exit status 1) when
there is a wrong row, a 5xx answer, a client error, an unlogged worker death, a stalled reader not cut off, an
answer of the replaced object's old version begun later than the store's freshness window after the re-upload,
no answer of its new version, or when memory grows: the last third's peak more than 10 % (at least 32 MiB)
above the second third's (judged from one minute of windows on; the first third is the warm-up).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from app.demo import write_demo_dataset
from app.demo_cameras import DEFAULT_CAMERAS
from bench.processes import EpiserveServer, Managed, _clean_env, free_port, port_open
from bench.soak_data import (
    CAMS_DATASET,
    OBJECT_FILES,
    OBJECTS_DATASET,
    REPLACED_OBJECT,
    ROWS_DATASET,
    object_table,
    write_object_file,
    write_rows_dataset,
)
from bench.soak_trainers import Tally, run_client
from bench.soak_watch import MemoryCurve, WorkerWatch, logged_deaths, server_5xx

MiB = 1024 * 1024
BUCKET, PREFIX = "soak", "store"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
SEND_TIMEOUT_S = 4.0
LIST_TTL_S, RESCAN_S = 2.0, 1.0
FRESHNESS_S = LIST_TTL_S + RESCAN_S + 3.0  # a re-upload is served within this (margin for a loaded machine)
SERVER_SETTINGS = {
    "EPISERVE_SEND_TIMEOUT_S": str(SEND_TIMEOUT_S),
    "EPISERVE_REMOTE_LIST_TTL": str(LIST_TTL_S),
    "EPISERVE_RESCAN_INTERVAL_S": str(RESCAN_S),
    "EPISERVE_MAX_INFLIGHT_BYTES": str(256 * MiB),
    "EPISERVE_LOG_FORMAT": "json",
}
GROWTH_ALLOWED = 0.10
GROWTH_FLOOR = 32 * MiB


@dataclass
class Faults:
    """When the faults happened (seconds into the run) and what they hit."""

    truncated: str = ""
    truncated_at: float | None = None
    overwritten_at: float | None = None
    overwritten_wall: float = 0.0  # time.time() once the re-upload was complete


@dataclass
class Outcome:
    """Everything the report says."""

    minutes: float
    workers: int
    trainers: int
    tally: Tally
    faults: Faults
    memory: MemoryCurve
    deaths: list[tuple[int, str]]
    workers_gone: int
    log_5xx: int
    crashed: list[str] = field(default_factory=list)

    @property
    def stale_s(self) -> float:
        """How long after the re-upload the last answer of the old version began (negative: before it)."""
        if not self.faults.overwritten_wall or not self.tally.old_version_last_start:
            return float("-inf")
        return self.tally.old_version_last_start - self.faults.overwritten_wall

    def failures(self) -> list[str]:
        tally, found = self.tally, []
        if sum(tally.wrong.values()):
            found.append(f"{sum(tally.wrong.values())} wrong rows")
        if sum(tally.server_errors.values()) or self.log_5xx:
            found.append(f"5xx answers ({sum(tally.server_errors.values())} seen by clients, {self.log_5xx} logged)")
        if sum(tally.errors.values()) or self.crashed:
            found.append(f"{sum(tally.errors.values()) + len(self.crashed)} client errors")
        if self.workers_gone > len(self.deaths):
            found.append(f"{self.workers_gone - len(self.deaths)} unlogged worker deaths")
        if not tally.requests["stall"] or tally.cut_off < tally.requests["stall"]:
            found.append(f"stalled readers cut off: {tally.cut_off} of {tally.requests['stall']}")
        if self.stale_s > FRESHNESS_S:
            found.append(f"the replaced object's old version served {self.stale_s:.1f} s after the re-upload")
        if self.faults.overwritten_at is not None and not tally.new_version_answers:
            found.append("the re-uploaded object's new version never served")
        thirds = self.memory.thirds()
        if thirds is not None and thirds[1] > thirds[0] + max(GROWTH_ALLOWED * thirds[0], GROWTH_FLOOR):
            found.append(f"memory grew: last third's peak {thirds[1] / MiB:.0f} MiB, second {thirds[0] / MiB:.0f}")
        return found


def _write_datasets(data: Path, objects: Path) -> None:
    write_rows_dataset(data / ROWS_DATASET)
    write_demo_dataset(data / CAMS_DATASET, episodes=6, seed=3, files=1, cameras=DEFAULT_CAMERAS, image_size=8)
    (objects / OBJECTS_DATASET / "data").mkdir(parents=True)
    for name, episodes in OBJECT_FILES.items():
        write_object_file(objects / OBJECTS_DATASET / name, object_table(episodes, 0))


class _Moto(Managed):
    """moto's S3 server on a free loopback port, in a process of its own."""

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        super().__init__(command, log_dir / "moto.log", lambda: port_open(self.port), _clean_env(CREDENTIALS))

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def s3(self):  # a boto3 S3 client
        import boto3

        credentials = {k: CREDENTIALS[k.upper()] for k in ("aws_access_key_id", "aws_secret_access_key")}
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1", **credentials)


class _Server(EpiserveServer):
    """`episerve-server serve` over the local datasets and the `s3://` root."""

    def __init__(self, data: Path, cache: Path, log_dir: Path, workers: int, endpoint: str) -> None:
        settings = SERVER_SETTINGS | CREDENTIALS | {"AWS_ENDPOINT_URL_S3": endpoint}
        super().__init__(data, cache, log_dir, workers, settings)
        after_root = self.command.index("--root") + 2
        self.command[after_root:after_root] = ["--root", f"s3://{BUCKET}/{PREFIX}"]


def _warm(url: str) -> None:
    """Every segment of the rows dataset built and mapped (what the truncation hits), the other indexes loaded."""
    with httpx.Client(base_url=url, timeout=300) as http:
        for dataset in (ROWS_DATASET, CAMS_DATASET, OBJECTS_DATASET):
            answer = http.get(f"/datasets/{dataset}/rows", params={"columns": "episode_index"})
            answer.raise_for_status()


def _truncate_a_segment(cache: Path) -> str:
    """Truncate the largest segment of the rows dataset to a third, in place (the workers' maps outlive it)."""
    segments = sorted(cache.glob(f"datasets/{ROWS_DATASET}-*/segments/*.arrow"), key=lambda p: p.stat().st_size)
    target = segments[-1]
    os.truncate(target, target.stat().st_size // 3)
    return target.name


def run(minutes: float, workers: int, trainers: int, work: Path) -> Outcome:
    seconds = minutes * 60
    data, objects, logs = work / "data", work / "objects", work / "logs"
    _write_datasets(data, objects)
    faults = Faults()
    with _Moto(logs) as moto:
        s3 = moto.s3()
        s3.create_bucket(Bucket=BUCKET)
        for name in OBJECT_FILES:
            s3.upload_file(str(objects / OBJECTS_DATASET / name), BUCKET, f"{PREFIX}/{OBJECTS_DATASET}/{name}")
        server = _Server(data, work / "cache", logs, workers, moto.endpoint)
        with server:
            _warm(server.url)
            memory, watch = MemoryCurve(server.pid).start(), WorkerWatch(server.pid).start()
            roles = ["mixed"] * trainers + ["slow", "stall"]
            stall_s = SEND_TIMEOUT_S + 4
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(len(roles), mp_context=context) as pool:
                started = time.monotonic()
                futures = [
                    pool.submit(run_client, role, server.url, str(data), seconds, seed, stall_s)
                    for seed, role in enumerate(roles)
                ]
                _sleep_until(started + 0.4 * seconds)
                faults.truncated, faults.truncated_at = _truncate_a_segment(work / "cache"), time.monotonic() - started
                _sleep_until(started + 0.6 * seconds)
                replaced = objects / "replacement.parquet"
                episodes = OBJECT_FILES[REPLACED_OBJECT]
                write_object_file(replaced, object_table(list(reversed(episodes)), 1))
                s3.upload_file(str(replaced), BUCKET, f"{PREFIX}/{OBJECTS_DATASET}/{REPLACED_OBJECT}")
                faults.overwritten_at, faults.overwritten_wall = time.monotonic() - started, time.time()
                tally, crashed = Tally(), []
                for role, future in zip(roles, futures, strict=True):
                    try:
                        tally.merge(future.result())
                    except Exception as exc:  # a client process that died is a client error of its own
                        crashed.append(f"{role}: {type(exc).__name__}: {exc}")
            memory.stop()
            watch.stop()
            gone = watch.gone
        log = server.log_path.read_text(errors="replace")
    deaths = logged_deaths(log)
    return Outcome(minutes, workers, trainers, tally, faults, memory, deaths, gone, server_5xx(log), crashed)


def _sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


def report(outcome: Outcome) -> str:
    """The soak's report, Markdown."""
    tally, faults, memory = outcome.tally, outcome.faults, outcome.memory
    lines = [
        f"## Soak: {outcome.minutes:g} min, {outcome.workers} supervised worker(s), {outcome.trainers} trainers, "
        "1 slow reader, 3 stalling readers",
        "",
        "| kind | requests | rows | wrong rows |",
        "|---|---:|---:|---:|",
    ]
    for kind in sorted(tally.requests):
        lines.append(f"| {kind} | {tally.requests[kind]:,} | {tally.rows[kind]:,} | {tally.wrong[kind]:,} |")
    lines.append(
        f"| **all** | {sum(tally.requests.values()):,} | {sum(tally.rows.values()):,} | {sum(tally.wrong.values()):,} |"
    )
    seen_5xx = _counts(tally.server_errors)
    lines += ["", f"- 5xx answers: {seen_5xx} seen by clients, {outcome.log_5xx} in the server's log"]
    lines.append(f"- client errors by kind: {_counts(tally.errors)}" + "".join(f"; {c}" for c in outcome.crashed))
    lines.append(f"- client retries by reason: {_counts(tally.retries)}")
    lines.append(f"- stalling readers cut off by the send timeout: {tally.cut_off} of {tally.requests['stall']}")
    if faults.truncated_at is not None:
        lines.append(f"- truncation: segment `{faults.truncated}` cut to a third at {faults.truncated_at:.0f} s")
    if faults.overwritten_at is not None:
        stale = "none" if outcome.stale_s == float("-inf") else f"{outcome.stale_s:+.1f} s"
        lines.append(
            f"- overwrite: `{OBJECTS_DATASET}/{REPLACED_OBJECT}` re-uploaded at {faults.overwritten_at:.0f} s; "
            f"answers of the new version {tally.new_version_answers:,}; last answer of the old version begun "
            f"{stale} after the re-upload (allowed: {FRESHNESS_S:g} s)"
        )
    causes = ", ".join(sorted({cause for _, cause in outcome.deaths})) or "-"
    unlogged = max(0, outcome.workers_gone - len(outcome.deaths))
    lines.append(f"- worker deaths: {len(outcome.deaths)} logged ({causes}); {unlogged} unlogged")
    lines.append(
        f"- server RssAnon: peak {memory.peak / MiB:.0f} MiB (after the warm-up {memory.baseline / MiB:.0f} MiB); "
        "peak of each 10 s, a line per minute:"
    )
    per_minute = int(60 / 10)
    for start in range(0, len(memory.windows), per_minute):
        values = " ".join(f"{value / MiB:.0f}" for value in memory.windows[start : start + per_minute])
        lines.append(f"  - min {start // per_minute}: {values}")
    thirds = memory.thirds()
    if thirds is None:
        lines.append("- memory flatness: not judged (under a minute of windows)")
    else:
        lines.append(
            f"- memory flatness: last third's peak {thirds[1] / MiB:.0f} MiB against the second third's "
            f"{thirds[0] / MiB:.0f} MiB (allowed: +10 %, at least +32 MiB)"
        )
    failures = outcome.failures()
    lines += ["", "**PASS**" if not failures else "**FAIL**: " + "; ".join(failures)]
    return "\n".join(lines)


def _counts(counter: dict[str, int]) -> str:
    shown = [f"{name} x{count}" for name, count in sorted(counter.items()) if count]
    return ", ".join(shown) if shown else "0"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--workers", type=int, default=2, help="server worker processes")
    parser.add_argument("--trainers", type=int, default=4, help="trainer processes (besides the slow/stall ones)")
    parser.add_argument("--keep", type=Path, help="keep the data, cache and logs in this directory")
    args = parser.parse_args(argv)
    work = args.keep or Path(tempfile.mkdtemp(prefix="episerve-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        outcome = run(args.minutes, args.workers, args.trainers, work)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(report(outcome))
    return 1 if outcome.failures() else 0


if __name__ == "__main__":
    sys.exit(main())
