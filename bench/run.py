"""Run every benchmark figure with its peers and print one Markdown table.

    python -m bench.run [--quick] [--workdir DIR] [--only P1,P2] [--contents photo,aloha] [--output FILE] [--clean]
    python -m bench.run --compare REF [--only P1,P2,P3,P9,P12] [--rounds 3] [--quick]   (the regression guard)

Steps: generate (or reuse) the datasets in the work dir; convert them once for the peers (an Arrow IPC file for
the mmap and Flight peers, the HF `datasets` cache); run the cold-cache figures (P6, P8, P11, P4, and P17 from a
local Hub), each with its own empty caches; start the warm episerve server (2 workers), the Flight peer and the
loopback ceiling; run the warm figures (P5, P1, P2, P3, P7); run the camera figures (P9, and P10 and P15 on the
same datasets), the mixture figures (P12, P13), the sharing figure (P14) and the frame tiers (P16), which generate
their own datasets and start their own servers; print the table and write it to `bench/results/<date>-<mode>.md`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

from bench.config import MODES
from bench.context import Context
from bench.datasets import ensure_dataset
from bench.peers import hf
from bench.processes import APP_PATH_VARIABLE, app_dir
from bench.report import Row, markdown

RESULTS = Path(__file__).resolve().parent / "results"
Figure = Callable[[Context], list[Row]]


def _figures() -> tuple[dict[str, Figure], dict[str, Figure], dict[str, Figure]]:
    """(cold figures, warm figures, figures on datasets of their own), in the order they run."""
    from bench.figures import (
        p1_stream,
        p2_take,
        p3_loader,
        p4_disk,
        p5_memory,
        p6_build,
        p7_windows,
        p8_cold,
        p9_camera,
        p10_lerobot,
        p11_object_store,
        p12_mixture,
        p13_resume,
        p14_sharing,
        p15_lerobot_train,
        p16_frame_tiers,
        p17_hub_cold,
    )

    cold = {
        "P6": p6_build.run,
        "P8": p8_cold.run,
        "P11": p11_object_store.run,
        "P4": p4_disk.run,
        "P17": p17_hub_cold.run,
    }
    warm = {"P5": p5_memory.run, "P1": p1_stream.run, "P2": p2_take.run, "P3": p3_loader.run, "P7": p7_windows.run}
    own = {
        "P9": p9_camera.run,
        "P10": p10_lerobot.run,
        "P12": p12_mixture.run,
        "P13": p13_resume.run,
        "P14": p14_sharing.run,
        "P15": p15_lerobot_train.run,
        "P16": p16_frame_tiers.run,
    }
    return cold, warm, own


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="scaled-down datasets and repeats (a few minutes)")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "episerve-bench",
        help="where datasets, caches and logs go, in a subdirectory per mode (default: <tmp>/episerve-bench)",
    )
    parser.add_argument("--only", help="comma-separated figures to run, e.g. P1,P3 (default: all)")
    parser.add_argument("--output", type=Path, help="results file (default: bench/results/<date>-<mode>.md)")
    parser.add_argument("--clean", action="store_true", help="delete the whole work dir at the end")
    parser.add_argument(
        "--app-path",
        type=Path,
        help="directory holding the `app` package the server runs (default: this repository); for A/B runs of a "
        "changed server against the same client and peers",
    )
    parser.add_argument(
        "--compare",
        metavar="REF",
        help="the regression guard: run the figures (default P1,P2,P3,P9,P12) at commit REF and at the working tree, "
        "interleaved, print both with their ratio and exit 1 where a figure lost more than its spread "
        "(see bench/compare.py)",
    )
    parser.add_argument(
        "--contents",
        help="the camera figures (P9, P10, P16) only on datasets of these comma-separated contents: synthetic, "
        "photo, aloha (default: every one the figure measures)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="--compare: interleaved runs a side (default 3)")
    parser.add_argument("--rows-json", type=Path, help=argparse.SUPPRESS)  # the rows as JSON, for --compare
    return parser.parse_args(argv)


def _ipc_path(workdir: Path, size: object) -> Path:
    digest = hashlib.sha256(json.dumps(asdict(size), sort_keys=True).encode()).hexdigest()[:12]  # type: ignore[call-overload]
    return workdir / "ipc" / f"{size.name}-{digest}.arrow"  # type: ignore[attr-defined]


def prepare(scale_name: str, workdir: Path, tabular: bool = True) -> Context:
    """Datasets and peer copies, ready for the figures (without `tabular`, none: for figures that make their own)."""
    from bench.peers.ipc import convert

    scale = MODES[scale_name]
    workdir.mkdir(parents=True, exist_ok=True)
    hf.configure_offline(workdir / "hf-home")
    datasets, ipc = {}, {}
    for size in (scale.vector, scale.image) if tabular else ():
        started = time.perf_counter()
        datasets[size.name] = ensure_dataset(workdir / "data", size)
        ipc[size.name] = convert(datasets[size.name].files, _ipc_path(workdir, size))
        d = datasets[size.name]
        print(
            f"# {d.name}: {d.episodes} episodes, {d.rows:,} rows, {len(d.files)} files, "
            f"{d.parquet_bytes / 1e6:.0f} MB parquet ({time.perf_counter() - started:.0f} s)",
            file=sys.stderr,
        )
    hf_cache = workdir / "hf-cache"
    for dataset in datasets.values():
        hf.load(dataset, hf_cache)  # the full conversion the warm figures' HF peer reads (untimed)
    logs = workdir / "logs"
    logs.mkdir(exist_ok=True)
    return Context(scale, workdir, datasets, ipc, hf_cache, logs)


def _start_warm(ctx: Context) -> list:
    """The warm server (cache built untimed first), the Flight peer and the loopback ceiling."""
    from bench.processes import EpiserveServer, ModuleServer
    from bench.workers import run_job

    for name in ctx.datasets:
        run_job(
            "episerve-build",
            {"root": str(ctx.data_root), "cache_dir": str(ctx.cache_dir), "dataset": name},
            ctx.logs / "warm.log",
        )
    server = EpiserveServer(ctx.data_root, ctx.cache_dir, ctx.logs, workers=2).start()
    flight = ModuleServer("bench.peers.flight", [f"{n}={p}" for n, p in ctx.ipc.items()], ctx.logs).start()
    loopback = ModuleServer("bench.peers.loopback", [], ctx.logs).start()
    ctx.server, ctx.flight_port, ctx.loopback_port = server, flight.port, loopback.port
    return [server, flight, loopback]


def machine() -> str:
    """nproc, memory and CPU model, for the report."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import psutil

    memory = psutil.virtual_memory().total / 2**30
    return f"{os.cpu_count()} CPUs ({model}), {memory:.0f} GiB RAM, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    mode = "quick" if args.quick else "full"
    if args.compare:
        from bench.compare import compare

        return compare(args.compare, args.only, args.rounds, args.quick, args.workdir.resolve() / mode, args.output)
    only = {f.strip().upper() for f in args.only.split(",")} if args.only else None
    if args.app_path is not None:
        os.environ[APP_PATH_VARIABLE] = str(args.app_path.resolve())
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    cold, warm, own = _figures()
    ctx = prepare(mode, args.workdir.resolve() / mode, tabular=only is None or bool(only - set(own)))
    if args.contents:
        contents = [content.strip() for content in args.contents.split(",")]
        ctx.scale = replace(ctx.scale, p9=replace(ctx.scale.p9, datasets=ctx.scale.p9.of(*contents)))
    rows: list[Row] = []
    for figure, run in cold.items():
        if only is None or figure in only:
            print(f"# {figure} ...", file=sys.stderr)
            rows += run(ctx)
    if only is None or only & set(warm):
        processes = _start_warm(ctx)
        try:
            for figure, run in warm.items():
                if only is None or figure in only:
                    print(f"# {figure} ...", file=sys.stderr)
                    rows += run(ctx)
        finally:
            for process in reversed(processes):
                process.stop()
    for figure, run in own.items():
        if only is None or figure in only:
            print(f"# {figure} ...", file=sys.stderr)
            rows += run(ctx)
    rows.sort(key=lambda r: int(r.figure[1:]))
    ctx.notes.append(
        f"Load average (1 min) {load_before:.1f} before and {os.getloadavg()[0]:.1f} after the run: the machine is "
        "shared, so compare ratios within this table, not absolute numbers across runs."
    )
    text = report_text(ctx, rows, mode, time.perf_counter() - started)
    print(text)
    output = args.output or RESULTS / f"{dt.date.today().isoformat()}-{mode}.md"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text + "\n")
    print(f"# written to {output}", file=sys.stderr)
    if args.rows_json is not None:
        args.rows_json.write_text(json.dumps([asdict(row) for row in rows]))
    if args.clean:
        shutil.rmtree(ctx.workdir, ignore_errors=True)
    else:
        shutil.rmtree(ctx.workdir / "scratch", ignore_errors=True)
    return 0


