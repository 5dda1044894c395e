"""Hit curves: the paper's shape, tables, CSV loading and the monotone fit."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from basin.cliff import reference_hit
from basin.errors import BasinInputError
from basin.model.curves import named_curve, simulator_curve
from basin.model.hitcurve import PaperHitCurve, TableHitCurve, fit_table, load_table_csv


def test_paper_shape_is_the_one_reference_curve_with_its_plateau_sag_knee_and_floor() -> None:
    c = PaperHitCurve()
    x = np.array([0.0, 0.9, 1.5, 1.9, 2.4, 5.0])
    h = c(x)
    np.testing.assert_allclose(h, reference_hit(x, 1.0, 0.95, 0.30))  # basin.cliff's curve, unstretched
    assert h[0] == pytest.approx(0.95, abs=1e-3) and h[1] == pytest.approx(0.95, abs=1e-3)  # flat to the cache
    assert 0.80 < h[2] < 0.92                                     # sagging as the knee nears
    assert h[3] == pytest.approx(0.30 + 0.65 * 0.8 / 2, abs=1e-9)  # halfway down the fall, less the sag
    assert h[4] < 0.35                                            # near the floor past the knee
    assert h[5] == pytest.approx(0.30, abs=1e-6)
    assert c.knee_ratio == 1.9 and c.floor == 0.30
    moved = PaperHitCurve(knee=3.8)
    assert moved(3.8) == pytest.approx(h[3]) and moved(1.9) == pytest.approx(c(0.95))


@settings(max_examples=60, deadline=None)
@given(st.floats(0.3, 1.0), st.floats(0.0, 0.5), st.floats(0.5, 4.0))
def test_paper_shape_never_rises(plateau: float, floor: float, knee: float) -> None:
    floor = min(floor, plateau)
    c = PaperHitCurve(plateau, knee, floor)
    h = c(np.linspace(0, 4 * knee, 2000))
    assert np.all(np.diff(h) <= 1e-12)
    assert np.all((h >= floor - 1e-12) & (h <= plateau + 1e-12))


def test_paper_shape_refuses_a_rising_cliff() -> None:
    with pytest.raises(BasinInputError, match="plateau >= floor"):
        PaperHitCurve(plateau=0.5, floor_rate=0.8)
    with pytest.raises(BasinInputError, match="'knee'"):
        PaperHitCurve(knee=-1.0)


def test_table_interpolates_and_extends_flat() -> None:
    t = TableHitCurve((0.5, 1.0, 2.0), (0.9, 0.8, 0.1))
    np.testing.assert_allclose(t(np.array([0.0, 0.75, 1.5, 9.0])), [0.9, 0.85, 0.45, 0.1])
    assert t.floor == 0.1
    assert t.knee_ratio == pytest.approx(1.0 + (0.8 - 0.5) / 0.7)  # where it crosses (0.9 + 0.1) / 2


def test_table_rejects_bad_rows() -> None:
    with pytest.raises(BasinInputError, match="must not rise"):
        TableHitCurve((0.5, 1.0), (0.5, 0.9))
    with pytest.raises(BasinInputError, match="strictly increasing"):
        TableHitCurve((1.0, 1.0), (0.9, 0.8))
    with pytest.raises(BasinInputError, match=r"\[0, 1\]"):
        TableHitCurve((0.0, 1.0), (1.2, 0.8))


def test_csv_round_trip_and_errors(tmp_path) -> None:
    t = TableHitCurve((0.2, 1.5, 2.5), (0.95, 0.8, 0.05), label="x")
    path = tmp_path / "curve.csv"
    t.to_csv(path)
    back = load_table_csv(path)
    np.testing.assert_allclose(back.ratios, t.ratios)
    np.testing.assert_allclose(back.hit_rates, t.hit_rates)
    assert named_curve(str(path)).floor == pytest.approx(0.05)
    bad = tmp_path / "bad.csv"
    bad.write_text("ratio,hit\n0.1,0.9\n")
    with pytest.raises(BasinInputError, match="missing column 'hit_rate'"):
        load_table_csv(bad)
    bad.write_text("ratio,hit_rate\n0.1,high\n")
    with pytest.raises(BasinInputError, match="line 2, field 'hit_rate'"):
        load_table_csv(bad)
    with pytest.raises(BasinInputError, match="not found"):
        load_table_csv(tmp_path / "missing.csv")


def test_fit_is_monotone_and_robust_to_noise() -> None:
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 4, 3000)
    truth = PaperHitCurve()
    h = np.clip(truth(x) + rng.normal(0, 0.05, x.size), 0, 1)
    t = fit_table(x, h, bin_width=0.1)
    assert np.all(np.diff(t.hit_rates) <= 0)
    grid = np.linspace(0.2, 3.8, 50)
    assert np.max(np.abs(t(grid) - truth(grid))) < 0.2  # the knee itself is smeared by binning
    assert abs(t.knee_ratio - 1.9) < 0.1


def test_fit_pools_rising_bins_by_their_point_counts() -> None:
    # Bins at 0.05 (median 0.9, 3 points), 0.15 (0.6, 3), 0.25 (0.8, 9), 0.35 (0.1, 3):
    # the rise from 0.6 to 0.8 is pooled to (3 * 0.6 + 9 * 0.8) / 12 = 0.75.
    x = [0.05] * 3 + [0.15] * 3 + [0.25] * 9 + [0.35] * 3
    h = [0.9] * 3 + [0.6] * 3 + [0.8] * 9 + [0.1] * 3
    t = fit_table(x, h, bin_width=0.1)
    assert t.hit_rates == (0.9, 0.75, 0.75, 0.1)


def test_importing_hitcurve_does_not_import_sklearn() -> None:
    code = "import sys, basin.model.hitcurve; print('sklearn' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_fit_needs_two_populated_bins() -> None:
    with pytest.raises(BasinInputError, match="only 1 bin"):
        fit_table([1.0, 1.01, 1.02], [0.9, 0.9, 0.9])


def test_named_curves() -> None:
    assert named_curve("paper").knee_ratio == 1.9
    sim = simulator_curve()
    assert np.all(np.diff(sim.hit_rates) <= 0) and sim.floor < 0.15
    with pytest.raises(BasinInputError, match="unknown hit curve"):
        named_curve("nonsense")
