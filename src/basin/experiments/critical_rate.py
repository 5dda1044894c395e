"""A deployment's steady-load limit: the highest steady base rate (Poisson
arrivals, no surge, HiCache alone) whose runs all end healthy, measured as a
check of its critical rate (the profiled peak departure rate,
:func:`basin.catalog.critical_rate`, which is the one scenarios and BASIN use).

Rates are tried on a grid from ``low`` to ``high`` in steps of ``step``,
each with every seed, as run plans over the one executor
(:func:`basin.experiments.runner.run_plans`). The limit is the last
grid rate before the first one at which any seed ends other than healthy,
so a lucky healthy run above a failing rate does not count (``basin
critical-rate``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from basin.catalog import CriticalRate, critical_rate, load_deployment, with_host_ratio
from basin.errors import BasinInputError
from basin.experiments.plan import PlanResult, RunPlan, resolve_plan
from basin.experiments.ramp import workload_spec
from basin.experiments.runner import run_plans
from basin.experiments.scenario import Scenario
from basin.metrics.windows import DegradationRule

#: The steady runs: 2 h, sessions measured until minute 90, drawn from a
#: pool of 4000 synthesised sessions.
STEADY_DURATION_MIN = 120.0
STEADY_MEASURE_END_MIN = 90.0
STEADY_SESSIONS = 4000
DEFAULT_STEP = 0.5
DEFAULT_SEEDS: tuple[int, ...] = (0, 1, 2)
HEALTHY = "healthy"


def rate_grid(low: float, high: float, step: float = DEFAULT_STEP) -> tuple[float, ...]:
    """The rates tried: ``low, low + step, ...`` up to ``high`` (rounded to 1e-3)."""
    for name, value in (("--low", low), ("--high", high), ("--step", step)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value <= 0:
            raise BasinInputError(f"{name} {value!r}: expected a positive number of sessions per minute")
    if high < low:
        raise BasinInputError(f"--low {low:g} is above --high {high:g}: give the lowest rate to try first")
    n = int(round((high - low) / step)) + 1
    return tuple(round(low + i * step, 3) for i in range(n))


def steady_scenario(deployment: str, rate: float, seed: int, *, host_ratio: float | None = None,
                    workload: str = "terminal-bench", duration_min: float = STEADY_DURATION_MIN,
                    measure_end_min: float | None = None, sessions: int | None = STEADY_SESSIONS) -> Scenario:
    """One steady run: Poisson arrivals at ``rate`` from an empty engine, no
    surge, HiCache alone (``measure_end_min`` default: three quarters of the
    run); ``sessions`` are synthesised for a synthetic preset, a real table
    or file is taken whole."""
    measure = measure_end_min if measure_end_min is not None else duration_min * STEADY_MEASURE_END_MIN \
        / STEADY_DURATION_MIN
    return Scenario.model_validate({
        "name": f"steady-{deployment}-{rate:g}", "description": "critical-rate steady load",
        "deployment": deployment, "host_ratio": host_ratio,
        "workload": workload_spec(workload, sessions),
        "arrivals": {"base_per_min": rate, "warm_sessions": 0},
        "surge": {"factor": 1.0}, "duration_min": duration_min, "measure_end_min": measure,
        "policy": "hicache", "seed": seed,
    })


@dataclass(frozen=True, slots=True)
class SteadyRun:
    """How one steady run ended."""

    rate_per_min: float
    seed: int
    state: str
    hit_rate: float
    ttft_p50_s: float

    @property
    def healthy(self) -> bool:
        return self.state == HEALTHY

    def to_dict(self) -> dict[str, Any]:
        return {"rate_per_min": self.rate_per_min, "seed": self.seed, "state": self.state,
                "hit_rate": self.hit_rate, "ttft_p50_s": self.ttft_p50_s}


def steady_run(plan: RunPlan, result: PlanResult) -> SteadyRun:
    """How the steady run of ``plan`` ended."""
    s = result.summary
    return SteadyRun(plan.scenario.arrivals.base_per_min or 0.0, plan.seed, s.state.value, float(s.hit_rate_final),
                     float(s.ttft_p50_final_s))


@dataclass(frozen=True)
class CriticalRateResult:
    """The grid's runs and the steady-load limit they give, beside the critical rate."""

    deployment: str
    workload: str
    host_ratio: float
    rates: tuple[float, ...]
    seeds: tuple[int, ...]
    runs: tuple[SteadyRun, ...]
    #: The highest grid rate below which every rate ended healthy (None: even the lowest failed).
    steady_limit_per_min: float | None
    duration_min: float
    #: The critical rate of this deployment as run and workload (its cliff profile's), if it has one.
    profiled: CriticalRate | None = field(default=None)

    def runs_at(self, rate: float) -> list[SteadyRun]:
        return sorted((r for r in self.runs if r.rate_per_min == rate), key=lambda r: r.seed)

    def healthy_at(self, rate: float) -> bool:
        return all(r.healthy for r in self.runs_at(rate))

    @property
    def capped(self) -> bool:
        """Every rate tried was healthy: the limit may lie above ``--high``."""
        return self.steady_limit_per_min is not None and self.steady_limit_per_min == self.rates[-1]

    def to_dict(self) -> dict[str, Any]:
        return {
            "deployment": self.deployment, "workload": self.workload, "host_ratio": self.host_ratio,
            "rates": list(self.rates), "seeds": list(self.seeds), "duration_min": self.duration_min,
            "steady_limit_per_min": self.steady_limit_per_min, "capped_by_high": self.capped,
            "per_rate": [{"rate_per_min": r, "healthy": self.healthy_at(r),
                          "runs": [x.to_dict() for x in self.runs_at(r)]} for r in self.rates],
            "critical_rate_per_min": self.profiled.per_min if self.profiled is not None else None,
            "critical_rate_origin": self.profiled.origin if self.profiled is not None else None,
        }


