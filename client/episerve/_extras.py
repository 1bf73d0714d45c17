"""The client's optional extras and how to install them: the words of the ImportError raised without one."""

from __future__ import annotations

_PACKAGES = {"torch": "torch", "images": "pillow", "jpeg": "simplejpeg"}


def install_hint(*extras: str) -> str:
    """How to install the client's `extras`: its own extra from an episerve checkout (the client is not published
    on a package index), or the packages themselves (into an environment that has the client already)."""
    packages = " ".join(_PACKAGES[extra] for extra in extras)
    return f"pip install './client[{','.join(extras)}]' in an episerve checkout, or pip install {packages}"


def require_images() -> None:
    """Raise an ImportError naming the `images` extra unless Pillow (which decodes parquet images) is installed."""
    try:
        import PIL  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"datasets with image features need Pillow: {install_hint('torch', 'images')}") from exc
