"""Let PyPI's torchvision import beside a CPU-only torch build (the test environment's LeRobot needs it).

PyPI's torchvision wheels link their compiled operators (``torchvision/_C.so``) against a CUDA build of torch. Beside
torch's CPU build that library cannot load; torchvision then runs without its compiled operators (``nms``,
``roi_align``, video decoding: none of which LeRobot's ACT or diffusion policies, image transforms or parquet-image
datasets use), except that ``torchvision/_meta_registrations.py`` registers fake kernels for ``torchvision::nms`` and
``torchvision::qnms`` unconditionally, which fails with "operator torchvision::nms does not exist".

This module, loaded at interpreter start by a ``.pth`` file that ``make venv`` writes, waits for the first import of
torchvision; if the compiled library cannot load, it declares those two operators' schemas (no kernels: calling them
still fails, as it would) so that torchvision imports. Where torchvision's library loads, it does nothing. It imports
nothing at start-up: interpreters that never import torchvision pay nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path
from typing import Any

_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_library: Any = None  # the torch.library.Library holding the declarations (it must stay alive)


def _declare_missing_operators(package_dir: Path) -> None:
    """Declare torchvision's two unconditionally faked operators if its compiled library cannot load."""
    global _library
    import torch

    extension = next(iter(package_dir.glob("_C*.so")), None)
    if extension is not None:
        try:
            torch.ops.load_library(str(extension))
            return
        except (OSError, ImportError, RuntimeError):
            pass
    if _library is None:
        _library = torch.library.Library("torchvision", "DEF")
        for schema in _SCHEMAS:
            _library.define(schema)


class _Finder(importlib.abc.MetaPathFinder):
    """Runs the declaration once, just before ``torchvision`` itself is imported."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name != "torchvision":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torchvision")
        if spec is not None and spec.submodule_search_locations:
            _declare_missing_operators(Path(next(iter(spec.submodule_search_locations))))
        return None  # the ordinary finders import torchvision


def install() -> None:
    """Arm the finder (called by the ``.pth`` line)."""
    if "torchvision" not in sys.modules and not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
