"""Cache-cliff points from a timeseries."""

from __future__ import annotations

import numpy as np

from basin.metrics import cache_cliff_points, cliff_median_curve
from basin.metrics.cliff import CliffPoints
from test_metrics_builders import make_timeseries


def test_two_minute_points_use_ratios_of_sums() -> None:
    ts = make_timeseries(
        5,
        working_set_tokens=np.array([1e6, 3e6, 2e6, 2e6, 9e9]),
        cache_capacity_tokens=np.array([1e6, 1e6, 1e6, 1e6, 1e6]),
        prompt_tokens=np.array([1000, 3000, 0, 0, 1000]),
        cached_tokens=np.array([900, 600, 0, 0, 0]),
        loaded_tokens=0,
    )
    pts = cache_cliff_points(ts)
    # [0,2): ws 2.0, hit 1500/4000; [2,4): no prefill -> dropped; minute 4 is a partial window -> dropped.
    np.testing.assert_allclose(pts.start_min, [0.0])
    np.testing.assert_allclose(pts.working_set_ratio, [2.0])
    np.testing.assert_allclose(pts.hit_rate, [0.375])


def test_median_curve_drops_sparse_bins() -> None:
    x = np.array([0.51, 0.52, 0.55, 1.91, 1.95, 1.99, 1.93, 3.0])
    y = np.array([0.95, 0.96, 0.94, 0.3, 0.35, 0.25, 0.4, 0.1])
    centres, medians = cliff_median_curve(CliffPoints(np.arange(8.0), x, y))
    np.testing.assert_allclose(centres, [0.55, 1.95])
    np.testing.assert_allclose(medians, [0.95, 0.325])
    assert cliff_median_curve(CliffPoints(np.zeros(0), np.zeros(0), np.zeros(0)))[0].size == 0


def test_empty_timeseries_gives_no_points() -> None:
    assert cache_cliff_points(make_timeseries(0)).hit_rate.size == 0
    assert cache_cliff_points(make_timeseries(3)).hit_rate.size == 1  # minute 2 is a partial window
