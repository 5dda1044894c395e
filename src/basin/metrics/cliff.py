"""The cache cliff: hit rate against working set / cache capacity (paper Fig. 6b).

Each point is one 2-minute window of a run's timeseries (the paper's window):
its x is the mean working set over the window divided by the mean prefix-cache
capacity, its y the hit rate of the prefills finished in the window. A ratio
of means, not a mean of ratios, keeps a minute with a momentarily shrunken
capacity from dominating. Windows without a finished prefill have no hit rate
and are dropped, as is a partial window at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from basin.metrics._tables import Table, bin_counts, binned_median, binned_sum, floats, require_columns
from basin.metrics.hitrate import binned_hit_rate


@dataclass(frozen=True, slots=True)
class CliffPoints:
    """One point per window: where it started and what it saw."""

    start_min: np.ndarray
    #: Mean working set over mean cache capacity (dimensionless; 1.0 = the cache is full).
    working_set_ratio: np.ndarray
    hit_rate: np.ndarray


def cache_cliff_points(timeseries: Table, *, window_min: int = 2) -> CliffPoints:
    """Cliff points of one run from its per-minute timeseries."""
    require_columns(timeseries, "timeseries", ("minute", "working_set_tokens", "cache_capacity_tokens"))
    minute = floats(timeseries, "minute")
    if minute.size == 0:
        empty = np.zeros(0)
        return CliffPoints(empty, empty, empty)
    n_windows = int((np.nanmax(minute) + 1) // window_min)
    edges = np.arange(n_windows + 1, dtype=np.float64) * window_min
    n_minutes = bin_counts(minute, edges)
    working_set = binned_sum(minute, floats(timeseries, "working_set_tokens"), edges)
    capacity = binned_sum(minute, floats(timeseries, "cache_capacity_tokens"), edges)
    hit = binned_hit_rate(timeseries, edges)
    x = np.full(n_windows, np.nan)
    # Both sums cover the same minutes, so their quotient is the ratio of the means.
    np.divide(working_set, capacity, out=x, where=capacity > 0)
    keep = np.isfinite(x) & np.isfinite(hit) & (n_minutes == window_min)
    return CliffPoints(start_min=edges[:-1][keep], working_set_ratio=x[keep], hit_rate=hit[keep])


def cliff_median_curve(points: CliffPoints, *, bin_width: float = 0.1,
                       min_points: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Median hit rate in bins of the working-set ratio: the line drawn through the scatter.

    Returns ``(bin_centre, median_hit_rate)`` for bins holding at least
    ``min_points`` points; sparser bins are dropped rather than drawn as noise.
    """
    x = points.working_set_ratio
    if x.size == 0:
        return np.zeros(0), np.zeros(0)
    n_bins = int(np.ceil(np.max(x) / bin_width + 1e-9)) + 1
    edges = np.arange(n_bins + 1, dtype=np.float64) * bin_width
    medians, counts = binned_median(x, points.hit_rate, edges)
    keep = counts >= min_points
    return (edges[:-1] + bin_width / 2)[keep], medians[keep]
