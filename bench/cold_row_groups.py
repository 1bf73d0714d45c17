"""The cold-read memory budget against large row groups: files of one row group each, read cold by many clients.

Writes `--files` parquet files of one `--row-group-mb` row group each (64 random floats and a 768-byte random blob a
row: barely compressible), starts one server with `EPISERVE_COLD_READ_MEMORY=--budget-mib`, and lets `--clients`
threads send takes of 256 random rows (every column, touching every file) for `--seconds`, while the segments build
in the background. Prints the server's RssAnon (its workers included) before and at its peak, against the budget.

    python -m bench.cold_row_groups --row-group-mb 256 --files 4 --clients 16 --seconds 30
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.processes import EpiserveServer
from bench.soak_watch import rss_anon_tree

MiB = 1024 * 1024
BLOB_BYTES = 768
ROW_BYTES = 64 * 4 + BLOB_BYTES + 16  # action, blob, episode_index and index


def write_files(root: Path, files: int, row_group_bytes: int) -> int:
    """`files` files of one row group of about `row_group_bytes` each; returns the rows per file."""
    rows = max(1, row_group_bytes // ROW_BYTES)
    (root / "cold").mkdir(parents=True)
    for number in range(files):
        rng = np.random.default_rng(number)
        ids = np.arange(number * rows, (number + 1) * rows)
        action = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(rows * 64, dtype=np.float32)), 64)
        offsets = pa.py_buffer((np.arange(rows + 1, dtype=np.int32) * BLOB_BYTES).tobytes())
        data = pa.py_buffer(rng.bytes(rows * BLOB_BYTES))
        blobs = pa.Array.from_buffers(pa.binary(), rows, [None, offsets, data])
        table = pa.table({"episode_index": ids // 500, "index": ids, "action": action, "blob": blobs})
        pq.write_table(table, root / "cold" / f"part-{number}.parquet", row_group_size=rows)
        del table, action, blobs, data
    return rows


def run(args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="episerve-cold-groups-") as tmp:
        work = Path(tmp)
        rows = write_files(work / "data", args.files, args.row_group_mb * MiB)
        settings = {"EPISERVE_COLD_READ_MEMORY": str(args.budget_mib * MiB)}
        server = EpiserveServer(work / "data", work / "cache", work / "logs", args.workers, settings)
        server.start(timeout_s=600)  # a loaded machine starts a server slowly
        try:
            time.sleep(1.0)
            baseline = peak = rss_anon_tree(server.pid)
            stop, counts, lock = threading.Event(), {"answers": 0, "wrong": 0, "failed": 0}, threading.Lock()

            def client(seed: int) -> None:
                rng = np.random.default_rng(seed)
                with httpx.Client(base_url=server.url, timeout=300) as http:
                    while not stop.is_set():
                        picks = rng.integers(0, args.files * rows, 256).tolist()
                        answer = http.post("/datasets/cold/rows/take", json={"indices": picks})
                        with lock:
                            if answer.status_code != 200:
                                counts["failed"] += 1
                                continue
                            got = pa.ipc.open_stream(answer.content).read_all().column("index").to_pylist()
                            counts["answers"] += 1
                            counts["wrong"] += sum(a != b for a, b in zip(got, picks, strict=True))

            threads = [threading.Thread(target=client, args=(seed,)) for seed in range(args.clients)]
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + args.seconds
            while time.monotonic() < deadline:
                peak = max(peak, rss_anon_tree(server.pid))
                time.sleep(0.01)
            stop.set()
            for thread in threads:
                thread.join()
        finally:
            server.stop()
    return {
        "row_group_mib": args.row_group_mb,
        "files": args.files,
        "budget_mib": args.budget_mib,
        "baseline_mib": round(baseline / MiB),
        "peak_mib": round(peak / MiB),
        "growth_mib": round((peak - baseline) / MiB),
        **counts,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cold_row_groups", description=__doc__.split("\n\n")[0])
    parser.add_argument("--row-group-mb", type=int, default=256)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--budget-mib", type=int, default=256)
    parser.add_argument("--workers", type=int, default=1)
    result = run(parser.parse_args(argv))
    print("| " + " | ".join(result) + " |")
    print("|" + "---:|" * len(result))
    print("| " + " | ".join(str(value) for value in result.values()) + " |")
    return 0 if result["wrong"] == 0 and result["failed"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
