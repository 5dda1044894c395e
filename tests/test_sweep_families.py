"""Figure families in ``basin sweep``: named ``cases`` (one-at-a-time
variants), the ``frontier`` plot (where runs stop holding along an axis) and
the ``relative`` plot (each case against a reference case)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from tests.cli_helpers import run_basin
from tests.test_sweep import ROOT, write_sweep

from basin.experiments.sweep import run_sweep
from basin.experiments.sweep_grid import load_sweep
from basin.experiments.sweep_plots import draw_plots, frontier_cells, relative_bars

# ------------------------------------------------------------ validation
BAD_CASES = [
    ("cases: {}\n", "field 'cases': no case given; name at least one"),
    ("cases: [a, b]\n", "field 'cases': expected a section of fields"),
    ("cases:\n  a: 3\n", "field 'cases.a': expected a section of fields"),
    ("cases:\n  a: {surge.factr: 2}\n", "field 'cases.a.surge.factr': a scenario has no field 'surge.factr'; "
                                        "did you mean surge.factor?"),
    ("set:\n  surge.factor: 2.0\ncases:\n  a: {surge.factor: 3.0}\n",
     "field 'cases.a.surge.factor' and field 'set.surge.factor' both give 'surge.factor'; a case may not "
     "override set"),
    ("axes:\n  surge.factor: [1.0, 2.0]\ncases:\n  a: {surge.factor: 3.0}\n",
     "field 'cases.a.surge.factor' and field 'axes.surge.factor' both give 'surge.factor'"),
    ("derived:\n  load: {values: [0.5], of: base}\ncases:\n  a: {arrivals.base_fraction_of_critical: 0.4}\n",
     "field 'cases.a.arrivals.base_fraction_of_critical' and field 'derived.load.sets' both give the base rate"),
    ("cases:\n  a: {arrivals.base_per_min: 3, arrivals.base_fraction_of_critical: 0.4}\n",
     "field 'cases.a.arrivals.base_fraction_of_critical' and field 'cases.a.arrivals.base_per_min' both give "
     "the base rate"),
    ("axes:\n  policy_params: [{interval_s: 10}]\ncases:\n  a: {policy_params.margin: 0.7}\n",
     "field 'cases.a.policy_params.margin' overlaps field 'axes.policy_params'"),
    ("cases:\n  a: {policy: basin}\n", "field 'cases.a.policy': the systems are listed under 'systems:'"),
    ("cases:\n  a: {seed: 3}\n", "field 'cases.a.seed': seeds are an axis"),
    ("cases:\n  a: {surge.factor: 3}\n  b: {surge.factor: 3}\n",
     "field 'cases.b': the same overrides as case 'a' (the same runs)"),
    ("cases:\n  'a b': {surge.factor: 3}\n", "field 'cases.a b': a case name is one word"),
    ("cases:\n  big: {surge.factor: -1}\n", "field 'cases.big.surge.factor' at the run case=big: scenario field "
                                            "'surge.factor': must be > 0.0 (got -1)"),
    ("systems: [basin]\ncases:\n  fast: {policy_params.interval_s: -5}\n",
     "at the run case=fast: "),
    ("derived:\n  case: {values: [0.5], of: base}\n", "field 'derived.case': a derived axis needs a name of its own"),
]

BAD_PLOTS = [
    ("cases:\n  a: {}\n  b: {surge.factor: 3}\nplot: {kind: frontier, x: case}\n",
     "field 'plot.x': a frontier searches a numeric axis"),
    ("axes:\n  surge.factor: [1.0]\nplot: {kind: frontier, x: surge.factor}\n",
     "field 'plot.x': 'surge.factor' has one value; a frontier needs several"),
    ("axes:\n  surge.factor: [1.0, 2.0]\nplot: {kind: frontier, x: surge.factor, field: goodput_per_h}\n",
     "field 'plot.field': a frontier shows where runs stop recovering"),
    ("axes:\n  surge.factor: [1.0, 2.0]\nplot: {kind: frontier, x: surge.factor, fails: []}\n",
     "field 'plot.fails': no state given"),
    ("axes:\n  surge.factor: [1.0, 2.0]\nplot: {kind: frontier, x: surge.factor, fails: [broken]}\n",
     "field 'plot.0.fails.0': expected one of 'trapped', 'overloaded'"),
    ("axes:\n  surge.factor: [1.0, 2.0]\nplot: {kind: frontier, x: surge.factor, max_trapped: 1.5}\n",
     "field 'plot.0.max_trapped': must be < 1.0 (got 1.5)"),
    ("axes:\n  surge.factor: [1.0, 2.0]\n  host_ratio: [0, 2]\n"
     "plot: {kind: frontier, x: surge.factor, y: host_ratio, group: surge.factor}\n",
     "field 'plot.group': 'surge.factor' is already x"),
    ("axes:\n  surge.factor: [1.0, 2.0]\n  host_ratio: [0, 2]\n"
     "plot: {kind: heatmap, x: surge.factor, y: host_ratio, group: seed}\n",
     "field 'plot.group': a heatmap plot takes no 'group' (that is an option of kind frontier)"),
    ("axes:\n  surge.factor: [1.0, 2.0]\nplot: {kind: line, x: surge.factor, reference: 1.0}\n",
     "field 'plot.reference': a line plot takes no 'reference' (that is an option of kind relative)"),
    ("axes:\n  surge.factor: [1.0, 2.0]\n  host_ratio: [0, 2]\nplot: {kind: frontier, x: surge.factor}\n",
     "field 'plot': axis host_ratio has several values but the frontier shows only surge.factor"),
    ("cases:\n  default: {}\n  b: {surge.factor: 3}\nplot: {kind: relative, x: case}\n",
     "field 'plot.reference': a relative plot needs the value of x (case) the others are divided by; give "
     "reference: one of default, b"),
    ("cases:\n  default: {}\n  b: {surge.factor: 3}\nplot: {kind: relative, x: case, reference: defualt}\n",
     "field 'plot.reference': 'defualt' is not a value of case; did you mean default?"),
    ("cases:\n  default: {}\n  b: {surge.factor: 3}\nplot: {kind: relative, x: case, reference: default, "
     "field: trapped}\n", "field 'plot.field': a relative plot divides a number of the run summary"),
    ("cases:\n  default: {}\nplot: {kind: relative, x: case, reference: default}\n",
     "field 'plot.x': 'case' has only the reference value"),
]


@pytest.mark.parametrize(("body", "message"), BAD_CASES + BAD_PLOTS)
def test_bad_family_sweep_names_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str,
                                          message: str) -> None:
    path = write_sweep(tmp_path, body)
    code, _, err = run_basin(capsys, "sweep", str(path), "--out", str(tmp_path / "out"), "--list")
    assert code == 2, err
    assert message in err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------- cases
def test_cases_are_an_axis_applied_after_set(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, "set:\n  policy_params: {interval_s: 20}\n"
                                 "cases:\n  default: {}\n  tight: {policy_params.margin: 0.7}\n"
                                 "  big: {surge.factor: 3.0}\n"
                                 "axes:\n  seed: [0, 1]\nsystems: [basin]\n")
    sweep = load_sweep(path)
    assert sweep.coord_columns == ("case", "seed", "system")
    assert sweep.axis_values["case"] == ("default", "tight", "big")
    assert [(p.coords["case"], p.coords["seed"]) for p in sweep.points] == [
        ("default", 0), ("default", 1), ("tight", 0), ("tight", 1), ("big", 0), ("big", 1)]
    tight = sweep.points[2]
    assert tight.plan.scenario.policy_params == {"interval_s": 20, "margin": 0.7}  # the case refines set's mapping
    assert tight.plan.overrides == ('policy_params={"interval_s": 20}', "policy_params.margin=0.7", "seed=0")
    assert sweep.points[4].plan.scenario.surge.factor == 3.0
    assert sweep.points[0].plan.scenario.surge.factor == 2.0  # the scenario's own
    assert len({p.key for p in sweep.points}) == 6


def test_no_cases_no_case_column() -> None:
    sweep = load_sweep(ROOT / "sweeps" / "demo-surge-size.yaml")
    assert "case" not in sweep.coord_columns and "case" not in sweep.axis_values


def test_cases_relative_plot_runs(tmp_path: Path) -> None:
    # interval_s 30 is BASIN's default: another run (the scenario's policy_params differ as given), the same
    # numbers (the simulator is deterministic and BASIN resolves to the same settings).
    path = write_sweep(tmp_path, "cases:\n  default: {}\n  same: {policy_params.interval_s: 30}\n"
                                 "  fast: {policy_params.interval_s: 10}\n"
                                 "axes:\n  seed: [0, 1]\nsystems: [basin]\n"
                                 "plot: {kind: relative, x: case, field: goodput_per_h, reference: default}\n")
    sweep = load_sweep(path)
    assert sweep.points[0].key != sweep.points[2].key
    assert sweep.points[0].plan.config["policy_params"] == sweep.points[2].plan.config["policy_params"]
    outcome = run_sweep(sweep, tmp_path / "out", workers=1)
    assert outcome.runs_computed == 6 and outcome.runs_total == 6
    assert [p.name for p in outcome.plots] == ["tiny-relative-goodput_per_h.png"]
    rows = pq.read_table(outcome.table).to_pylist()
    assert list(rows[0])[:4] == ["case", "seed", "system", "run"]
    assert [r["case"] for r in rows] == ["default", "default", "same", "same", "fast", "fast"]
    bars = relative_bars(sweep, sweep.spec.plot[0], rows)
    assert [(b.x, b.system) for b in bars] == [("same", "basin"), ("fast", "basin")]
    assert bars[0].ratios == (1.0, 1.0)
    assert len(bars[1].ratios) == 2 and bars[1].median > 0


def test_relative_pairs_by_seed_and_y(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, "cases:\n  ref: {}\n  b: {surge.factor: 3.0}\n"
                                 "axes:\n  host_ratio: [0, 2]\n  seed: [0, 1]\n"
                                 "plot: {kind: relative, x: case, y: host_ratio, reference: ref}\n")
    sweep = load_sweep(path)
    rows: list[dict[str, Any]] = []
    for p in sweep.points:
        c = p.coords
        value = 100.0 * (1 + c["seed"]) * (1 + c["host_ratio"]) * (0.5 if c["case"] == "b" else 1.0)
        rows.append({**c, "goodput_per_h": value, "state": "healthy"})
    bars = relative_bars(sweep, sweep.spec.plot[0], rows)
    assert [(b.x, b.y) for b in bars] == [("b", 0), ("b", 2)]
    assert all(b.ratios == (0.5, 0.5) for b in bars)
    assert [p.name for p in draw_plots(sweep, rows, tmp_path)] == ["tiny-relative-goodput_per_h.png"]


# -------------------------------------------------------------- frontier
def _frontier_rows(sweep: Any, states: dict[tuple[int, float], list[str]]) -> list[dict[str, Any]]:
    rows = []
    for p in sweep.points:
        c = p.coords
        seeds = states[(c["host_ratio"], c["arrivals.base_per_min"])]
        rows.append({**c, "state": seeds[c["seed"]]})
    return rows


def test_frontier_cells(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, "axes:\n  host_ratio: [0, 2, 5, 10]\n  arrivals.base_per_min: [2.0, 3.0, 4.0]\n"
                                 "  seed: [0, 1, 2]\n"
                                 "plot:\n  - {kind: frontier, x: arrivals.base_per_min, y: host_ratio}\n"
                                 "  - {kind: frontier, x: arrivals.base_per_min, y: host_ratio, "
                                 "fails: [trapped, overloaded], max_trapped: 0, out: strict.svg}\n")
    sweep = load_sweep(path)
    h, t, o = "healthy", "trapped", "overloaded"
    states = {
        (0, 2.0): [h, h, t], (0, 3.0): [t, t, h], (0, 4.0): [t, t, t],      # holds at 2 (1 of 3 trapped)
        (2, 2.0): [h, h, h], (2, 3.0): [o, o, h], (2, 4.0): [t, o, o],      # overloaded is not trapped
        (5, 2.0): [t, t, t], (5, 3.0): [h, h, h], (5, 4.0): [h, h, h],      # fails at once, holds again
        (10, 2.0): [h, h, h], (10, 3.0): [h, h, h], (10, 4.0): [h, h, h],  # holds everywhere
    }
    rows = _frontier_rows(sweep, states)
    cells = {c.y: c for c in frontier_cells(sweep, sweep.spec.plot[0], rows)}
    assert (cells[0].frontier, cells[0].first_fail, cells[0].limit) == (2.0, 3.0, "cache")
    assert cells[0].shares == ((2.0, 1, 3), (3.0, 2, 3), (4.0, 3, 3))
    assert (cells[2].frontier, cells[2].first_fail, cells[2].limit) == (4.0, None, None)  # 1 of 3 trapped
    assert (cells[5].frontier, cells[5].first_fail, cells[5].holds_again) == (None, 2.0, True)
    assert (cells[10].frontier, cells[10].first_fail, cells[10].limit) == (4.0, None, None)
    strict = {c.y: c for c in frontier_cells(sweep, sweep.spec.plot[1], rows)}
    assert (strict[0].frontier, strict[0].first_fail) == (None, 2.0)  # no seed may fail
    assert (strict[2].frontier, strict[2].first_fail, strict[2].limit) == (2.0, 3.0, "compute")
    # An overload whose last window lost reuse counts as the cache's.
    lost = [{**r, "hit_rate_pre": 0.9, "hit_rate_final": 0.1 if r["state"] == "overloaded" else 0.9} for r in rows]
    assert {c.y: c for c in frontier_cells(sweep, sweep.spec.plot[1], lost)}[2].limit == "cache"
    drawn = draw_plots(sweep, rows, tmp_path)
    assert [p.name for p in drawn] == ["tiny-frontier-trapped.png", "strict.svg"]
    assert all(p.stat().st_size > 0 for p in drawn)


def test_frontier_with_groups_draws_a_panel_each(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, "axes:\n  workload.tool_time: [1, 3]\n  host_ratio: [0, 2]\n"
                                 "  arrivals.base_per_min: [2.0, 3.0]\n  seed: [0]\nsystems: [hicache, basin]\n"
                                 "plot: {kind: frontier, x: arrivals.base_per_min, y: host_ratio, "
                                 "group: workload.tool_time, fails: [trapped, overloaded]}\n")
    sweep = load_sweep(path)
    rows = [{**p.coords, "state": "trapped" if p.coords["arrivals.base_per_min"] > 2.5 else "healthy"}
            for p in sweep.points]
    cells = frontier_cells(sweep, sweep.spec.plot[0], rows)
    assert len(cells) == 2 * 2 * 2
    assert {(c.frontier, c.first_fail, c.limit) for c in cells} == {(2.0, 3.0, "cache")}
    assert draw_plots(sweep, rows, tmp_path)[0].is_file()


def test_shipped_family_sweeps_load() -> None:
    fig08 = load_sweep(ROOT / "sweeps" / "fig08-recoverable-load.yaml")
    assert {p.kind for p in fig08.spec.plot} == {"frontier"} and len(fig08.points) == 432
    starts = {p.coords["case"]: (p.plan.scenario.workload.tool_time, p.plan.scenario.surge.start_min)
              for p in fig08.points}
    assert starts == {"tools-x1": (1, 30), "tools-x3": (3, 60), "tools-x10": (10, 120)}
    assert len(load_sweep(ROOT / "sweeps" / "fig08-recoverable-load-1p3d.yaml").points) == 72
    fig24 = load_sweep(ROOT / "sweeps" / "fig24-sensitivity.yaml")
    assert fig24.axis_values["case"][0] == "default" and len(fig24.points) == 17 * 5
