"""`episerve-server`: serve datasets, warm, verify or clean their caches, or write a demo dataset.

Every `serve` flag has an `EPISERVE_*` environment equivalent; flags win. Flags reach the workers through the
environment, since each uvicorn worker builds its app from it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shlex
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from app import __version__
from app.settings import Settings

if TYPE_CHECKING:  # imported lazily below: app.metrics must load after PROMETHEUS_MULTIPROC_DIR is set
    from app.store.catalog import Catalog

APP = "app.main:app_from_environment"  # what each worker of `serve` runs (a factory of the app)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="episerve-server", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
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
    warm.add_argument(
        "--videos", action="store_true", help="also decode the episodes' camera videos into decoded-frame segments"
    )

    verify = commands.add_parser(
        "verify",
        help="check episode indexes against the sources and cached segments against their checksums",
        epilog="exit status (as fsck's): 0 nothing wrong; 1 damage found and all of it repaired; 2 damage left "
        "(segments without --rebuild, a dataset that could not be verified) or a usage error",
    )
    _add_location_flags(verify)
    verify.add_argument("dataset", nargs="?", help="dataset id (default: every dataset)")
    verify.add_argument("--rebuild", action="store_true", help="rebuild damaged segments instead of only reporting")

    cache = commands.add_parser("cache", help="remove cached data: `clear` (all of it) or `prune` (what is stale)")
    actions = cache.add_subparsers(dest="action", required=True)
    clear = actions.add_parser("clear", help="remove the cached segments and index of datasets (default: all)")
    _add_location_flags(clear)
    clear.add_argument("datasets", nargs="*", metavar="DATASET", help="dataset ids (default: every cached dataset)")
    prune = actions.add_parser(
        "prune", help="remove caches of datasets and source files that are gone or changed, and leftover temps"
    )
    _add_location_flags(prune)

    hub = commands.add_parser(
        "hub", help="the commits Hub datasets are pinned at: `pins` (show them) or `refresh` (resolve them again)"
    )
    hub_actions = hub.add_subparsers(dest="action", required=True)
    pins = hub_actions.add_parser("pins", help="show the commit each Hub dataset is pinned at")
    pins.add_argument("--cache-dir", type=Path, help="the servers' cache directory (EPISERVE_CACHE_DIR)")
    refresh = hub_actions.add_parser(
        "refresh",
        help="resolve Hub datasets' revisions again and pin the commits they name now; servers using this cache "
        "directory serve them from their next start",
    )
    refresh.add_argument("--cache-dir", type=Path, help="the servers' cache directory (EPISERVE_CACHE_DIR)")
    refresh.add_argument(
        "repos",
        nargs="*",
        metavar="OWNER/NAME[@REVISION]",
        help="repo ids (revision: the one given, else EPISERVE_HUB's, else the one pinned, else main; default: every "
        "pinned repo)",
    )

    demo = commands.add_parser("demo", help="write a LeRobot-format demo dataset")
    demo.add_argument("--out", type=Path, required=True, help="directory to create (must not exist or be empty)")
    demo.add_argument(
        "--format", default="v3.0", choices=["v3.0", "v2.1"], help="LeRobot codebase version (default v3.0)"
    )
    demo.add_argument("--episodes", type=int, default=200, help="number of episodes, 1-160 frames each (default 200)")
    demo.add_argument("--seed", type=int, default=0, help="random seed: the same seed writes the same data (default 0)")
    demo.add_argument("--no-video", action="store_true", help="write no camera videos (parquet only)")
    return parser


def _add_location_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--root", action="append", help="dataset root: a directory or s3://bucket/prefix (repeatable; EPISERVE_ROOTS)"
    )
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
        from app.supervisor import start_fork_server

        start_fork_server(APP)  # its environment is final: the workers inherit it from the fork server
    from app.roots import resolve_roots
    from app.store.catalog import Catalog, ConfigurationError

    try:
        settings = Settings()
        if args.command != "hub":  # the pins need no roots
            catalog = Catalog(settings, resolve_roots(settings))  # fail fast on a bad configuration
    except (ValidationError, ConfigurationError, OSError) as exc:
        print(f"episerve-server: invalid configuration: {exc}", file=sys.stderr)
        return 2
    if args.command == "hub":
        return _hub(settings, args)
    if args.command == "warm":
        return _warm(catalog, args)
    if args.command == "verify":
        return _verify(catalog, args)
    if args.command == "cache":
        return _cache(catalog, settings, args)
    return _serve(settings)


def _export_flags(args: argparse.Namespace) -> None:
    overrides = {
        "EPISERVE_ROOTS": os.pathsep.join(str(p) for p in args.root) if getattr(args, "root", None) else None,
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
    # Named by host and process: replicas in containers share the cache volume and are all PID 1, and a process of
    # another host (container) cannot be checked, so only this host's dead servers are cleaned up.
    host = socket.gethostname()
    for stale in parent.glob(f"{host}-*"):
        pid = stale.name.removeprefix(f"{host}-")
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    directory = parent / f"{host}-{os.getpid()}"
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
    from app.demo_cameras import DEFAULT_CAMERAS

    try:
        cameras = {} if args.no_video else DEFAULT_CAMERAS
        out = write_demo_dataset(args.out, format=args.format, episodes=args.episodes, seed=args.seed, cameras=cameras)
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
    from uvicorn.config import STARTUP_FAILURE

    from app.api.http_protocol import BoundedHttpToolsProtocol, HeadLimits
    from app.logs import configure_logging
    from app.supervisor import Supervisor

    configure_logging(settings.log_level, settings.log_format)  # the supervisor's own lines
    try:
        config = uvicorn.Config(
            APP,
            factory=True,
            host=settings.host,
            port=settings.port,
            workers=settings.workers,
            log_level=settings.log_level.lower(),
            log_config=None,
            access_log=False,
            http=functools.partial(
                BoundedHttpToolsProtocol,
                limits=HeadLimits(settings.max_header_bytes, settings.header_timeout_s, settings.send_timeout_s),
            ),
            loop="uvloop",
            timeout_graceful_shutdown=5,
            timeout_worker_healthcheck=settings.worker_healthcheck_timeout_s,
        )
        # Workers are child processes even when there is one: a worker killed (SIGBUS on a truncated mapped file,
        # the OOM killer) is logged with its cause and replaced, and the service goes on (`app.supervisor`).
        supervisor = Supervisor(config, sockets=[config.bind_socket()])
        supervisor.run()
    finally:
        shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)
    return STARTUP_FAILURE if supervisor.failed_to_start else 0


def _warm(catalog: Catalog, args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from app.errors import ProblemError
    from app.reads.episode_spec import parse_episode_spec
    from app.reads.frames import video_files_needed
    from app.reads.service import files_needed
    from app.store.warming import fetch_files, warm, warm_videos

    from_hub = args.dataset not in catalog.ids() and catalog.hub.offers(args.dataset)
    if args.dataset not in catalog.ids() and not from_hub:
        print(f"episerve-server warm: {unknown_dataset(catalog, args.dataset)}", file=sys.stderr)
        return 2
    try:
        if from_hub:
            with _download_bar(f"downloading {args.dataset} (metadata)") as progress:
                catalog.hub.prepare(args.dataset, progress)
        dataset = catalog.get(args.dataset)
        ranges = parse_episode_spec(args.episodes, 10**9) if args.episodes else None
        needed = files_needed(dataset, ranges)
        if dataset.supply.fetches:
            with _download_bar(f"downloading {dataset.id} data files") as progress:
                files, nbytes = fetch_files(dataset, needed, progress)
            print(f"{dataset.id}: {len(needed)} data files needed, {files} downloaded ({nbytes / 1e6:.1f} MB)")
        videos = video_files_needed(dataset, ranges) if args.videos else []
        if videos and dataset.supply.fetches:
            with _download_bar(f"downloading {dataset.id} videos") as progress:
                files, nbytes = dataset.supply.fetch_now([path for path, _ in videos], progress)
            print(f"{dataset.id}: {len(videos)} video files needed, {files} downloaded ({nbytes / 1e6:.1f} MB)")
    except ProblemError as exc:
        print(f"episerve-server warm: {exc.detail}", file=sys.stderr)
        return 2
    rows_total = dataset.rows.unbuilt_rows(dataset.index(), needed)
    with tqdm(total=rows_total, unit="rows", unit_scale=True, desc=f"warming {dataset.id}") as bar:
        written = {"bytes": 0}

        def progress(rows: int, nbytes: int) -> None:
            written["bytes"] += nbytes
            elapsed = bar.format_dict["elapsed"] or 1e-9
            bar.set_postfix_str(f"{written['bytes'] / 1e6 / elapsed:.0f} MB/s", refresh=False)
            bar.update(rows)

        built = warm(dataset, needed, progress)
    print(f"{dataset.id}: {len(needed)} segments needed, {built} built, {len(needed) - built} already cached")
    if videos:
        frame_segments = dataset.cache_status()["frame_segments"]
        print(_projected_frames(dataset.id, frame_segments["projected"]))
        if frame_segments["hot"] is not None:
            print(_hot_frames(dataset.id, frame_segments["hot"]))
        with tqdm(total=len(videos), unit="videos", desc=f"decoding {dataset.id} cameras") as bar:
            built, too_large = warm_videos(dataset, videos, on_segment=lambda: bar.update(1))
        cached = len(videos) - built - too_large
        print(f"{dataset.id}: {len(videos)} video files needed, {built} decoded, {cached} already cached", end="")
        print(f", {too_large} larger than EPISERVE_VIDEO_CACHE_BYTES (decoded on demand)" if too_large else "")
    return 0


@contextlib.contextmanager
def _download_bar(description: str) -> Iterator[Callable[[int, int], None]]:
    """A progress bar of bytes downloaded, and the `progress(bytes done, bytes)` that moves it."""
    from tqdm import tqdm

    with tqdm(unit="B", unit_scale=True, desc=description) as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        yield progress


def _projected_frames(dataset_id: str, projected: dict[str, Any]) -> str:
    """One line on the disk all of a dataset's decoded frames take (`frame_tiers.projected_frame_disk`)."""
    about = "about " if projected["estimated"] else ""
    line = (
        f"{dataset_id}: all decoded frames take {about}{projected['bytes'] / 1e9:.2f} GB as "
        f"{', '.join(projected['tiers'])} (exact pixels: {projected['raw_bytes'] / 1e9:.2f} GB)"
    )
    return line + (f"; {projected['note']}" if "note" in projected else "")


