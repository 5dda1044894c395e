"""Every output path is checked before anything runs: a file where a folder
is needed (or a folder where a file is) stops the command at once with one
line naming the flag, exit 2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.cli_helpers import run_basin

import basin.experiments.ablation
import basin.experiments.compare
import basin.experiments.executors
import basin.experiments.pool
import basin.experiments.runner
import basin.experiments.sweep
from basin.cli.outputs import check_out_dir, check_out_file
from basin.errors import BasinInputError


@pytest.fixture
def no_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any simulation or pool job fails the test: the check must come first."""

    def refused(*_: object, **__: object) -> None:
        raise AssertionError("a run started before the output path was checked")

    monkeypatch.setattr(basin.experiments.runner, "run_plan", refused)  # every run, in any process
    # Every module that took the executor or the pool by name at import
    # (imported above, so the patch never becomes what a later import binds).
    for module in (basin.experiments.runner, basin.experiments.compare, basin.experiments.ablation,
                   basin.experiments.sweep):
        monkeypatch.setattr(module, "run_plans", refused)
    for module in (basin.experiments.pool, basin.experiments.executors):
        monkeypatch.setattr(module, "run_jobs", refused)


def _sweep(folder: Path) -> Path:
    path = folder / "tiny.yaml"
    path.write_text("name: tiny\nscenario: trap-1p1d\nset: {duration_min: 10, measure_end_min: 8}\n"
                    "systems: [hicache]\n", encoding="utf-8")
    return path


COMMANDS = [
    ("run", lambda d: ["run", "trap-1p1d", "--no-plots"]),
    ("compare", lambda d: ["compare", "trap-1p1d", "--system", "hicache"]),
    ("ablate", lambda d: ["ablate", "trap-1p1d"]),
    ("sweep", lambda d: ["sweep", str(_sweep(d))]),
    ("replay", lambda d: ["replay", "--scenario", "trap-1p1d", "--target", "http://127.0.0.1:9"]),
]


@pytest.mark.parametrize(("name", "args"), COMMANDS, ids=[c[0] for c in COMMANDS])
@pytest.mark.parametrize("nested", [False, True], ids=["file", "inside-a-file"])
@pytest.mark.usefixtures("no_runs")
def test_a_file_where_the_output_folder_goes(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str,
                                             args: object, nested: bool) -> None:
    blocker = tmp_path / "taken"
    blocker.write_text("not a folder\n", encoding="utf-8")
    out = blocker / "results" if nested else blocker
    code, _, err = run_basin(capsys, *args(tmp_path), "--out", str(out))  # type: ignore[operator]
    assert code == 2, err
    assert err.startswith(f"error: --out {out}: ") and "not a folder" in err
    assert "Traceback" not in err and len(err) < 300
    assert blocker.read_text(encoding="utf-8") == "not a folder\n"


@pytest.mark.parametrize(("args", "flag"), [
    (["report", "DIR"], "--out"),
    (["model", "plot", "--scenario", "trap-1p1d"], "--out"),
    (["profile", "1p1d-h100"], "--out"),
    (["compare", "trap-1p1d", "--system", "hicache", "--out", "OUT", "--plot"], "--plot"),
], ids=["report", "model-plot", "profile", "compare-plot"])
@pytest.mark.usefixtures("no_runs")
def test_a_folder_where_an_output_file_goes(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                            flag: str) -> None:
    folder = tmp_path / ("x.yaml" if args[0] == "profile" else "x.png")
    folder.mkdir()
    (tmp_path / "DIR").mkdir()
    (tmp_path / "DIR" / "summary.csv").write_text("system\nhicache\n", encoding="utf-8")
    argv = [str(tmp_path / a) if a in ("DIR", "OUT") else a for a in args]
    if flag == "--out" and "--out" not in argv:
        argv += ["--out", str(folder)]
    else:
        argv.append(str(folder))
    code, _, err = run_basin(capsys, *argv)
    assert code == 2, err
    assert err.startswith(f"error: {flag} {folder}: is a folder"), err


def test_checks_create_nothing_and_accept_new_paths(tmp_path: Path) -> None:
    check_out_dir(tmp_path / "a" / "b")
    check_out_file(tmp_path / "c" / "d.png")
    check_out_file(Path("plain-name.png"))
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # os.access stands in for the permission bits, which root (CI) ignores.
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != tmp_path)
    with pytest.raises(BasinInputError, match=f"--out {tmp_path / 'new'}: the folder {tmp_path} is not writable"):
        check_out_dir(tmp_path / "new")
