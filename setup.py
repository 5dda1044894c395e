"""Build hook: a wheel carries the repository's scenarios, profiles and data.

They live at the top of the repository (where people edit them), so a plain
``build_py`` would leave them out of a wheel and an installed ``basin`` would
know no scenario. This copies them into ``basin/_shipped/`` at build time;
``basin.paths`` reads them there, or from the checkout in an editable install
(which skips the copy and reads the files in place).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

#: Top-level folders shipped inside the package (``basin.paths`` names them too).
SHIPPED = ("scenarios", "profiles", "data")
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


setup(cmdclass={"build_py": BuildPyWithShippedFiles})
