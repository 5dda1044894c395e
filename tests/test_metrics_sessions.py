"""Session outcomes and goodput on hand-made sessions tables."""

from __future__ import annotations

import numpy as np
import pytest

from basin.errors import BasinInputError
from basin.metrics import GoodputRule, session_metrics, session_outcomes
from test_metrics_builders import NAN, make_calls, make_sessions

MEASURE_END_S = 5400.0  # 90 minutes
RUN_END_S = 7200.0


def _good(arrival_s: float, **extra: object) -> dict[str, object]:
    """A session that completes with slowdown 2 (1200 s against a 600 s reference)."""
    return {"arrival_s": arrival_s, "finished_s": arrival_s + 1200.0, **extra}


def test_goodput_counts_good_measured_sessions_per_hour_of_window() -> None:
    sessions = make_sessions([
        _good(100.0),                                                     # good
        _good(200.0, finished_s=200.0 + 2400.0),                          # slowdown exactly 4: good
        _good(300.0, finished_s=300.0 + 2401.0),                          # slowdown > 4: completed, not good
        _good(400.0, itl_violations=50),                                  # 5.0% of steps late: good
        _good(500.0, itl_violations=51),                                  # 5.1% late: not good
        _good(600.0, finished_s=NAN),                                     # still running at the end
        {"arrival_s": 700.0, "first_admitted_s": NAN, "shed": True},      # shed: failed
        _good(800.0, warm=True, tag="warm"),                              # warm: not counted at all
        _good(MEASURE_END_S - 0.1),                                       # last measured arrival: good
        _good(MEASURE_END_S),                                             # outside the window
        _good(-10.0),                                                     # before the window
    ])
    sm = session_metrics(sessions, make_calls([]), measure_end_s=MEASURE_END_S, run_end_s=RUN_END_S)
    assert sm.n_measured == 8
    assert sm.n_good == 4
    assert sm.n_completed == 6
    assert sm.n_shed == 1
    assert sm.goodput_per_h == pytest.approx(4 / 1.5)
    assert sm.completed_fraction == pytest.approx(6 / 8)
    assert sm.shed_fraction == pytest.approx(1 / 8)
    # Sessions with decode steps: all 8 measured; one violates the allowance.
    assert sm.itl_violating_share == pytest.approx(1 / 8)


def test_goodput_matches_the_papers_healthy_scale() -> None:
    # 3.3 arrivals/min over 90 min = 297 arrivals; 207 good ones are 138 sessions/h (paper, section 3.2).
    arrivals = np.arange(297) * (5400.0 / 297)
    rows = [_good(a) if i < 207 else _good(a, finished_s=a + 5000.0) for i, a in enumerate(arrivals)]
    sm = session_metrics(make_sessions(rows), make_calls([]), measure_end_s=MEASURE_END_S, run_end_s=RUN_END_S)
    assert sm.goodput_per_h == pytest.approx(138.0)


def test_slowdown_includes_the_first_call_wait() -> None:
    # Waited 1000 s, then ran 1500 s: elapsed 2500 s over a 600 s reference = 4.17 > 4, not good,
    # although the time after admission alone (2.5) would be.
    sessions = make_sessions([{"arrival_s": 0.0, "first_admitted_s": 1000.0, "finished_s": 2500.0}])
    out = session_outcomes(sessions, measure_end_s=MEASURE_END_S, run_end_s=RUN_END_S)
    assert out.slowdown[0] == pytest.approx(2500.0 / 600.0)
    assert not out.good[0]
    assert out.first_call_wait_s[0] == pytest.approx(1000.0)


def test_slowdown_is_nan_for_incomplete_and_shed_sessions() -> None:
    sessions = make_sessions([
        {"arrival_s": 0.0, "finished_s": NAN},
        {"arrival_s": 0.0, "first_admitted_s": NAN, "finished_s": 50.0, "shed": True},
    ])
    out = session_outcomes(sessions, measure_end_s=MEASURE_END_S, run_end_s=RUN_END_S)
    assert np.isnan(out.slowdown).all()
    assert not out.completed.any()


def test_rule_thresholds_are_parameters() -> None:
    sessions = make_sessions([_good(0.0, finished_s=1800.0)])  # slowdown 3
    strict = GoodputRule(max_slowdown=2.5)
    assert session_outcomes(sessions, measure_end_s=MEASURE_END_S, run_end_s=RUN_END_S).good[0]
    assert not session_outcomes(sessions, measure_end_s=MEASURE_END_S, run_end_s=RUN_END_S, rule=strict).good[0]


def test_waits_censor_sessions_never_admitted_and_skip_shed_ones() -> None:
    sessions = make_sessions([
        {"arrival_s": 0.0, "first_admitted_s": 10.0, "finished_s": 600.0},
        {"arrival_s": 0.0, "first_admitted_s": 30.0, "finished_s": 600.0},
        {"arrival_s": 1200.0, "first_admitted_s": NAN},                 # parked until the end: waited 6000 s
        {"arrival_s": 1200.0, "first_admitted_s": NAN, "shed": True},   # shed: no wait
    ])
    sm = session_metrics(sessions, make_calls([]), measure_end_s=MEASURE_END_S, run_end_s=RUN_END_S)
    waits = np.array([10.0, 30.0, 6000.0])
    assert sm.first_call_wait_p50_s == pytest.approx(np.percentile(waits, 50))
    assert sm.first_call_wait_p90_s == pytest.approx(np.percentile(waits, 90))


def test_slowdown_and_ttft_percentiles_cover_measured_sessions_only() -> None:
    sessions = make_sessions([
        _good(0.0, session_uid=1, finished_s=600.0),     # slowdown 1
        _good(0.0, session_uid=2, finished_s=1800.0),    # slowdown 3
        _good(0.0, session_uid=3, warm=True, finished_s=6000.0),
    ])
    calls = make_calls([
        {"session_uid": 1, "admitted_s": 0.0, "first_token_s": 0.5},
        {"session_uid": 2, "admitted_s": 10.0, "first_token_s": 11.5},
        {"session_uid": 3, "admitted_s": 0.0, "first_token_s": 100.0},  # warm: excluded
    ])
    sm = session_metrics(sessions, calls, measure_end_s=MEASURE_END_S, run_end_s=RUN_END_S)
    assert sm.slowdown_p50 == pytest.approx(2.0)
    assert sm.slowdown_p90 == pytest.approx(np.percentile([1.0, 3.0], 90))
    assert sm.ttft_p50_s == pytest.approx(1.0)
    assert sm.ttft_p90_s == pytest.approx(np.percentile([0.5, 1.5], 90))


def test_empty_window_gives_nan_rates_not_zero() -> None:
    sm = session_metrics(make_sessions([_good(6000.0)]), make_calls([]), measure_end_s=MEASURE_END_S,
                         run_end_s=RUN_END_S)
    assert sm.n_measured == 0
    assert sm.goodput_per_h == 0.0
    assert np.isnan(sm.completed_fraction) and np.isnan(sm.slowdown_p50)


def test_completed_session_without_reference_is_an_error() -> None:
    sessions = make_sessions([_good(0.0, session_uid=42, reference_s=0.0)])
    with pytest.raises(BasinInputError, match=r"reference_s.*\[42\]"):
        session_outcomes(sessions, measure_end_s=MEASURE_END_S, run_end_s=RUN_END_S)
