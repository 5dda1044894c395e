"""Hand-made run tables for the metrics tests, and tests of the table checks.

The builders write every column of the schema the simulator produces, so the
metrics are exercised on tables of the real shape; each test then sets only
the values it is about.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from basin.errors import BasinInputError
from basin.metrics import CALLS_COLUMNS, SESSIONS_COLUMNS, TIMESERIES_COLUMNS, summarize_run
from basin.metrics._tables import bin_counts, binned_median, binned_sum, nan_percentile, require_columns

NAN = float("nan")

SESSION_DEFAULTS: dict[str, object] = {
    "tag": "base", "warm": False, "arrival_s": 0.0, "first_admitted_s": None, "finished_s": NAN,
    "shed": False, "n_calls": 10, "calls_done": 10, "reference_s": 600.0, "decode_steps": 1000,
    "itl_violations": 0,
}
CALL_DEFAULTS: dict[str, object] = {
    "tag": "base", "call_index": 0, "issued_s": 0.0, "admitted_s": 0.0, "prefill_start_s": None,
    "first_token_s": 0.2, "finished_s": None, "prompt_tokens": 1000, "cached_tokens": 900,
    "loaded_tokens": 50, "uncached_tokens": 50, "output_tokens": 100, "decode_steps": 100,
    "itl_violations": 0, "retractions": 0,
}
_STRING_COLUMNS = {"tag", "session_id"}
_BOOL_COLUMNS = {"warm", "shed"}
_INT_COLUMNS = {"session_uid", "call_index", "n_calls", "calls_done", "decode_steps", "itl_violations",
                "retractions", "prompt_tokens", "cached_tokens", "loaded_tokens", "uncached_tokens",
                "output_tokens", "minute", "arrivals", "sessions_completed", "calls_completed"}


def _column(name: str, values: list[object]) -> np.ndarray:
    if name in _STRING_COLUMNS:
        return np.array(values, dtype=object)
    if name in _BOOL_COLUMNS:
        return np.array(values, dtype=bool)
    if name in _INT_COLUMNS:
        return np.array(values, dtype=np.int64)
    return np.array(values, dtype=np.float64)


def make_sessions(rows: Sequence[dict[str, object]]) -> dict[str, np.ndarray]:
    """Sessions table; ``first_admitted_s`` defaults to the arrival, uids to the row number."""
    full = []
    for i, row in enumerate(rows):
        r = {**SESSION_DEFAULTS, "session_uid": i, **row}
        r.setdefault("session_id", f"s{r['session_uid']}")
        if r["first_admitted_s"] is None:
            r["first_admitted_s"] = r["arrival_s"]
        full.append(r)
    return {c: _column(c, [r[c] for r in full]) for c in SESSIONS_COLUMNS}


def make_calls(rows: Sequence[dict[str, object]]) -> dict[str, np.ndarray]:
    """Calls table; prefill starts at admission and the call ends 1 s after its first token."""
    full = []
    for row in rows:
        r = {"session_uid": 0, **CALL_DEFAULTS, **row}
        if r["prefill_start_s"] is None:
            r["prefill_start_s"] = r["admitted_s"]
        if r["finished_s"] is None:
            r["finished_s"] = float(r["first_token_s"]) + 1.0  # type: ignore[arg-type]
        full.append(r)
    return {c: _column(c, [r[c] for r in full]) for c in CALLS_COLUMNS}


def make_timeseries(n_minutes: int, **columns: np.ndarray | float) -> dict[str, np.ndarray]:
    """Timeseries of ``n_minutes`` rows: 1000 prompt tokens a minute, 95% hits, unless overridden."""
    base: dict[str, np.ndarray | float] = {
        "minute": np.arange(n_minutes), "arrivals": 3, "sessions_completed": 3, "calls_completed": 100,
        "active_sessions": 40.0, "active_base": 40.0, "parked_sessions": 0.0, "working_set_tokens": 5e5,
        "cache_capacity_tokens": 1e6, "prompt_tokens": 1000, "cached_tokens": 900, "loaded_tokens": 50,
        "uncached_tokens": 50, "ttft_p50_s": 0.2, "decode_kv_decoding_tokens": 4e5,
        "decode_kv_reserved_idle_tokens": 1e5, "decode_kv_capacity_tokens": 1e6, "prefill_queue_len": 0.0,
        "decode_wait_len": 0.0, "first_call_wait_p50_s": 0.0,
    }
    base.update(columns)
    out = {}
    for name, value in base.items():
        arr = np.broadcast_to(np.asarray(value), (n_minutes,)).copy()
        out[name] = arr.astype(np.int64) if name in _INT_COLUMNS else arr.astype(np.float64)
    return out


def synthetic_run(*, ttft_s: Sequence[float], hit_rate: Sequence[float],
                  wait_s: Sequence[float] | None = None, never_start: Sequence[float] | None = None,
                  calls_per_min: int = 10, arrivals_per_window: int = 20,
                  ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray], float]:
    """A run whose 20-minute windows have the given median TTFT, hit rate, wait and never-start share.

    Returns ``(calls, sessions, timeseries, duration_s)``. Calls have first
    tokens spread over every minute, all with the window's TTFT. Sessions
    arrive evenly through each window (before its last 5 min, so none is
    undetermined), wait the window's first-call wait, and the window's
    never-start share of them is shed.
    """
    n = len(ttft_s)
    assert len(hit_rate) == n
    wait_s = wait_s if wait_s is not None else [0.0] * n
    never_start = never_start if never_start is not None else [0.0] * n
    duration_s = n * 1200.0

    first_token = (np.arange(n * 20 * calls_per_min) + 0.5) * 60.0 / calls_per_min
    window = (first_token // 1200).astype(int)
    ttft = np.asarray(ttft_s, dtype=float)[window]
    calls = make_calls([{"session_uid": 0, "admitted_s": t - d, "issued_s": t - d, "first_token_s": t}
                        for t, d in zip(first_token, ttft, strict=True)])

    rows: list[dict[str, object]] = []
    for w in range(n):
        n_never = int(round(never_start[w] * arrivals_per_window))
        for k in range(arrivals_per_window):
            arrival = w * 1200.0 + k * 900.0 / arrivals_per_window
            if k < n_never:
                rows.append({"arrival_s": arrival, "first_admitted_s": NAN, "shed": True})
            else:
                rows.append({"arrival_s": arrival, "first_admitted_s": arrival + wait_s[w],
                             "finished_s": arrival + wait_s[w] + 600.0})
    sessions = make_sessions(rows)

    minute_hit = np.repeat(np.asarray(hit_rate, dtype=float), 20)
    timeseries = make_timeseries(n * 20, cached_tokens=np.round(minute_hit * 1000), loaded_tokens=0,
                                 uncached_tokens=np.round((1 - minute_hit) * 1000))
    return calls, sessions, timeseries, duration_s


# --- tests of the shared table helpers ---------------------------------------------------------


def test_builders_write_the_full_schema() -> None:
    assert set(make_sessions([{}])) == set(SESSIONS_COLUMNS)
    assert set(make_calls([{}])) == set(CALLS_COLUMNS)
    assert set(TIMESERIES_COLUMNS) <= set(make_timeseries(3))


def test_missing_column_is_named() -> None:
    calls, sessions, timeseries, duration_s = synthetic_run(ttft_s=[0.2] * 2, hit_rate=[0.95] * 2)
    del sessions["reference_s"]
    with pytest.raises(BasinInputError, match="sessions table: missing column.*'reference_s'"):
        summarize_run(calls, sessions, timeseries, system="x", trigger_s=None, duration_s=duration_s,
                      measure_end_s=1800.0)


def test_ragged_columns_are_rejected() -> None:
    table = {"a": np.zeros(3), "b": np.zeros(4)}
    with pytest.raises(BasinInputError, match="column 'b': has 4 rows but earlier columns have 3"):
        require_columns(table, "calls", ("a", "b"))


def test_binned_median_groups_by_half_open_bins() -> None:
    times = np.array([0.0, 0.5, 0.99, 1.0, 1.5, 2.0, np.nan, 3.0])
    values = np.array([5.0, 1.0, 3.0, 10.0, 20.0, 7.0, 99.0, 1.0])
    medians, counts = binned_median(times, values, np.array([0.0, 1.0, 2.0, 3.0]))
    # Bin [0,1): {5,1,3} -> 3; [1,2): {10,20} -> 15; [2,3): {7} -> 7; 3.0 lies outside, NaN time ignored.
    np.testing.assert_array_equal(counts, [3, 2, 1])
    np.testing.assert_allclose(medians, [3.0, 15.0, 7.0])


def test_the_last_bin_stays_half_open_and_empty_input_gives_empty_bins() -> None:
    # scipy's binned_statistic would count 2.0 (the last edge) in the last bin.
    edges = np.array([0.0, 1.0, 2.0])
    np.testing.assert_array_equal(bin_counts(np.array([0.0, 1.0, 2.0, 2.0 + 1e-12]), edges), [1, 1])
    np.testing.assert_array_equal(binned_sum(np.array([1.5, 2.0]), np.array([3.0, 4.0]), edges), [0.0, 3.0])
    medians, counts = binned_median(np.array([np.nan]), np.array([1.0]), edges)
    np.testing.assert_array_equal(medians, [np.nan, np.nan])
    np.testing.assert_array_equal(counts, [0, 0])


def test_nan_percentile_ignores_missing_and_infinite_entries() -> None:
    assert nan_percentile(np.array([1.0, np.nan, 3.0, np.inf]), 50) == 2.0
    assert np.isnan(nan_percentile(np.array([np.nan, np.inf]), 50))


def test_binned_median_matches_numpy_on_random_data() -> None:
    rng = np.random.default_rng(7)
    times = rng.uniform(0, 10, 5000)
    values = rng.lognormal(0, 1, 5000)
    edges = np.arange(0, 11, 2.0)
    medians, counts = binned_median(times, values, edges)
    for i in range(5):
        sel = (times >= edges[i]) & (times < edges[i + 1])
        assert counts[i] == sel.sum()
        assert medians[i] == pytest.approx(np.median(values[sel]))


_EVENT_TIMES = st.one_of(st.sampled_from([-1.0, 0.0, 1.0, 2.5, 4.0, 5.0, np.nan, np.inf]),
                         st.floats(-2.0, 6.0, allow_nan=False))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_EVENT_TIMES, st.one_of(st.sampled_from([1.0, 2.0, np.nan, np.inf]),
                                                   st.floats(-1e6, 1e6, allow_nan=False))), max_size=60))
def test_binned_statistics_equal_scipys_bit_for_bit(events: list[tuple[float, float]]) -> None:
    # The binned metrics are computed in numpy; they must be scipy's binned_statistic on
    # the kept events (on or past the last edge and before the first dropped) exactly.
    from scipy.stats import binned_statistic

    times = np.array([t for t, _ in events], dtype=np.float64)
    values = np.array([v for _, v in events], dtype=np.float64)
    edges = np.array([0.0, 1.0, 2.5, 4.0, 5.0])
    keep = np.isfinite(times) & (times >= edges[0]) & (times < edges[-1])
    for statistic, ours in (("count", bin_counts(times, edges).astype(np.float64)),
                            ("sum", binned_sum(times, values, edges)),
                            ("median", binned_median(times, values, edges)[0])):
        sel = keep & np.isfinite(values) if statistic == "median" else keep
        expected = (binned_statistic(times[sel], values[sel], statistic, bins=edges).statistic if sel.any()
                    else np.full(4, np.nan if statistic == "median" else 0.0))
        np.testing.assert_array_equal(ours, expected, err_msg=statistic)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from([0.0, 1.0, 1e300, -1e300, np.nan, np.inf, -np.inf]),
                          st.floats(allow_nan=False, allow_infinity=False)), max_size=40),
       st.one_of(st.sampled_from([0.0, 50.0, 90.0, 99.0, 100.0]), st.floats(0.0, 100.0)))
def test_percentile_is_numpys_on_the_finite_values(values: list[float], q: float) -> None:
    # nan_percentile follows numpy's linear method by hand (numpy's path imports numpy.ma);
    # it must give numpy's numbers, overflow to infinity included.
    arr = np.array(values, dtype=np.float64)
    finite = arr[np.isfinite(arr)]
    got = nan_percentile(arr, q)
    if finite.size == 0:
        assert np.isnan(got)
        return
    with np.errstate(over="ignore", invalid="ignore"):
        want = float(np.percentile(finite, q))
    assert got == want or (np.isnan(got) and np.isnan(want))
