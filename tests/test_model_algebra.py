"""The fluid model's algebra: bounds, smooth minimum, equilibria and their
stability, the band, the drain time and the two resource classifications."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from basin.errors import BasinInputError
from basin.model.dynamics import integrate
from basin.model.equilibria import (
    departure_peak,
    drain_time_min,
    equilibria,
    low_reuse_rate,
    stable_and_unstable,
    vulnerable_band,
)
from basin.model.resources import classify_limit, resource_condition
from basin.model.throughput import smooth_min
from basin.workload.arrivals import PoissonSchedule
from test_model_support import make_model

bound = st.one_of(st.floats(0.0, 1e6, allow_nan=False), st.just(math.inf))


@settings(max_examples=200, deadline=None)
@given(st.lists(bound, min_size=1, max_size=4), st.floats(0.5, 64.0))
def test_smooth_min_never_exceeds_any_bound(bounds: list[float], p: float) -> None:
    x = float(smooth_min([np.array(b) for b in bounds], p))
    assert x <= min(bounds) + 1e-12 * max(1.0, min(bounds))
    finite = [b for b in bounds if math.isfinite(b)]
    if finite and min(finite) > 0:
        # ... and it is within the p-norm's worst case below the smallest.
        assert x >= min(finite) * len(finite) ** (-1.0 / p) * (1 - 1e-9)
    if 0.0 in bounds:
        assert x == 0.0


def test_smooth_min_sharpens_with_p() -> None:
    a, b = np.array(1.0), np.array(1.0)
    assert float(smooth_min([a, b], 8.0)) == pytest.approx(2 ** (-1 / 8))
    assert float(smooth_min([a, b], 64.0)) > float(smooth_min([a, b], 8.0))
    with pytest.raises(BasinInputError, match="sharpness"):
        smooth_min([a], 0.0)


def test_throughput_is_below_every_bound() -> None:
    m = make_model()
    n = np.linspace(0, 300, 301)
    x = m.throughput(n)
    assert np.all(x <= m.closed_loop_bound(n) + 1e-12)
    assert np.all(x <= m.prefill_bound(n) + 1e-12)
    assert np.all(x <= m.decode_bound() + 1e-12)


def test_closed_loop_solves_its_fixed_point_and_tends_to_the_papers_form() -> None:
    m = make_model()
    p = m.params
    n = np.array([0.01, 5.0, 40.0, 120.0])
    x = m.closed_loop_bound(n)
    # X (g + L0 + m s1 B) = N with B = X m (s0 + s1) / (1 - X m s1) (one decode instance).
    ms1 = p.decode_steps * p.decode_step_per_request_s
    b = x * p.decode_steps * (p.decode_step_base_s + p.decode_step_per_request_s) / (1 - x * ms1)
    np.testing.assert_allclose(x * (p.tool_gap_s + p.unloaded_call_s + ms1 * b), n, rtol=1e-9)
    paper = n / (p.tool_gap_s + p.unloaded_call_s)
    assert np.all(x <= paper)
    assert x[0] == pytest.approx(paper[0], rel=1e-3)   # N -> 0: the paper's N / (g + L0)


def test_peak_and_low_reuse_rate() -> None:
    m = make_model()
    peak = departure_peak(m)
    n = np.linspace(0, m.n_scale(), 5000)
    assert peak.d_star_per_min >= float(np.max(m.departures_per_min(n))) - 1e-9
    d_low = low_reuse_rate(m)
    assert d_low < peak.d_star_per_min
    assert float(m.departures_per_min(1e6)) == pytest.approx(d_low, rel=1e-6)
    assert vulnerable_band(m) == (d_low, peak.d_star_per_min)


@pytest.mark.parametrize("rate", [2.5, 3.3, 4.5])
def test_equilibria_are_zeros_with_the_right_stability(rate: float) -> None:
    m = make_model()
    eqs = equilibria(m, rate)
    assert len(eqs) == 2
    for e in eqs:
        assert float(m.departures_per_min(e.n)) == pytest.approx(rate, abs=1e-7)
        # Stability is the sign of D'(N): one more session, more departures than arrivals.
        assert e.stable == (float(m.departures_per_min(e.n * 1.001)) > rate)
    ns, nu = stable_and_unstable(m, rate)
    assert ns == eqs[0].n and nu == eqs[1].n
    assert ns < departure_peak(m).n_star < nu


def test_stability_holds_under_integration() -> None:
    m = make_model()
    rate = 3.3
    ns, nu = stable_and_unstable(m, rate)
    flat = PoissonSchedule(rate)
    below = integrate(m, flat, 240.0, nu * 0.97)
    above = integrate(m, flat, 240.0, nu * 1.03)
    assert below.outcome == "recovers" and below.n[-1] == pytest.approx(ns, rel=0.02)
    assert above.outcome == "trapped" and above.n[-1] > 2 * nu


def test_rates_outside_the_band() -> None:
    m = make_model()
    d_low, d_star = vulnerable_band(m)
    ns, nu = stable_and_unstable(m, 0.5 * d_low)
    assert ns is not None and nu is None          # below D_low: any population drains
    assert stable_and_unstable(m, 1.05 * d_star) == (None, None)   # above the peak: overload
    assert integrate(m, PoissonSchedule(1.05 * d_star), 120.0, 10.0).outcome == "overloaded"
    with pytest.raises(BasinInputError, match="rate"):
        equilibria(m, -1.0)


def test_drain_time_is_backlog_over_surplus() -> None:
    m = make_model()
    d_star = departure_peak(m).d_star_per_min
    assert drain_time_min(m, 30.0, 3.3) == pytest.approx(30.0 / (d_star - 3.3))
    assert drain_time_min(m, 0.0, 3.3) == 0.0
    assert drain_time_min(m, 30.0, d_star + 1) == math.inf


def test_resource_condition_is_eq_2() -> None:
    m = make_model()
    p = m.params
    cond = resource_condition(m)
    assert cond.n_cliff == pytest.approx(p.knee_ratio * p.cache_tokens / p.mean_context_tokens)
    assert cond.n_decode == pytest.approx(p.decode_kv_tokens / (p.fraction_in_service * p.mean_context_tokens))
    assert cond.cache_first == (p.cache_tokens < p.decode_kv_tokens / (p.knee_ratio * p.fraction_in_service))
    assert cond.cache_first
    big_cache = resource_condition(make_model(cache_tokens=40 * 1.09e6))
    assert not big_cache.cache_first


def test_throughput_classification_moves_with_memory_and_cache() -> None:
    base = classify_limit(make_model())
    assert base.first_limit == "cache" and base.ratio < 1
    # Forty times the cache pushes the cliff past decode saturation.
    assert classify_limit(make_model(cache_tokens=40 * 1.09e6)).first_limit == "decode"
    # Three decode instances triple the decode bound: the cache stays first.
    three = classify_limit(make_model(decode_instances=3, decode_kv_tokens=3 * 1.66e6))
    assert three.ratio < base.ratio
    # The tolerance widens the flagged side by exactly its size.
    c = classify_limit(make_model(cache_tokens=2.18e6))
    assert classify_limit(make_model(cache_tokens=2.18e6), tolerance=c.ratio).first_limit == "cache"
    assert classify_limit(make_model(cache_tokens=2.18e6), tolerance=max(c.ratio - 1.001, 0)).first_limit == (
        "decode" if c.ratio > 1.001 else "cache")
