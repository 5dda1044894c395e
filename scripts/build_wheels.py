"""Build the two wheels of basin-serve into one folder (``make wheel``).

* ``basin_serve-V-cpXY-cpXY-PLATFORM.whl``: the simulator's hot modules and
  the policy driver compiled with mypyc (``BASIN_COMPILE=1``), for this
  Python and platform; identical results, about 3.5x faster.
* ``basin_serve-V-py3-none-any.whl``: pure Python, for any platform.

Each is built from a fresh copy of the sources, so that nothing a previous
build left in ``build/`` (a compiled module in the pure wheel, say) gets in.
Offline: this environment's setuptools and mypy build them (no isolation).

    .venv/bin/python scripts/build_wheels.py [--out dist] [--pure-only]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: What a build reads (setup.py copies the last four into the wheel).
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE", "src", "scenarios", "profiles",
           "data", "sweeps")
IGNORED = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.so", "*.pyd", "compiled.sha256", ".accel-stamp")


def copy_sources(tree: Path) -> None:
    tree.mkdir(parents=True)
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tree / name, ignore=IGNORED)
        else:
            shutil.copy2(source, tree / name)


def build(tree: Path, out: Path, compiled: bool) -> Path:
    env = dict(os.environ, BASIN_COMPILE="1" if compiled else "0")
    before = set(out.glob("*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "-w", str(out), str(tree)], env=env, check=True)
    (wheel,) = set(out.glob("*.whl")) - before or {max(out.glob("*.whl"), key=lambda p: p.stat().st_mtime)}
    return wheel


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist")
    parser.add_argument("--pure-only", action="store_true", help="Build only the pure-Python wheel.")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("basin_serve-*.whl"):
        old.unlink()  # the previous version's wheels would be taken for these
    kinds = (False,) if args.pure_only else (False, True)
    for compiled in kinds:
        with tempfile.TemporaryDirectory() as tmp:
            tree = Path(tmp) / "tree"
            copy_sources(tree)
            wheel = build(tree, args.out, compiled)
        label = "compiled simulator" if compiled else "pure Python"
        print(f"{wheel} ({label}, {wheel.stat().st_size / 1e6:.1f} MB)", flush=True)


if __name__ == "__main__":
    main()
