"""The vulnerability monitor as a pure estimator: observations that follow the
fluid model give the model's own answers back, a change in what is observed
moves them the way the model says, and bad settings or out-of-order ticks are
refused."""

from __future__ import annotations

import math

import pytest

from basin.errors import BasinInputError
from basin.gateway.monitor import MonitorSettings, Observation, VulnerabilityMonitor, find_smallest_surge
from basin.model import analyze, build_model
from basin.model.surge import smallest_trapping_surge


@pytest.fixture(scope="module")
def prior():
    return build_model("1p1d-h100")


def _steady(monitor: VulnerabilityMonitor, rate: float, population: float, context: float, minutes: float,
            start_min: float = 0.0, departures: float | None = None, hit: float = math.nan, step_s: float = 5.0,
            counts: tuple[float, float] = (0.0, 0.0)) -> tuple[float, float]:
    """Ticks every ``step_s`` model seconds at a fixed rate and population; returns the cumulative counts."""
    arrived, departed = counts
    scale = monitor.settings.time_scale
    t = start_min * 60.0
    while t < (start_min + minutes) * 60.0:
        t += step_s
        arrived += rate * step_s / 60.0
        departed += (rate if departures is None else departures) * step_s / 60.0
        monitor.observe(Observation(t / scale, int(arrived), int(departed), round(population),
                                    int(population * context), hit))
    return arrived, departed


def test_observations_at_the_models_equilibrium_give_its_answers_back(prior):
    ref = analyze(prior, 3.3)
    monitor = VulnerabilityMonitor(prior)
    _steady(monitor, 3.3, ref.n_stable, prior.params.mean_context_tokens, 30)
    est = monitor.last
    assert est is not None and est.lifetime_fitted
    assert est.arrival_rate_per_min == pytest.approx(3.3, rel=0.05)
    assert est.tool_gap_s == pytest.approx(prior.params.tool_gap_s, rel=0.1)
    assert est.n_unstable == pytest.approx(ref.n_unstable, rel=0.03)
    assert est.n_stable == pytest.approx(ref.n_stable, rel=0.1)
    assert (est.d_low_per_min, est.d_star_per_min) == pytest.approx(ref.band, rel=0.02)
    assert est.state == "vulnerable" and not est.warning
    assert est.tipping_margin_sessions == pytest.approx(ref.n_unstable - round(ref.n_stable), rel=0.05)


def test_larger_observed_contexts_bring_the_tipping_point_closer(prior):
    ref = analyze(prior, 3.3)
    monitor = VulnerabilityMonitor(prior)
    _steady(monitor, 3.3, 20, 1.5 * prior.params.mean_context_tokens, 30)
    est = monitor.last
    assert est.mean_context_tokens == pytest.approx(1.5 * prior.params.mean_context_tokens, rel=0.01)
    assert est.n_unstable < 0.8 * ref.n_unstable


def test_a_surge_warns_by_its_rate_and_then_by_its_population(prior):
    ref = analyze(prior, 3.3)
    monitor = VulnerabilityMonitor(prior)
    counts = _steady(monitor, 3.3, ref.n_stable, prior.params.mean_context_tokens, 20)
    states = []
    t = 20.0
    for population in range(round(ref.n_stable), 70, 3):
        counts = _steady(monitor, 8.0, population, prior.params.mean_context_tokens, 1, start_min=t,
                         departures=4.0, counts=counts)
        t += 1
        states.append((population, monitor.last.state))
    overloaded = next(p for p, s in states if s == "overloaded")
    assert overloaded < ref.n_unstable  # the rate gives the warning before the population tips
    # Once the surge's rate has left the window, the population is judged against the tipping point.
    counts = _steady(monitor, 3.3, 0.85 * ref.n_unstable, prior.params.mean_context_tokens, 6, start_min=t,
                     counts=counts)
    assert monitor.last.state == "near-tipping" and monitor.last.warning
    _steady(monitor, 3.3, 1.1 * ref.n_unstable, prior.params.mean_context_tokens, 6, start_min=t + 6, counts=counts)
    assert monitor.last.state == "past-tipping"


def test_the_time_scale_turns_gateway_seconds_into_the_models(prior):
    ref = analyze(prior, 3.3)
    fast = VulnerabilityMonitor(prior, MonitorSettings(time_scale=30.0))
    _steady(fast, 3.3, ref.n_stable, prior.params.mean_context_tokens, 30)
    assert fast.last.arrival_rate_per_min == pytest.approx(3.3, rel=0.05)
    assert fast.last.n_unstable == pytest.approx(ref.n_unstable, rel=0.03)


def test_the_smallest_surge_is_the_models_own(prior):
    monitor = VulnerabilityMonitor(prior)
    assert monitor.surge_job() is None
    _steady(monitor, 3.3, analyze(prior, 3.3).n_stable, prior.params.mean_context_tokens, 20)
    model, rate, minutes = monitor.surge_job()
    surge = find_smallest_surge(model, rate, minutes)
    assert surge == smallest_trapping_surge(model, rate, 10.0)
    assert surge.factor == pytest.approx(smallest_trapping_surge(prior, 3.3, 10.0).factor, rel=0.08)
    monitor.surge_found(surge, 1200.0)
    assert monitor.surge is surge and monitor.surge_at_s == 1200.0
    assert find_smallest_surge(model, 50.0, 10.0) is None  # above the peak: nothing stable to push from
    assert find_smallest_surge(model, 0.0, 10.0) is None


def test_warming_up_until_a_rate_can_be_measured(prior):
    monitor = VulnerabilityMonitor(prior)
    est = monitor.observe(Observation(0.0, 0, 0, 0, 0, math.nan))
    assert est.state == "warming-up" and math.isnan(est.n_unstable)
    _steady(monitor, 0.0, 0, 0, 10)
    assert monitor.last.state == "idle"


def test_bad_settings_and_out_of_order_ticks_are_refused(prior):
    with pytest.raises(BasinInputError, match="'time_scale'"):
        MonitorSettings(time_scale=0)
    with pytest.raises(BasinInputError, match="'near_fraction'"):
        MonitorSettings(near_fraction=1.5)
    monitor = VulnerabilityMonitor(prior)
    monitor.observe(Observation(10.0, 0, 0, 0, 0, math.nan))
    with pytest.raises(BasinInputError, match="time order"):
        monitor.observe(Observation(5.0, 0, 0, 0, 0, math.nan))
