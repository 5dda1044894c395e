"""The ablation runner relates every variant to full BASIN in the same scenario."""

from __future__ import annotations

import pytest

from basin.errors import BasinInputError
from basin.experiments.ablation import VARIANTS, run_ablation


def test_rows_are_relative_to_full_basin_in_each_scenario():
    rows = run_ablation(["trap-1p1d"], ["w/o lending", "prior"],
                        overrides=["duration_min=30", "measure_end_min=20", "surge.factor=1.0"], workers=1)
    by_variant = {r.variant: r for r in rows}
    assert set(by_variant) == {"basin", "w/o lending", "prior"}
    assert by_variant["basin"].relative_goodput == pytest.approx(1.0)
    for r in rows:
        assert r.relative_goodput == pytest.approx(r.goodput_per_h / by_variant["basin"].goodput_per_h)


def test_unknown_variant_is_refused_with_the_known_ones():
    with pytest.raises(BasinInputError, match="w/o lending"):
        run_ablation(["trap-1p1d"], ["w/o everything"])
    assert "basin" in VARIANTS
