"""Build hook: a wheel carries the repository's scenarios, profiles and data.

They live at the top of the repository (where people edit them), so a plain
``build_py`` would leave them out of a wheel and an installed ``basin`` would
know no scenario. This copies them into ``basin/_shipped/`` at build time;
``basin.paths`` reads them there, or from the checkout in an editable install
(which skips the copy and reads the files in place).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

#: Top-level folders shipped inside the package (``basin.paths`` names them too).
SHIPPED = ("scenarios", "profiles", "data", "sweeps")
ROOT = Path(__file__).resolve().parent


class BuildPyWithShippedFiles(build_py):
    """``build_py`` plus a copy of the shipped folders into the built package."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the checkout's folders
        target = Path(self.build_lib) / "basin" / "_shipped"
        for name in SHIPPED:
            source = ROOT / name
            if not source.is_dir():
                raise SystemExit(f"setup.py: {source} is missing; a wheel without it would know no {name}")
            if (target / name).exists():
                shutil.rmtree(target / name)
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def compiled_simulator() -> list:
    """The hot modules (``basin.accel.COMPILED_MODULES``) compiled with mypyc,
    when ``BASIN_COMPILE=1`` (``make accel``). The default build is pure
    Python, so a wheel installs where no compiler is; the compiled modules
    give identical results. The sources' digest is stored beside them, so
    that a later edit makes ``basin`` ignore the stale build."""
    if os.environ.get("BASIN_COMPILE", "") in ("", "0"):
        return []
    from mypyc.build import mypycify

    package_dir = ROOT / "src" / "basin"
    spec = importlib.util.spec_from_file_location("_basin_accel_build", package_dir / "accel.py")
    assert spec is not None and spec.loader is not None
    accel = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(accel)
    (package_dir / "compiled.sha256").write_text(accel.source_digest(package_dir) + "\n", encoding="utf-8")
    return mypycify([str(accel.source_path(name, package_dir)) for name in accel.COMPILED_MODULES], opt_level="3")


setup(cmdclass={"build_py": BuildPyWithShippedFiles}, ext_modules=compiled_simulator())
