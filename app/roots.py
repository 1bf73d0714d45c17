"""Where the server's datasets are: the configured roots, or the built-in demo dataset's root.

Kept apart from `app.main` so that the commands checking a configuration (and the `serve` command's supervisor,
which serves nothing) do not import the web framework.
"""

from __future__ import annotations

from app.settings import Settings
from app.sources import DatasetPath
from app.store.catalog import locate_roots

DEMO_DATASET_ID = "demo"


def resolve_roots(settings: Settings) -> list[DatasetPath]:
    """The configured roots (directories, or `s3://` locations), or the built-in demo dataset's root (generated on
    first use)."""
    if settings.roots:
        return locate_roots(settings, settings.roots)
    from app.demo import ensure_demo_dataset  # its video encoder is needed only where no root is configured

    demo_root = settings.cache_dir / "demo-root"
    ensure_demo_dataset(demo_root / DEMO_DATASET_ID)
    return [demo_root]
