"""``basin tune``: the tuning file's checks (each naming the field and the
fix), the selection rule on a hand-made table, and one short tuning end to
end (the table, best.csv, and a rerun that computes nothing)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from tests.cli_helpers import run_basin

from basin.errors import BasinInputError
from basin.experiments.tune import load_tuning
from basin.experiments.tune_report import Outcome, select
from basin.experiments.tune_spec import DEFAULTS

ROOT = Path(__file__).resolve().parents[1]

#: trap-1p1d cut to 20 minutes and 300 sessions: a run takes about a second.
SHORT = """\
scenarios: [trap-1p1d]
set: {duration_min: 20, measure_end_min: 15, surge.start_min: 3, surge.end_min: 8, workload.sessions: 300}
"""


def write_tuning(folder: Path, body: str, header: str = SHORT, name: str = "tiny") -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(f"name: {name}\n{header}{body}", encoding="utf-8")
    return path


# ------------------------------------------------------------ validation
BAD_TUNINGS = [
    (SHORT, "systems:\n  hicach: {}\n", "field 'systems.hicach': unknown system; did you mean hicache?"),
    (SHORT, "systems:\n  continuum:\n    fixed_ttl: [2.0]\n",
     "field 'systems.continuum.fixed_ttl': value 2.0: policy 'continuum', parameter 'fixed_ttl': unknown; did you "
     "mean fixed_ttl_s?"),
    (SHORT, "systems:\n  continuum:\n    fixed_ttl_s: [two]\n",
     "field 'systems.continuum.fixed_ttl_s': value 'two': policy 'continuum', parameter 'fixed_ttl_s': expected a "
     "number, got 'two'"),
    (SHORT, "systems:\n  crossflow:\n    margin: [0.1, 1.5]\n",
     "field 'systems.crossflow.margin': value 1.5: policy 'crossflow', parameter 'margin': must be in [0, 1)"),
    (SHORT, "systems:\n  thunderagent:\n    tick_s: 5\n", "field 'systems.thunderagent.tick_s': expected a list"),
    (SHORT, "systems:\n  crossflow:\n    margin: []\n", "field 'systems.crossflow.margin': list at least one value"),
    (SHORT, "systems:\n  crossflow:\n    margin: [0.2, 0.2]\n",
     "field 'systems.crossflow.margin': the value(s) 0.2 appear twice"),
    (SHORT, "systems:\n  composition:\n    thunderagent.capacity_scal: [1.0]\n",
     "field 'systems.composition.thunderagent.capacity_scal': value 1.0: policy 'thunderagent', parameter "
     "'capacity_scal': unknown"),
    (SHORT, "systems:\n  concur:\n    u_low: [0.2, 0.6]\n    u_high: [0.5]\n",
     "field 'systems.concur': the setting u_low=0.6, u_high=0.5: policy 'concur', parameter 'u_high': must be in "
     "[u_low, 1]"),
    ("scenarios: []\n", "systems:\n  hicache: {}\n", "field 'scenarios': list at least one scenario"),
    ("scenarios: [main-1p3d-x6]\n", "systems:\n  hicache: {}\n",
     "field 'scenarios.0': unknown scenario 'main-1p3d-x6': did you mean main-1p3d-x5"),
    (SHORT, "system:\n  hicache: {}\n", "field 'system': not a field here; did you mean systems?"),
    (SHORT, "seeds: [0, 0]\nsystems:\n  hicache: {}\n", "field 'seeds': a seed appears twice"),
    ("scenarios: [trap-1p1d]\nset: {policy_params.margin: 0.2}\n", "systems:\n  crossflow: {}\n",
     "field 'set.policy_params.margin': a tuning sets this elsewhere; give a system's parameters under 'systems:"),
    ("scenarios: [trap-1p1d]\nset: {surge.factr: 2}\n", "systems:\n  hicache: {}\n",
     "field 'set.surge.factr': a scenario has no field 'surge.factr'; did you mean surge.factor?"),
]


@pytest.mark.parametrize(("header", "body", "message"), BAD_TUNINGS)
def test_bad_tuning_names_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str], header: str, body: str,
                                    message: str) -> None:
    path = write_tuning(tmp_path, body, header)
    code, _, err = run_basin(capsys, "tune", str(path), "--out", str(tmp_path / "out"), "--list")
    assert code == 2, err
    assert f"{path}: {message}" in err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_missing_file_and_bad_executor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_basin(capsys, "tune", str(tmp_path / "none.yaml"), "--list")
    assert code == 2 and "tuning file not found" in err
    good = write_tuning(tmp_path, "systems:\n  hicache: {}\n")
    code, _, err = run_basin(capsys, "tune", str(good), "--executor", "dask")
    assert code == 2 and "--executor 'dask': use one of local, ray" in err


def test_defaults_are_one_point_of_every_grid(tmp_path: Path) -> None:
    """A grid without the defaults gets them as its first setting; a grid
    with them holds them once; no grid is the defaults alone."""
    path = write_tuning(tmp_path, "seeds: [0, 1]\nsystems:\n  hicache:\n  crossflow:\n    margin: [0.05, 0.3]\n"
                                  "  composition:\n    thunderagent.capacity_scale: [1.0, 1.5]\n")
    tuning = load_tuning(path)
    labels = {s: [x.label for x in v] for s, v in tuning.settings.items()}
    assert labels == {"hicache": [DEFAULTS], "crossflow": [DEFAULTS, "margin=0.05", "margin=0.3"],
                      "composition": [DEFAULTS, "thunderagent.capacity_scale=1.5"]}
    assert [x.default for x in tuning.settings["crossflow"]] == [True, False, False]
    assert tuning.settings["crossflow"][0].params() == {"margin": 0.1}
    assert len(tuning.runs) == (1 + 3 + 2) * 2 == len({r.key for r in tuning.runs})
    computed = {p.key for s in tuning.sweeps for p in s.points}
    assert computed == {r.key for r in tuning.runs}  # the grid's copy of the defaults is not computed twice


def test_a_list_of_grids_is_their_union(tmp_path: Path) -> None:
    path = write_tuning(tmp_path, "systems:\n  thunderagent:\n    - {capacity_scale: [0.5, 1.0]}\n"
                                  "    - {capacity_scale: [0.5], tick_s: [2.0, 5.0]}\n")
    tuning = load_tuning(path)
    assert [x.label for x in tuning.settings["thunderagent"]] == [
        DEFAULTS, "capacity_scale=0.5", "capacity_scale=0.5, tick_s=2"]
    assert tuning.settings["thunderagent"][1].params() == {"capacity_scale": 0.5, "tick_s": 5.0}
    assert len(tuning.runs) == 3
    bad = write_tuning(tmp_path, "systems:\n  thunderagent:\n    - {tick_s: [1.0]}\n    - {tick_s: [-1.0]}\n",
                       name="bad")
    with pytest.raises(BasinInputError, match=r"field 'systems.thunderagent.1.tick_s': value -1.0: policy "
                                              r"'thunderagent', parameter 'tick_s': must be a finite number > 0"):
        load_tuning(bad)


# ------------------------------------------------------------- selection
def _table(rows: list[tuple[str, str, str, int, float]], default: str = DEFAULTS) -> list[Outcome]:
    return [Outcome(system, setting, scenario, seed, setting == default, goodput)
            for system, setting, scenario, seed, goodput in rows]


def test_best_is_one_setting_for_every_scenario_not_an_oracle() -> None:
    """Setting "a" wins scenario x outright but collapses on y; "b" is good on
    both: b is the best single setting, while x's oracle is a."""
    outcomes = _table([
        ("ref", DEFAULTS, "x", 0, 100.0), ("ref", DEFAULTS, "y", 0, 100.0),
        ("sys", DEFAULTS, "x", 0, 50.0), ("sys", DEFAULTS, "y", 0, 50.0),
        ("sys", "a", "x", 0, 100.0), ("sys", "a", "y", 0, 10.0),   # mean relative 0.55
        ("sys", "b", "x", 0, 80.0), ("sys", "b", "y", 0, 70.0),    # mean relative 0.75
    ])
    choices = select(outcomes)
    sys_ = choices["sys"]
    assert sys_.best_setting == "b"
    assert sys_.default_score == pytest.approx(0.5) and sys_.best_score == pytest.approx(0.75)
    x, y = sys_.scenarios
    assert (x.scenario, x.default_goodput, x.best_goodput, x.oracle_setting, x.oracle_goodput) == \
        ("x", 50.0, 80.0, "a", 100.0)
    assert x.ratio == pytest.approx(1.6) and y.oracle_setting == "b"
    assert x.reference_goodput == 100.0
    assert choices["ref"].best_setting == DEFAULTS and choices["ref"].settings_tried == 1


