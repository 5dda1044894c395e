"""summarize_run at the scale of a real run, and its invariants."""

from __future__ import annotations

import time

import numpy as np
import pytest

from basin.errors import BasinInputError
from basin.metrics import RunState, summarize_run
from basin.metrics.sessions import SESSION_FIGURES, SessionFigures, session_metrics
from test_metrics_builders import make_timeseries

N_SESSIONS = 2000
N_CALLS = 60_000
DURATION_S = 7200.0


def _random_run(seed: int):
    rng = np.random.default_rng(seed)
    uid = np.arange(N_SESSIONS)
    arrival = np.sort(rng.uniform(-600, DURATION_S, N_SESSIONS))
    warm = arrival < 0
    arrival[warm] = 0.0
    wait = rng.exponential(20.0, N_SESSIONS)
    admitted = np.where(rng.random(N_SESSIONS) < 0.97, arrival + wait, np.nan)
    admitted[warm] = 0.0
    shed = np.isnan(admitted) & (rng.random(N_SESSIONS) < 0.5)
    reference = rng.uniform(300, 1200, N_SESSIONS)
    finished = admitted + reference * rng.uniform(0.9, 6.0, N_SESSIONS)
    finished[(finished > DURATION_S) | shed] = np.nan
    steps = rng.integers(100, 5000, N_SESSIONS)
    sessions = {
        "session_uid": uid, "session_id": np.array([f"s{i}" for i in uid], dtype=object),
        "tag": np.where(warm, "warm", "base").astype(object), "warm": warm, "arrival_s": arrival,
        "first_admitted_s": admitted, "finished_s": finished, "shed": shed,
        "n_calls": np.full(N_SESSIONS, 30), "calls_done": np.full(N_SESSIONS, 30), "reference_s": reference,
        "decode_steps": steps, "itl_violations": rng.binomial(steps, 0.03),
    }
    call_uid = rng.integers(0, N_SESSIONS, N_CALLS)
    issued = rng.uniform(0, DURATION_S, N_CALLS)
    ttft = rng.lognormal(0.0, 1.5, N_CALLS)
    prompt = rng.integers(1000, 80_000, N_CALLS)
    cached = (prompt * rng.uniform(0.2, 1.0, N_CALLS)).astype(np.int64)
    calls = {
        "session_uid": call_uid, "tag": np.full(N_CALLS, "base", dtype=object),
        "call_index": rng.integers(0, 30, N_CALLS), "issued_s": issued, "admitted_s": issued,
        "prefill_start_s": issued + ttft / 2, "first_token_s": issued + ttft, "finished_s": issued + ttft + 3.0,
        "prompt_tokens": prompt, "cached_tokens": cached, "loaded_tokens": np.zeros(N_CALLS, np.int64),
        "uncached_tokens": prompt - cached, "output_tokens": np.full(N_CALLS, 160),
        "decode_steps": np.full(N_CALLS, 160), "itl_violations": np.zeros(N_CALLS, np.int64),
        "retractions": np.zeros(N_CALLS, np.int64),
    }
    return calls, sessions, make_timeseries(120), (uid, warm, arrival, finished, admitted, reference, shed)


def test_summary_of_a_full_size_run_is_fast_and_consistent() -> None:
    calls, sessions, timeseries, truth = _random_run(1)
    start = time.perf_counter()
    s = summarize_run(calls, sessions, timeseries, system="random", trigger_s=900.0, duration_s=DURATION_S,
                      measure_end_s=5400.0)
    assert time.perf_counter() - start < 2.0
    _, warm, arrival, finished, admitted, reference, shed = truth
    measured = ~warm & (arrival < 5400.0)
    done = measured & np.isfinite(finished)
    ok_slowdown = (finished - arrival) / reference <= 4.0
    ok_itl = sessions["itl_violations"] <= 0.05 * sessions["decode_steps"]
    assert s.n_measured == measured.sum()
    assert s.n_completed == done.sum()
    assert s.n_good == (done & ok_slowdown & ok_itl).sum()
    assert s.goodput_per_h == pytest.approx(s.n_good / 1.5)
    assert s.n_shed == (measured & shed).sum()
    assert 0 < s.n_good < s.n_completed < s.n_measured
    assert len(s.windows) == 6
    assert s.state in set(RunState) - {RunState.UNDETERMINED}
    assert s.hit_rate_final == pytest.approx(0.95)  # the timeseries, not the calls, gives hit rates
    ttft = calls["first_token_s"] - calls["admitted_s"]
    last = (calls["first_token_s"] >= 6000.0) & (calls["first_token_s"] < DURATION_S)
    assert s.windows[-1].ttft_p50_s == pytest.approx(np.median(ttft[last]))
    assert s.windows[-1].n_first_tokens == last.sum()


def test_measure_end_outside_the_run_is_rejected() -> None:
    calls, sessions, timeseries, _ = _random_run(2)
    with pytest.raises(BasinInputError, match="measure_end_s"):
        summarize_run(calls, sessions, timeseries, system="x", trigger_s=None, duration_s=DURATION_S,
                      measure_end_s=DURATION_S + 1)


def test_the_summary_is_the_session_figures_and_its_json_keeps_its_keys_in_order() -> None:
    """RunSummary extends SessionFigures (declared once, shared with
    SessionMetrics); the JSON still starts with the run's identity."""
    calls, sessions, timeseries, _ = _random_run(3)
    s = summarize_run(calls, sessions, timeseries, system="x", trigger_s=None, duration_s=DURATION_S,
                      measure_end_s=5400.0)
    sm = session_metrics(sessions, calls, measure_end_s=5400.0, run_end_s=DURATION_S)
    assert isinstance(s, SessionFigures) and isinstance(sm, SessionFigures)
    assert {name: getattr(s, name) for name in SESSION_FIGURES} == pytest.approx(sm.figures(), nan_ok=True)
    keys = list(s.to_dict())
    assert keys[:5] == ["system", "duration_s", "measure_end_s", "trigger_s", "itl_slo_s"]
    assert keys[5:5 + len(SESSION_FIGURES)] == list(SESSION_FIGURES)
    assert "measure_start_s" not in keys