def _hot_frames(dataset_id: str, hot: dict[str, Any]) -> str:
    """One line on the hot pixel segments over a JPEG tier (`Dataset.hot_status`), which reads build, not `warm`."""
    return (
        f"{dataset_id}: {hot['built']} hot pixel segments ({hot['bytes'] / 1e9:.2f} GB) of the hot budget "
        f"(EPISERVE_VIDEO_HOT_BYTES) of {hot['budget_bytes'] / 1e9:.2f} GB shared by every dataset; reads build them"
    )


def unknown_dataset(catalog: Catalog, dataset_id: str) -> str:
    """Why `dataset_id` was not found: the roots searched, why a directory of that name was skipped, or the
    closest ids offered."""
    roots = ", ".join(str(root) for root in catalog.roots)
    message = f"no dataset {dataset_id!r} below the roots searched ({roots})"
    reason = catalog.why_not_offered(dataset_id)
    if reason is not None:
        return f"{message}: the directory {dataset_id!r} is skipped: {reason}"
    close = catalog.close_ids(dataset_id)
    if close:
        return f"{message}; did you mean {', '.join(map(repr, close))}?"
    offered = catalog.ids()
    if not offered:
        return f"{message}; they offer none"
    more = f" and {len(offered) - 10} more" if len(offered) > 10 else ""
    return f"{message}; they offer {', '.join(map(repr, offered[:10]))}{more}"


