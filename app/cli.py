"""`episerve-server`: serve datasets, or write a demo dataset.

Every `serve` flag has an `EPISERVE_*` environment equivalent; flags win. Flags are handed to the workers
through the environment, since uvicorn workers build their app from it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pydantic import ValidationError

from app.settings import Settings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="episerve-server", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve the datasets below the roots (the demo dataset if none)")
    serve.add_argument("--root", action="append", type=Path, help="dataset root (repeatable; EPISERVE_ROOTS)")
    serve.add_argument("--cache-dir", type=Path, help="segment cache directory (EPISERVE_CACHE_DIR)")
    serve.add_argument("--host", help="bind address (EPISERVE_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (EPISERVE_PORT, default 8000)")
    serve.add_argument("--workers", type=int, help="worker processes (EPISERVE_WORKERS, default 1)")
    serve.add_argument("--log-level", help="debug, info, warning... (EPISERVE_LOG_LEVEL)")

    demo = commands.add_parser("demo", help="write a LeRobot-format demo dataset")
    demo.add_argument("--out", type=Path, required=True, help="directory to create")
    demo.add_argument("--format", default="v3.0", choices=["v3.0", "v2.1"])
    demo.add_argument("--episodes", type=int, default=200)
    demo.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "demo":
        return _demo(args)
    return _serve(args)


def _demo(args: argparse.Namespace) -> int:
    from app.demo import write_demo_dataset

    try:
        out = write_demo_dataset(args.out, format=args.format, episodes=args.episodes, seed=args.seed)
    except ValueError as exc:
        print(f"episerve-server demo: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


def _serve(args: argparse.Namespace) -> int:
    overrides = {
        "EPISERVE_ROOTS": os.pathsep.join(str(p) for p in args.root) if args.root else None,
        "EPISERVE_CACHE_DIR": args.cache_dir,
        "EPISERVE_HOST": args.host,
        "EPISERVE_PORT": args.port,
        "EPISERVE_WORKERS": args.workers,
        "EPISERVE_LOG_LEVEL": args.log_level,
    }
    for name, value in overrides.items():
        if value is not None:
            os.environ[name] = str(value)
    try:
        settings = Settings()
        from app.catalog import Catalog, ConfigurationError
        from app.main import resolve_roots

        Catalog(settings, resolve_roots(settings))  # fail fast on a bad configuration, before forking workers
    except (ValidationError, ConfigurationError) as exc:
        print(f"episerve-server: invalid configuration: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    uvicorn.run(
        "app.main:app_from_environment",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level=settings.log_level.lower(),
        http="httptools",
        loop="uvloop",
        timeout_graceful_shutdown=5,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
