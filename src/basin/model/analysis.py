"""Everything ``basin model analyze`` answers about one deployment, workload
and arrival schedule, gathered in one object with a JSON form."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from basin.errors import BasinInputError
from basin.jsonvalues import json_value
from basin.model.dynamics import AdmissionBudget, Trajectory, integrate, reference_budget
from basin.model.equilibria import (
    DeparturePeak,
    Equilibrium,
    departure_peak,
    drain_time_min,
    equilibria,
    low_reuse_rate,
    stable_and_unstable,
)
from basin.model.resources import (
    DEFAULT_TOLERANCE,
    LimitClassification,
    ResourceCondition,
    classify_limit,
    resource_condition,
)
from basin.model.throughput import FluidModel
from basin.workload.arrivals import PoissonSchedule


@dataclass(frozen=True)
class Analysis:
    """The fluid model's answers (see docs/fluid-model.md for each one)."""

    model: FluidModel
    rate_per_min: float | None
    peak: DeparturePeak
    d_low_per_min: float
    equilibria: tuple[Equilibrium, ...]
    n_stable: float | None
    n_unstable: float | None
    condition: ResourceCondition
    classification: LimitClassification
    backlog_sessions: float | None
    drain_time_min: float | None
    schedule: PoissonSchedule | None
    trajectories: dict[str, Trajectory] = field(default_factory=dict)

    @property
    def band(self) -> tuple[float, float]:
        return self.d_low_per_min, self.peak.d_star_per_min

    @property
    def vulnerable(self) -> bool | None:
        """Whether the base rate lies in the vulnerable band (None without a rate)."""
        if self.rate_per_min is None:
            return None
        lo, hi = self.band
        return lo <= self.rate_per_min <= hi

    def to_dict(self) -> dict[str, Any]:
        p = self.model.params
        out: dict[str, Any] = {
            "deployment": p.deployment,
            "hardware": p.hardware,
            "workload": p.workload,
            "hit_curve": self.model.curve.label,
            "smooth_min_sharpness": self.model.sharpness,
            "parameters": p.as_dict(),
            "decode_bound_per_min": 60.0 * self.model.decode_bound() / p.calls_per_session,
            "n_star": self.peak.n_star,
            "d_star_per_min": self.peak.d_star_per_min,
            "d_low_per_min": self.d_low_per_min,
            "vulnerable_band_per_min": [self.d_low_per_min, self.peak.d_star_per_min],
            "first_limit": self.classification.first_limit,
            "classification": self.classification.to_dict(),
            "resource_condition": self.condition.to_dict(),
            "rate_per_min": self.rate_per_min,
            "vulnerable": self.vulnerable,
            "n_stable": self.n_stable,
            "n_unstable": self.n_unstable,
            "equilibria": [{"n": e.n, "stable": e.stable, "slope_per_min": e.slope_per_min}
                           for e in self.equilibria],
            "backlog_sessions": self.backlog_sessions,
            "drain_time_min": self.drain_time_min,
        }
        if self.schedule is not None:
            out["schedule"] = {
                "base_per_min": self.schedule.base_per_min,
                "surges": [{"start_min": s.start_min, "end_min": s.end_min, "factor": s.factor}
                           for s in self.schedule.surges],
                "rate_changes": [{"at_min": c.at_min, "per_min": c.per_min} for c in self.schedule.rate_changes],
            }
        out["ode"] = {name: t.summary() for name, t in self.trajectories.items()}
        return json_value(out)  # JSON has no infinity: an infinite drain time or bound becomes null


def surge_surplus(schedule: PoissonSchedule) -> float:
    """Sessions a schedule's surges add beyond its base rate."""
    total = 0.0
    for s in schedule.surges:
        total += max(s.factor - 1.0, 0.0) * schedule.base_rate_at(s.start_min * 60.0) * (s.end_min - s.start_min)
    return total


def analyze(model: FluidModel, rate_per_min: float | None = None, *, schedule: PoissonSchedule | None = None,
            duration_min: float = 120.0, n0: float | None = None, budget: AdmissionBudget | None = None,
            backlog_sessions: float | None = None, tolerance: float = DEFAULT_TOLERANCE,
            stages: int | None = None) -> Analysis:
    """The model's answers for base rate ``rate_per_min`` (the schedule's base
    rate when a schedule is given and no rate).

    With a schedule the population is integrated from ``n0`` (default: the
    stable equilibrium of the base rate) without admission and with
    ``budget`` (default: the reference budget of section 6.1). The drain time
    is for ``backlog_sessions`` (default: the schedule's surge surplus).
    ``stages`` overrides the parameters' stages of progress (1: Eq. 1 exactly).
    """
    if schedule is not None and rate_per_min is None:
        rate_per_min = schedule.base_per_min
    peak = departure_peak(model)
    d_low = low_reuse_rate(model)
    eqs: tuple[Equilibrium, ...] = ()
    ns = nu = None
    if rate_per_min is not None:
        eqs = equilibria(model, rate_per_min)
        ns, nu = stable_and_unstable(model, rate_per_min)
    if backlog_sessions is None and schedule is not None and schedule.surges:
        backlog_sessions = surge_surplus(schedule)
    drain = None
    if backlog_sessions is not None:
        if rate_per_min is None:
            raise BasinInputError("a drain time needs a base rate: give --rate (or a scenario)")
        drain = drain_time_min(model, backlog_sessions, rate_per_min)
    trajectories: dict[str, Trajectory] = {}
    if schedule is not None:
        start = n0 if n0 is not None else (ns if ns is not None else 0.0)
        trajectories["no_admission"] = integrate(model, schedule, duration_min, start, stages=stages)
        trajectories["admission"] = integrate(model, schedule, duration_min, start,
                                              budget=budget or reference_budget(model), stages=stages)
    return Analysis(model, rate_per_min, peak, d_low, eqs, ns, nu, resource_condition(model),
                    classify_limit(model, tolerance), backlog_sessions, drain, schedule, trajectories)
