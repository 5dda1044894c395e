"""The smallest surge that traps a deployment at a base rate: bisection on
the surge factor of :func:`basin.model.dynamics.integrate`'s verdict.

Only a helper on top of the dynamics: the population starts at the stable
equilibrium, a surge multiplies the base rate for ``duration_min`` from
``start_min``, and the run is judged as ``integrate`` judges it (beyond the
final rate's unstable equilibrium: trapped). A larger surge carries the
population further, so the verdict is monotone in the factor and bisection
applies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from basin.errors import BasinInputError
from basin.model.dynamics import AdmissionBudget, Outcome, integrate
from basin.model.equilibria import stable_and_unstable
from basin.model.throughput import FluidModel
from basin.workload.arrivals import PoissonSchedule, Surge

#: Where a surge starts and how long the run lasts after it ends (the paper's
#: 2-hour runs with a surge from minute 15).
SURGE_START_MIN = 15.0
AFTER_SURGE_MIN = 95.0
#: The largest factor searched.
MAX_FACTOR = 50.0


@dataclass(frozen=True, slots=True)
class SmallestSurge:
    """The smallest trapping factor for one duration (None: none up to ``MAX_FACTOR``)."""

    duration_min: float
    factor: float | None
    #: Sessions the surge brings beyond the base rate: ``(factor - 1) x rate x duration``.
    extra_sessions: float | None


def surge_outcome(model: FluidModel, rate_per_min: float, factor: float, duration_min: float,
                  n0: float, budget: AdmissionBudget | None = None) -> Outcome:
    """The model's verdict on one surge from population ``n0``."""
    schedule = PoissonSchedule(rate_per_min, (Surge(SURGE_START_MIN, SURGE_START_MIN + duration_min, factor),))
    return integrate(model, schedule, SURGE_START_MIN + duration_min + AFTER_SURGE_MIN, n0, budget=budget).outcome


def smallest_trapping_surge(model: FluidModel, rate_per_min: float, duration_min: float,
                            rel_tol: float = 0.005) -> SmallestSurge:
    """The smallest factor whose ``duration_min`` surge traps the base rate.

    The run starts at the stable population ``N_s``; with none (the rate
    exceeds the departure peak) there is nothing to trap, which is an error.
    """
    if not (math.isfinite(duration_min) and duration_min > 0):
        raise BasinInputError(f"surge duration: expected minutes > 0, got {duration_min!r}")
    ns, _ = stable_and_unstable(model, rate_per_min)
    if ns is None:
        raise BasinInputError(f"rate {rate_per_min:g}/min: above the departure peak there is no stable population "
                              "for a surge to push from; give a lower --rate")

    def traps(f: float) -> bool:
        return surge_outcome(model, rate_per_min, f, duration_min, ns) == "trapped"

    if not traps(MAX_FACTOR):
        return SmallestSurge(duration_min, None, None)
    lo, hi = 1.0, MAX_FACTOR
    while hi - lo > rel_tol * hi:
        mid = math.sqrt(lo * hi) if hi / lo > 2 else 0.5 * (lo + hi)
        if traps(mid):
            hi = mid
        else:
            lo = mid
    return SmallestSurge(duration_min, hi, (hi - 1.0) * rate_per_min * duration_min)
