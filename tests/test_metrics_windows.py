"""Twenty-minute windows and each degradation rule."""

from __future__ import annotations

import numpy as np
import pytest

from basin.metrics import DegradationRule, window_stats
from test_metrics_builders import NAN, make_calls, make_sessions, make_timeseries, synthetic_run


def _windows(**kwargs: object):
    calls, sessions, timeseries, duration_s = synthetic_run(**kwargs)  # type: ignore[arg-type]
    return window_stats(calls, sessions, timeseries, duration_s=duration_s)


def test_ttft_rule_fires_strictly_above_five_seconds() -> None:
    ws = _windows(ttft_s=[0.2, 5.0, 5.01], hit_rate=[0.95] * 3)
    assert [w.ttft_p50_s for w in ws] == pytest.approx([0.2, 5.0, 5.01])
    assert [w.degraded_ttft for w in ws] == [False, False, True]
    assert [w.degraded for w in ws] == [False, False, True]
    assert all(w.n_first_tokens == 200 for w in ws)


def test_wait_rule_fires_strictly_above_five_minutes() -> None:
    ws = _windows(ttft_s=[0.2] * 3, hit_rate=[0.95] * 3, wait_s=[10.0, 300.0, 301.0])
    assert [w.first_call_wait_p50_s for w in ws] == pytest.approx([10.0, 300.0, 301.0])
    assert [w.degraded_wait for w in ws] == [False, False, True]
    assert [w.degraded for w in ws] == [False, False, True]


def test_never_start_rule_fires_at_a_quarter() -> None:
    ws = _windows(ttft_s=[0.2] * 3, hit_rate=[0.95] * 3, never_start=[0.0, 0.2, 0.25])
    assert [w.never_start_fraction for w in ws] == pytest.approx([0.0, 0.2, 0.25])
    assert [w.degraded_never_start for w in ws] == [False, False, True]
    assert [w.degraded for w in ws] == [False, False, True]


def test_severity_is_the_worst_criterion_over_its_threshold() -> None:
    ws = _windows(ttft_s=[0.2, 20.0], hit_rate=[0.95] * 2, wait_s=[0.0, 600.0], never_start=[0.0, 0.5])
    assert ws[0].severity == pytest.approx(0.2 / 5.0)
    assert ws[1].severity == pytest.approx(max(20.0 / 5.0, 600.0 / 300.0, 0.5 / 0.25))


def test_windows_are_aligned_at_zero_and_a_partial_window_is_dropped() -> None:
    calls, sessions, timeseries, _ = synthetic_run(ttft_s=[0.2] * 3, hit_rate=[0.95] * 3)
    ws = window_stats(calls, sessions, timeseries, duration_s=3000.0)  # 50 min: [0,20), [20,40)
    assert [(w.start_s, w.end_s) for w in ws] == [(0.0, 1200.0), (1200.0, 2400.0)]


def test_window_hit_rate_comes_from_the_timeseries() -> None:
    ws = _windows(ttft_s=[0.2] * 2, hit_rate=[0.95, 0.3])
    assert [w.hit_rate for w in ws] == pytest.approx([0.95, 0.3])


def test_never_start_is_decided_with_a_grace_period_at_the_run_end() -> None:
    duration_s = 2400.0
    sessions = make_sessions([
        {"arrival_s": 1300.0, "finished_s": 1900.0},                    # started
        {"arrival_s": 1400.0, "first_admitted_s": NAN},                 # waited 1000 s: never started
        {"arrival_s": 2000.0, "first_admitted_s": NAN},                 # waited 400 s: never started
        {"arrival_s": 2200.0, "first_admitted_s": NAN},                 # waited 200 s: undetermined
        {"arrival_s": 2300.0, "first_admitted_s": NAN, "shed": True},   # shed: never started
        {"arrival_s": 1500.0, "warm": True, "first_admitted_s": NAN},   # warm: not an arrival
    ])
    ws = window_stats(make_calls([]), sessions, make_timeseries(40), duration_s=duration_s)
    w = ws[1]
    assert (w.n_arrivals, w.n_determined, w.n_never_started) == (5, 4, 3)
    assert w.never_start_fraction == pytest.approx(3 / 4)
    assert w.degraded_never_start
    # Median wait over determined, non-shed arrivals: 0 s, 1000 s (censored), 400 s (censored).
    assert w.first_call_wait_p50_s == pytest.approx(400.0)
    # A longer grace leaves the 400 s waiter undetermined too.
    w_long = window_stats(make_calls([]), sessions, make_timeseries(40), duration_s=duration_s,
                          rule=DegradationRule(never_start_grace_s=600.0))[1]
    assert (w_long.n_determined, w_long.n_never_started) == (3, 2)


def test_window_without_calls_or_arrivals_is_not_degraded() -> None:
    ws = window_stats(make_calls([]), make_sessions([]), make_timeseries(20), duration_s=1200.0)
    assert len(ws) == 1
    w = ws[0]
    assert np.isnan(w.ttft_p50_s) and np.isnan(w.first_call_wait_p50_s) and np.isnan(w.never_start_fraction)
    assert not w.degraded
    assert w.severity == 0.0


def test_warm_sessions_calls_count_in_window_ttft() -> None:
    # The window describes the engine; a warm session's slow call is as slow as any other.
    calls = make_calls([{"session_uid": 0, "admitted_s": 100.0, "first_token_s": 130.0}])
    sessions = make_sessions([{"warm": True, "arrival_s": 0.0}])
    ws = window_stats(calls, sessions, make_timeseries(20), duration_s=1200.0)
    assert ws[0].ttft_p50_s == pytest.approx(30.0)
    assert ws[0].n_arrivals == 0