def test_relative_goodput_weighs_scenarios_alike_and_seeds_are_averaged() -> None:
    """A small scenario counts as much as a large one (goodput relative to the
    scenario's best), and each cell is the mean over seeds."""
    outcomes = _table([
        ("sys", DEFAULTS, "big", 0, 1000.0), ("sys", DEFAULTS, "big", 1, 1000.0),
        ("sys", DEFAULTS, "small", 0, 5.0), ("sys", DEFAULTS, "small", 1, 5.0),
        ("sys", "c", "big", 0, 900.0), ("sys", "c", "big", 1, 1100.0),     # mean 1000: the same
        ("sys", "c", "small", 0, 10.0), ("sys", "c", "small", 1, 6.0),     # mean 8
    ])
    best = select(outcomes)["sys"]
    assert best.best_setting == "c"
    assert best.best_score == pytest.approx(1.0) and best.default_score == pytest.approx((1 + 5 / 8) / 2)


def test_ties_keep_the_defaults_and_nothing_served_is_left_out() -> None:
    outcomes = _table([
        ("sys", DEFAULTS, "x", 0, 40.0), ("sys", "same", "x", 0, 40.0),
        ("sys", DEFAULTS, "dead", 0, 0.0), ("sys", "same", "dead", 0, 0.0),
        ("sys", "partial", "x", 0, 90.0),  # not run on every scenario: not eligible
    ])
    best = select(outcomes)["sys"]
    assert best.best_setting == DEFAULTS
    assert best.best_score == pytest.approx(40 / 90)  # "dead" (reference 0) is out of the mean
    x = next(sc for sc in best.scenarios if sc.scenario == "x")
    assert x.oracle_setting == "partial"  # the oracle may still name it: it is per scenario
    dead = next(sc for sc in best.scenarios if sc.scenario == "dead")
    assert math.isnan(dead.ratio)