def critical_from_runs(rates: Sequence[float], runs: Sequence[SteadyRun]) -> float | None:
    """The last rate before the first one with a run not ending healthy."""
    critical = None
    for r in sorted(rates):
        if not all(x.healthy for x in runs if x.rate_per_min == r):
            break
        critical = r
    return critical


def find_critical_rate(deployment: str, low: float, high: float, step: float = DEFAULT_STEP, *,
                       seeds: Sequence[int] = DEFAULT_SEEDS, host_ratio: float | None = None,
                       workload: str = "terminal-bench", workers: int | None = None,
                       duration_min: float = STEADY_DURATION_MIN, sessions: int | None = STEADY_SESSIONS,
                       progress: Callable[[int, int], None] | None = None) -> CriticalRateResult:
    """Run the steady grid of ``deployment`` and return its steady-load limit (module docstring)."""
    rates = rate_grid(low, high, step)
    seeds = tuple(seeds)
    if not seeds:
        raise BasinInputError("--seeds: give at least one seed, e.g. --seeds 0,1,2")
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
        raise BasinInputError(f"--seeds {seeds}: expected whole numbers >= 0")
    if workers is not None and workers < 1:
        raise BasinInputError(f"--jobs {workers}: give at least 1 process")
    shortest = 2 * DegradationRule().window_s / 60.0
    if not (math.isfinite(duration_min) and duration_min >= shortest):
        raise BasinInputError(f"--duration {duration_min:g}: a run's state is read from its last two "
                              f"{shortest / 2:g}-minute windows; give at least {shortest:g} minutes")
    if host_ratio is not None and not host_ratio >= 0:
        raise BasinInputError(f"--host-ratio {host_ratio:g}: give 0 for GPU-only or a multiple of the GPU "
                              "prefix cache")
    dep = with_host_ratio(load_deployment(deployment), host_ratio)
    plans = [resolve_plan(steady_scenario(deployment, r, s, host_ratio=host_ratio, workload=workload,
                                          duration_min=duration_min, sessions=sessions)) for r in rates for s in seeds]
    runs = tuple(sorted((steady_run(p, r) for p, r in zip(plans, run_plans(plans, workers=workers,
                                                                           progress=progress))),
                        key=lambda x: (x.rate_per_min, x.seed)))
    return CriticalRateResult(dep.name, workload, float(dep.host_ratio), rates, seeds, runs,
                              critical_from_runs(rates, runs), duration_min, critical_rate(dep, workload))