def _verify(catalog: Catalog, args: argparse.Namespace) -> int:
    from app.errors import ProblemError
    from app.store.verify import verify

    if args.dataset and args.dataset not in catalog.ids():
        print(f"episerve-server verify: {unknown_dataset(catalog, args.dataset)}", file=sys.stderr)
        return 2
    ids = [args.dataset] if args.dataset else catalog.ids()
    damaged_left = damage_found = 0
    for dataset_id in ids:
        try:
            report = verify(catalog.get(dataset_id), rebuild=args.rebuild)
        except ProblemError as exc:
            print(f"{dataset_id}: cannot verify: {exc.detail}", file=sys.stderr)
            damaged_left += 1
            continue
        damage_found += len(report.damaged) + (report.index_problem is not None)
        print(
            f"{dataset_id}: {report.checked} segments checked, {report.absent} not built, {len(report.damaged)} damaged"
        )
        if report.index_problem is not None:
            print(f"  index.json: {report.index_problem} -> rebuilt")
        for source, problem in report.damaged.items():
            action = "rebuilt" if source in report.rebuilt else "NOT rebuilt (use --rebuild)"
            print(f"  {source}: {problem} -> {action}")
        damaged_left += len(report.damaged) - len(report.rebuilt)
    return VERIFY_DAMAGE_LEFT if damaged_left else VERIFY_DAMAGE_REPAIRED if damage_found else 0