# -------------------------------------------------------------- end to end
def test_tune_end_to_end_and_a_rerun_computes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_tuning(tmp_path, "systems:\n  hicache: {}\n  crossflow:\n    margin: [0.1, 0.3]\n")
    out = tmp_path / "out"
    code, listed, err = run_basin(capsys, "tune", str(path), "--out", str(out), "--list", "--json")
    assert code == 0, err
    assert json.loads(listed)["runs_total"] == 3 and json.loads(listed)["runs_stored"] == 0

    code, shown, err = run_basin(capsys, "tune", str(path), "--out", str(out), "--jobs", "2")
    assert code == 0, err
    assert "3 runs (3 computed, 0 reused)" in err
    assert "best setting" in shown and "crossflow" in shown and "oracle" in shown

    rows = pq.read_table(out / "tune.parquet").to_pylist()
    assert [(r["system"], r["margin"], r["default"], r["setting"]) for r in rows] == [
        ("hicache", None, True, DEFAULTS), ("crossflow", 0.1, True, DEFAULTS), ("crossflow", 0.3, False, "margin=0.3")]
    assert all(r["scenario"] == "trap-1p1d" and r["seed"] == 0 for r in rows)
    assert {"goodput_per_h", "state", "completed_fraction", "run"} <= set(rows[0])
    assert "windows" not in rows[0]

    with open(out / "best.csv", newline="", encoding="utf-8") as fh:
        best = list(csv.DictReader(fh))
    assert [b["system"] for b in best] == ["hicache", "crossflow"]
    cross = best[1]
    crossflow_rows = {r["setting"]: r["goodput_per_h"] for r in rows if r["system"] == "crossflow"}
    winner = max(crossflow_rows, key=lambda s: (crossflow_rows[s], s == DEFAULTS))
    assert cross["best_setting"] == winner
    assert float(cross["goodput_default"]) == pytest.approx(crossflow_rows[DEFAULTS], rel=1e-5)
    assert float(cross["ratio_best_default"]) == pytest.approx(
        crossflow_rows[winner] / crossflow_rows[DEFAULTS], rel=1e-4)
    assert float(cross["best.margin"]) == (0.1 if winner == DEFAULTS else 0.3)
    assert (out / "tune-goodput.png").stat().st_size > 0
    record = json.loads((out / "provenance.json").read_text())
    assert record["tune"]["runs"] == [r["run"] for r in rows] and record["runs_computed"] == 3

    before = (out / "tune.parquet").read_bytes()
    code, again, err = run_basin(capsys, "tune", str(path), "--out", str(out), "--json")
    assert code == 0, err
    summary = json.loads(again)
    assert (summary["runs_total"], summary["runs_computed"], summary["runs_reused"]) == (3, 0, 3)
    assert summary["best_params"] == {"hicache": {}, "crossflow": {"margin": 0.1 if winner == DEFAULTS else 0.3}}
    assert (out / "tune.parquet").read_bytes() == before
