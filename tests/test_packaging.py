"""The wheel is the tool: built from the sources, installed into a fresh
virtual environment and run from an empty directory, it knows its
scenarios, runs one, and says what it is (version, licence).

Offline: the wheel is built with this environment's setuptools (no build
isolation), and the fresh environment borrows this one's dependencies
through a ``.pth`` line instead of downloading them; the ``basin`` it runs
is the wheel's alone (the test checks where it was imported from).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from scripts.build_wheels import copy_sources

ROOT = Path(__file__).resolve().parents[1]
SHORT = ["--set", "duration_min=20", "--set", "measure_end_min=15", "--set", "surge.start_min=3",
         "--set", "surge.end_min=6"]

pytestmark = pytest.mark.packaging


def _sh(*args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(map(str, args))} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    """(wheel, the fresh environment's bin folder, the environment to run it with)."""
    base = tmp_path_factory.mktemp("packaging")
    tree = base / "tree"
    copy_sources(tree)
    dist = base / "dist"
    _sh(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
        "-w", dist, tree)
    (wheel,) = dist.glob("basin_serve-*.whl")
    venv = base / "venv"
    _sh(sys.executable, "-m", "venv", "--without-pip", venv)
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    python = bindir / ("python.exe" if os.name == "nt" else "python")
    site = Path(_sh(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    # Dependencies from this environment, after the fresh one's own packages.
    (site / "zz_borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _sh(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", "--no-index", wheel)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BASIN_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}", MPLBACKEND="Agg",
               MPLCONFIGDIR=str(base / "mpl"))
    return wheel, bindir, env


def test_wheel_carries_the_shipped_files_and_licence(installed):
    wheel, _, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in ("basin/_shipped/scenarios/trap-1p1d.yaml", "basin/_shipped/profiles/hardware/h100-nvl.yaml",
                    "basin/_shipped/profiles/basin/1p1d-h100.yaml", "basin/_shipped/data/README.md",
                    "basin/workload/presets_data/terminal-bench.yaml", "basin/__main__.py",
                    "basin/_shipped/sweeps/fig07-vulnerability-1p1d.yaml",
                    "basin/_shipped/sweeps/calibration/trap-1p1d-seeds.yaml"):
        assert shipped in names, shipped
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in meta
    assert "Requires-Dist: numpy<3,>=2.0" in meta  # ranges, not pins


def test_installed_wheel_lists_scenarios_and_runs_trap_from_an_empty_directory(installed, tmp_path):
    _, bindir, env = installed
    basin = bindir / ("basin.exe" if os.name == "nt" else "basin")
    empty = tmp_path / "empty"
    empty.mkdir()
    where = _sh(bindir / "python", "-c", "import basin, basin.paths as p; print(basin.__file__); "
                                         "print(p.SCENARIO_DIR)", cwd=empty, env=env).split()
    assert all(str(bindir.parent) in w for w in where), where  # the wheel's basin, its own scenarios
    import basin as here

    assert _sh(basin, "--version", cwd=empty, env=env).strip() == f"basin-serve {here.__version__}"
    assert _sh(bindir / "python", "-m", "basin", "--version", cwd=empty, env=env).strip().endswith(here.__version__)
    listed = json.loads(_sh(basin, "scenario", "list", "--json", cwd=empty, env=env))
    assert {"trap-1p1d", "surge-1p3d", "main-1p3d-x5"} <= {s["name"] for s in listed}
    rows = json.loads(_sh(basin, "run", "trap-1p1d", *SHORT, "--json", "--out", "out", cwd=empty, env=env))
    assert rows[0]["system"] == "hicache" and rows[0]["goodput_per_h"] > 0
    prov = json.loads((empty / "out" / "provenance.json").read_text())
    assert prov["basin_serve_version"] == here.__version__
    assert prov["scenarios"][0]["file"].startswith(str(bindir.parent))
    assert (empty / "out" / "timeseries.png").stat().st_size > 0
    assert sorted(p.name for p in empty.iterdir()) == ["out"]  # nothing written beside it


def test_installed_wheel_runs_a_shipped_sweep_by_name(installed, tmp_path):
    """The paper's sweeps are inside the wheel and run by name from anywhere."""
    _, bindir, env = installed
    basin = bindir / ("basin.exe" if os.name == "nt" else "basin")
    empty = tmp_path / "empty"
    empty.mkdir()
    listed = json.loads(_sh(basin, "sweep", "fig07-vulnerability-1p1d", "--list", "--json", cwd=empty, env=env))
    assert listed["runs_total"] == 120
    names = {s["name"] for s in json.loads(_sh(basin, "sweep", "all", "--list", "--json", cwd=empty, env=env))}
    assert {"fig07-vulnerability-1p1d", "demo-surge-size", "calibration/trap-1p1d-seeds"} <= names
    done = json.loads(_sh(basin, "sweep", "demo-surge-size", "--out", "out", "--jobs", "2", "--json",
                          cwd=empty, env=env))
    assert done["runs_total"] == 16 and done["runs_computed"] == 16
    assert (empty / "out" / "sweep.parquet").is_file() and list((empty / "out").glob("*.png"))