# `verify`'s exit status, as fsck's: 0 nothing wrong; 1 damage found and all of it repaired (a damaged index.json
# is always rebuilt; damaged segments with --rebuild); 2 damage left (segments without --rebuild, a dataset that
# could not be verified), as for a usage error (an unknown dataset id, a bad flag).
VERIFY_DAMAGE_REPAIRED = 1
VERIFY_DAMAGE_LEFT = 2


def _cache(catalog: Catalog, settings: Settings, args: argparse.Namespace) -> int:
    from app.errors import ProblemError
    from app.store.cleanup import clear, prune

    try:
        if args.action == "clear":
            if args.datasets:
                directories = [catalog.get(dataset_id).cache_dir for dataset_id in args.datasets]
            else:
                directories = sorted(p for p in (settings.cache_dir / "datasets").glob("*") if p.is_dir())
            cleanup = clear(directories)
        else:
            datasets = [catalog.get(dataset_id) for dataset_id in catalog.ids()]
            cleanup = prune(settings.cache_dir, datasets, kept=catalog.hub_cache_dirs())
    except ProblemError as exc:
        print(f"episerve-server cache {args.action}: {exc.detail}", file=sys.stderr)
        return 2
    for removed in cleanup.removed:
        print(f"removed {removed.path.relative_to(settings.cache_dir)} ({removed.nbytes} bytes)")
    for skipped in cleanup.skipped:
        print(f"skipped {skipped.relative_to(settings.cache_dir)}: being built")
    for dataset_id, problem in cleanup.unreadable.items():
        print(f"skipped {dataset_id}: cannot read the dataset ({problem})", file=sys.stderr)
    print(f"{len(cleanup.removed)} files removed, {cleanup.nbytes} bytes freed ({cleanup.nbytes / 2**20:.1f} MiB)")
    return 0


def _hub(settings: Settings, args: argparse.Namespace) -> int:
    from app.errors import ProblemError
    from app.sources.hub import HubDatasets, parse_hub_datasets

    hub = HubDatasets(parse_hub_datasets(settings.hub), settings.hub_allow, settings.cache_dir)
    if args.action == "pins":
        pins = hub.pins.all()
        for pin in pins:
            print(f"{pin.repo_id}@{pin.revision}: commit {pin.commit} (pinned {pin.pinned_at})")
        if not pins:
            print(f"no Hub dataset is pinned in {hub.pins.directory}")
        return 0
    entries = args.repos or [pin.repo_id for pin in hub.pins.all()]
    if not entries:
        print("episerve-server hub refresh: no Hub dataset is pinned yet; name one (OWNER/NAME[@REVISION])")
        return 0
    failed = 0
    for entry in entries:
        try:
            before, now = hub.refresh(entry)
        except (ProblemError, ValueError, OSError) as exc:  # OSError: the cache directory cannot be written
            print(f"episerve-server hub refresh: {getattr(exc, 'detail', exc)}", file=sys.stderr)
            failed += 1
            continue
        if before is None:
            change = "pinned"
        elif before.commit == now.commit and before.revision == now.revision:
            change = "unchanged"
        else:
            change = f"was {before.revision} at {before.commit}"
        print(f"{now.repo_id}@{now.revision}: commit {now.commit} ({change})")
    if not failed:
        print("servers using this cache directory serve the pinned commits from their next start")
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
