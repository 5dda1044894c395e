"""The population ODE: surges, admission, stages of progress, verdicts."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from basin.errors import BasinInputError
from basin.model.dynamics import AdmissionBudget, integrate, reference_budget
from basin.model.equilibria import stable_and_unstable
from basin.model.throughput import FluidModel
from basin.workload.arrivals import PoissonSchedule, Surge
from test_model_support import make_model


def _surge(factor: float, base: float = 3.3) -> PoissonSchedule:
    return PoissonSchedule(base, surges=(Surge(15.0, 25.0, factor),))


def test_small_surge_recovers_large_surge_traps() -> None:
    m = make_model()
    ns, nu = stable_and_unstable(m, 3.3)
    small = integrate(m, _surge(1.2), 150.0, ns)
    big = integrate(m, _surge(4.0), 150.0, ns)
    assert small.outcome == "recovers" and small.peak_n < nu
    assert small.n[-1] == pytest.approx(ns, rel=0.02)
    assert big.outcome == "trapped" and big.n[-1] > nu


def test_admission_holds_the_population_at_the_budget_and_drains_the_queue() -> None:
    m = make_model()
    ns, nu = stable_and_unstable(m, 3.3)
    budget = reference_budget(m)
    n_b = budget.tokens / m.params.mean_context_tokens
    assert ns < n_b < nu        # the default budget sits between the equilibria here
    t = integrate(m, _surge(4.0), 150.0, ns, budget=budget)
    assert t.peak_n <= n_b + 0.5
    assert t.q.max() > 10       # the surge waits outside
    assert t.outcome == "recovers" and t.q[-1] < 1.0


def test_queue_and_population_account_for_every_session() -> None:
    m = make_model()
    t = integrate(m, _surge(4.0), 120.0, 20.0, budget=reference_budget(m))
    # d(N + Q)/dt = lambda - departures: integrate both sides on the output grid.
    lhs = (t.n[-1] + t.q[-1]) - (t.n[0] + t.q[0])
    rhs = np.trapezoid(t.rate_per_min - t.departures_per_min, t.t_min)
    assert lhs == pytest.approx(rhs, rel=0.02, abs=0.5)


def test_one_stage_is_the_papers_equation() -> None:
    m = make_model()
    one = integrate(m, _surge(2.0), 60.0, 30.0, stages=1)
    # Eq. 1: departures are exactly D(N).
    np.testing.assert_allclose(one.departures_per_min, m.departures_per_min(one.n), rtol=1e-9)
    # More stages: the same steady state, a lagging transient (a larger population after the surge).
    two = integrate(m, _surge(2.0), 60.0, 30.0, stages=2)
    i = int(np.searchsorted(one.t_min, 25.0))
    assert two.n[i] > one.n[i]
    flat_one = integrate(m, PoissonSchedule(3.3), 300.0, 40.0, stages=1)
    flat_three = integrate(m, PoissonSchedule(3.3), 300.0, 40.0, stages=3)
    assert flat_three.n[-1] == pytest.approx(flat_one.n[-1], rel=1e-3)


def test_stages_default_to_the_parameters() -> None:
    m = make_model()
    m3 = FluidModel(replace(m.params, progress_stages=3), m.curve)
    assert integrate(m3, PoissonSchedule(3.3), 10.0, 30.0).stages == 3


def test_bad_inputs_name_the_field() -> None:
    m = make_model()
    flat = PoissonSchedule(3.3)
    with pytest.raises(BasinInputError, match="duration"):
        integrate(m, flat, 0.0, 10.0)
    with pytest.raises(BasinInputError, match="initial population"):
        integrate(m, flat, 10.0, -1.0)
    with pytest.raises(BasinInputError, match="stages"):
        integrate(m, flat, 10.0, 1.0, stages=0)
    with pytest.raises(BasinInputError, match="budget"):
        AdmissionBudget(0.0)
    with pytest.raises(BasinInputError, match="margin"):
        reference_budget(m, margin=1.5)
