"""`episerve-server`: serve datasets, warm or verify their caches, or write a demo dataset.

Every `serve` flag has an `EPISERVE_*` environment equivalent; flags win. Flags reach the workers through the
environment, since each uvicorn worker builds its app from it.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from app.settings import Settings

if TYPE_CHECKING:  # imported lazily below: app.metrics must load after PROMETHEUS_MULTIPROC_DIR is set
    from app.catalog import Catalog


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="episerve-server", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve the datasets below the roots (the demo dataset if none)")
    _add_location_flags(serve)
    serve.add_argument("--host", help="bind address (EPISERVE_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (EPISERVE_PORT, default 8000)")
    serve.add_argument("--workers", type=int, help="worker processes (EPISERVE_WORKERS, default 1)")
    serve.add_argument("--log-level", help="debug, info, warning... (EPISERVE_LOG_LEVEL)")

    warm = commands.add_parser("warm", help="build the cache of a dataset (all or some episodes), with progress")
    _add_location_flags(warm)
    warm.add_argument("dataset", help="dataset id, e.g. lerobot/pusht")
    warm.add_argument("--episodes", help="episode spec, e.g. '0-99,120' (default: every episode)")

    verify = commands.add_parser(
        "verify", help="check episode indexes against the sources and cached segments against their checksums"
    )
    _add_location_flags(verify)
    verify.add_argument("dataset", nargs="?", help="dataset id (default: every dataset)")
    verify.add_argument("--rebuild", action="store_true", help="rebuild damaged segments instead of only reporting")

    demo = commands.add_parser("demo", help="write a LeRobot-format demo dataset")
    demo.add_argument("--out", type=Path, required=True, help="directory to create")
    demo.add_argument("--format", default="v3.0", choices=["v3.0", "v2.1"])
    demo.add_argument("--episodes", type=int, default=200)
    demo.add_argument("--seed", type=int, default=0)
    return parser


def _add_location_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", action="append", type=Path, help="dataset root (repeatable; EPISERVE_ROOTS)")
    parser.add_argument("--cache-dir", type=Path, help="segment cache directory (EPISERVE_CACHE_DIR)")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "demo":
        return _demo(args)
    _export_flags(args)
    if args.command == "serve":
        # Before anything imports app.metrics: every worker then writes its samples to files in this directory
        # and /metrics sums them (prometheus-client's multiprocess mode).
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(_metrics_directory())
    from app.catalog import Catalog, ConfigurationError
    from app.main import resolve_roots

    try:
        settings = Settings()
        catalog = Catalog(settings, resolve_roots(settings))  # fail fast on a bad configuration
    except (ValidationError, ConfigurationError, OSError) as exc:
        print(f"episerve-server: invalid configuration: {exc}", file=sys.stderr)
        return 2
    if args.command == "warm":
        return _warm(catalog, args)
    if args.command == "verify":
        return _verify(catalog, args)
    return _serve(settings)


def _export_flags(args: argparse.Namespace) -> None:
    overrides = {
        "EPISERVE_ROOTS": os.pathsep.join(str(p) for p in args.root) if args.root else None,
        "EPISERVE_CACHE_DIR": args.cache_dir,
        "EPISERVE_HOST": getattr(args, "host", None),
        "EPISERVE_PORT": getattr(args, "port", None),
        "EPISERVE_WORKERS": getattr(args, "workers", None),
        "EPISERVE_LOG_LEVEL": getattr(args, "log_level", None),
    }
    for name, value in overrides.items():
        if value is not None:
            os.environ[name] = str(value)


def _metrics_directory() -> Path:
    """A fresh per-server directory under the cache; those of servers that died without cleaning up are removed."""
    try:
        parent = Settings().cache_dir / "metrics"
        parent.mkdir(parents=True, exist_ok=True)
    except (ValidationError, OSError):
        return Path(tempfile.mkdtemp(prefix="episerve-metrics-"))
    for stale in parent.iterdir():
        if stale.name.isdigit() and not _alive(int(stale.name)):
            shutil.rmtree(stale, ignore_errors=True)
    directory = parent / str(os.getpid())
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    return directory


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _demo(args: argparse.Namespace) -> int:
    from app.demo import write_demo_dataset

    try:
        out = write_demo_dataset(args.out, format=args.format, episodes=args.episodes, seed=args.seed)
    except ValueError as exc:
        print(f"episerve-server demo: {exc}", file=sys.stderr)
        return 2
    print(out)
    print(f"serve it as dataset {out.name!r} with:\n  {serve_command(out)}")
    return 0


def serve_command(dataset_dir: Path) -> str:
    """The command that serves one dataset directory (the root may be the dataset itself)."""
    return f"episerve-server serve --root {shlex.quote(str(Path(dataset_dir).resolve()))}"


def _serve(settings: Settings) -> int:
    import uvicorn

    # uvicorn re-raises SIGTERM once it has shut down; exiting through SystemExit lets `finally` clean up.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        uvicorn.run(
            "app.main:app_from_environment",
            factory=True,
            host=settings.host,
            port=settings.port,
            workers=settings.workers,
            log_level=settings.log_level.lower(),
            log_config=None,
            access_log=False,
            http="httptools",
            loop="uvloop",
            timeout_graceful_shutdown=5,
        )
    finally:
        shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)
    return 0


def _warm(catalog: Catalog, args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from app.episode_spec import parse_episode_spec
    from app.errors import EpiserveError
    from app.warm import segments_needed, warm

    try:
        dataset = catalog.get(args.dataset)
        ranges = parse_episode_spec(args.episodes, 10**9) if args.episodes else None
        index = dataset.index()
        needed = segments_needed(dataset, ranges)
    except EpiserveError as exc:
        print(f"episerve-server warm: {exc.detail}", file=sys.stderr)
        return 2
    rows_total = sum(
        index.files[n].rows for n in needed if dataset.segments.built_size(index.files[n], index.schema) is None
    )
    with tqdm(total=rows_total, unit="rows", unit_scale=True, desc=f"warming {dataset.id}") as bar:
        written = {"bytes": 0}

        def progress(rows: int, nbytes: int) -> None:
            written["bytes"] += nbytes
            elapsed = bar.format_dict["elapsed"] or 1e-9
            bar.set_postfix_str(f"{written['bytes'] / 1e6 / elapsed:.0f} MB/s", refresh=False)
            bar.update(rows)

        built = warm(dataset, ranges, progress)
    print(f"{dataset.id}: {len(needed)} segments needed, {built} built, {len(needed) - built} already cached")
    return 0


def _verify(catalog: Catalog, args: argparse.Namespace) -> int:
    from app.errors import EpiserveError
    from app.warm import verify

    ids = [args.dataset] if args.dataset else catalog.ids()
    damaged_left = 0
    for dataset_id in ids:
        try:
            report = verify(catalog.get(dataset_id), rebuild=args.rebuild)
        except EpiserveError as exc:
            print(f"{dataset_id}: cannot verify: {exc.detail}", file=sys.stderr)
            damaged_left += 1
            continue
        print(
            f"{dataset_id}: {report.checked} segments checked, {report.absent} not built, {len(report.damaged)} damaged"
        )
        if report.index_problem is not None:
            print(f"  index.json: {report.index_problem} -> rebuilt")
        for source, problem in report.damaged.items():
            action = "rebuilt" if source in report.rebuilt else "NOT rebuilt (use --rebuild)"
            print(f"  {source}: {problem} -> {action}")
        damaged_left += len(report.damaged) - len(report.rebuilt)
    return 1 if damaged_left else 0


if __name__ == "__main__":
    sys.exit(main())