def revision() -> str:
    """`git describe` of the code under test (`-dirty` when app/ or client/ have uncommitted changes)."""
    source = app_dir()
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=source, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "app", "client"], cwd=source, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown revision"
    return f"commit {commit}{' with uncommitted changes in app/ or client/' if dirty else ''}"


def _app_note() -> str:
    return "" if os.environ.get(APP_PATH_VARIABLE) is None else f" Server code: `app` from `{app_dir()}`."


def report_text(ctx: Context, rows: list[Row], mode: str, seconds: float) -> str:
    from bench.access import client_available

    reader = "the `episerve` client" if client_available() else "plain httpx (the `episerve` client was not installed)"
    sizes = ", ".join(
        f"`{d.name}` {d.episodes:,} episodes / {d.rows:,} rows / {d.parquet_bytes / 1e6:,.0f} MB parquet"
        for d in ctx.datasets.values()
    )
    datasets = f" Datasets: {sizes}." if sizes else ""
    lines = [
        f"## Results ({mode} mode, {dt.date.today().isoformat()})",
        "",
        f"Machine: {machine()}.{datasets} episerve read through {reader}; server with 2 workers. "
        f"Code: {revision()}. Ratio = episerve ÷ peer. Run time {seconds / 60:.1f} min.{_app_note()}",
        "",
        markdown(rows),
    ]
    if ctx.notes:
        lines += ["", *(f"- {note}" for note in ctx.notes)]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
