"""Sweep plots name their axes in words with units, and a derived axis with
the rate it is a multiple of (the critical rate, the base rate or a number)."""

from __future__ import annotations

from pathlib import Path

from tests.test_sweep import write_sweep

from basin.experiments.sweep_grid import load_sweep
from basin.experiments.sweep_plots import _label, axis_label


def test_axes_carry_units_and_their_reference(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, "axes:\n  surge.factor: [1.0, 3.0]\n  seed: [0]\n"
                                 "derived:\n  base_load: {values: [0.5, 1.0], of: base}\n"
                                 "  after: {values: [0.2], of: 2.0, sets: arrivals.rate_changes, at_min: 6}\n"
                                 "plot:\n  - {kind: heatmap, x: surge.factor, y: base_load, field: goodput_per_h}\n")
    sweep = load_sweep(path)
    rows = [dict(p.coords) for p in sweep.points]
    assert axis_label(sweep, "base_load", rows) == \
        "base_load\n(base rate, x the scenario's base rate, 3.3/min)"
    assert axis_label(sweep, "after", rows) == "after\n(after-surge rate, x 2/min)"
    assert axis_label(sweep, "surge.factor", rows).startswith("surge.factor (arrival rate in the surge")
    assert axis_label(sweep, "duration_min", rows) == "duration_min (min)"
    assert _label(sweep.spec.plot[0]) == "goodput (sessions/h)"


def test_critical_reference_names_lambda_c(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, "axes:\n  seed: [0]\nderived:\n  base_load: {values: [0.5, 1.0], of: critical}\n"
                                 "plot: {kind: line, x: base_load}\n")
    sweep = load_sweep(path)
    label = axis_label(sweep, "base_load", [dict(p.coords) for p in sweep.points])
    assert label.startswith("base_load\n(base rate, x the critical rate λc, ")
    assert label.endswith("/min)")
