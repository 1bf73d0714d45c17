"""Install `torchvision_cpu_shim` into the running interpreter's site-packages, loaded at start by a `.pth` file.

Run by `make venv` with the virtual environment's python; idempotent.
"""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

MODULE = "_episerve_torchvision_cpu_shim"


def main() -> None:
    site_packages = Path(sysconfig.get_paths()["purelib"])
    shutil.copyfile(Path(__file__).with_name("torchvision_cpu_shim.py"), site_packages / f"{MODULE}.py")
    (site_packages / f"{MODULE}.pth").write_text(f"import {MODULE}; {MODULE}.install()\n")


if __name__ == "__main__":
    main()
