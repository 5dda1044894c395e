"""The columnar run tables and the small helpers every metric shares.

A run is recorded as three tables, each a ``dict[str, numpy.ndarray]`` of
equal-length 1-D columns (``calls``, ``sessions``, ``timeseries``; their
schema is :mod:`basin.runtables`, the column lists are in docs/metrics.md). NaN marks an event that did not happen. The
metrics read only the columns they need, so a producer may add columns
freely; a missing or ragged column is a :class:`basin.errors.BasinInputError`
naming the table and the column, because a silently short column would skew a
goodput figure rather than crash.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from basin.errors import BasinInputError
from basin.runtables import ACTIVE_TAG_PREFIX as ACTIVE_TAG_PREFIX
from basin.runtables import CALLS, SESSIONS, TIMESERIES
from basin.runtables import SECONDS_PER_MINUTE as SECONDS_PER_MINUTE
from basin.runtables import Table as Table

#: Columns each table must hold for the metrics (more columns are allowed);
#: the schema of every column is :mod:`basin.runtables`.
CALLS_COLUMNS: tuple[str, ...] = CALLS.required_names
SESSIONS_COLUMNS: tuple[str, ...] = SESSIONS.required_names
TIMESERIES_COLUMNS: tuple[str, ...] = TIMESERIES.required_names

SECONDS_PER_HOUR = 3600.0


def table_length(table: Table, name: str) -> int:
    """Rows of ``table``; raises if a column is not 1-D or the lengths differ."""
    length: int | None = None
    for column, values in table.items():
        arr = np.asarray(values)
        if arr.ndim != 1:
            raise BasinInputError(f"{name} table, column '{column}': expected a 1-D array, got shape {arr.shape}")
        if length is None:
            length = arr.shape[0]
        elif arr.shape[0] != length:
            raise BasinInputError(
                f"{name} table, column '{column}': has {arr.shape[0]} rows but earlier columns have {length}; "
                "every column of a table must have one value per row"
            )
    return 0 if length is None else length


def require_columns(table: Table, name: str, columns: Iterable[str]) -> int:
    """Check that ``table`` has ``columns`` and consistent lengths; return its row count."""
    missing = [c for c in columns if c not in table]
    if missing:
        raise BasinInputError(
            f"{name} table: missing column(s) {', '.join(repr(c) for c in missing)}; "
            f"the producer must write them (see docs/metrics.md)"
        )
    return table_length(table, name)


def floats(table: Table, column: str) -> np.ndarray:
    """A column as float64 (NaN kept): times and token sums are compared as floats."""
    return np.asarray(table[column], dtype=np.float64)


def bools(table: Table, column: str) -> np.ndarray:
    """A column as bool. Parquet round trips and hand-made tables both land here."""
    return np.asarray(table[column], dtype=bool)


def nan_percentile(values: np.ndarray, q: float) -> float:
    """Percentile ``q`` (0-100) of the finite entries; NaN when there are none.

    Metrics of an empty group are "not measured", not zero: a window without a
    first token has no median TTFT, and returning 0 would call it fast. Infinite
    entries count as missing too (numpy's ``nanpercentile`` would keep them).

    numpy's linear method, step for step (the same numbers; a hypothesis test
    holds it to ``numpy.percentile``): numpy's own path imports ``numpy.ma``,
    about 20 ms of every ``basin run``.
    """
    arr = np.asarray(values, dtype=np.float64)
    finite = np.sort(arr[np.isfinite(arr)])
    n = int(finite.size)
    if n == 0:
        return float("nan")
    virtual = (n - 1) * (q / 100)
    if virtual >= n - 1:  # numpy's index -1 on both sides
        lo = hi = n - 1
        gamma = virtual + 1
    elif virtual < 0:
        lo = hi = 0
        gamma = virtual
    else:
        lo = math.floor(virtual)
        hi = lo + 1
        gamma = virtual - lo
    a, b = float(finite[lo]), float(finite[hi])
    diff = b - a
    return b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma


def _binned(times: np.ndarray, values: np.ndarray, edges: np.ndarray, statistic: str) -> np.ndarray:
    """``statistic`` ("count", "sum" or "median") of ``values`` by ``times``, every bin half-open.

    Every binned metric goes through this one rule: an event exactly on an
    edge belongs to the later bin, one on or past the last edge or before the
    first to none, NaN ("did not happen") to none. Numbers are those of
    scipy's ``binned_statistic`` on the kept events (a test checks it), in
    numpy alone: importing scipy.stats costs a run more than its tables.
    """
    edges = np.asarray(edges, dtype=np.float64)
    times = np.asarray(times, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    n_bins = max(edges.size - 1, 0)
    if statistic == "median":
        out = np.full(n_bins, np.nan)
    else:
        out = np.zeros(n_bins)
    if not n_bins:
        return out
    bins = np.searchsorted(edges, times, side="right") - 1
    keep = np.isfinite(times) & (bins >= 0) & (times < edges[-1])
    if statistic == "median":
        keep &= np.isfinite(values)
    bins, values = bins[keep], values[keep]
    if not bins.size:
        return out
    if statistic == "count":
        return np.bincount(bins, minlength=n_bins).astype(np.float64)
    if statistic == "sum":
        return np.bincount(bins, weights=values, minlength=n_bins)
    # The middle of each bin's sorted values; the mean of the two middle ones
    # when a bin holds an even number.
    order = np.lexsort((values, bins))
    sorted_values = values[order]
    present, first, counts = np.unique(bins[order], return_index=True, return_counts=True)
    mid = first + (counts - 1) / 2
    out[present] = (sorted_values[np.floor(mid).astype(int)] + sorted_values[np.ceil(mid).astype(int)]) / 2
    return out


def bin_counts(times: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """How many ``times`` fall in each bin ``[edges[i], edges[i+1])``."""
    return _binned(times, times, edges, "count").astype(np.int64)


def binned_sum(times: np.ndarray, values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Sum of ``values`` whose ``times`` fall in each bin ``[edges[i], edges[i+1])``."""
    return _binned(times, values, edges, "sum")


def binned_median(times: np.ndarray, values: np.ndarray, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Median of ``values`` whose ``times`` fall in each bin ``[edges[i], edges[i+1])``.

    Returns ``(medians, counts)`` per bin; the median is NaN for an empty bin
    and entries with a non-finite value are ignored (and not counted).
    """
    finite = np.isfinite(np.asarray(values, dtype=np.float64))
    return _binned(times, values, edges, "median"), bin_counts(np.where(finite, times, np.nan), edges)


def ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``, NaN when the denominator is zero."""
    return float(numerator) / float(denominator) if denominator > 0 else float("nan")
