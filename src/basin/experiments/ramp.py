"""Load ramps, and BASIN's offline cliff profile taken with one (paper section 6.5).

A *load ramp* is the one way basin-serve raises load in steps: a
:class:`LoadRamp` (the arrival rate of each step and the step length) turned
into a :class:`~basin.experiments.scenario.Scenario` whose
``arrivals.rate_changes`` switch the Poisson rate at each step, run as a
run plan (:mod:`basin.experiments.plan`). The cliff profiler below uses
geometric steps; the model's classification (:mod:`basin.experiments.classify`)
uses a slow linear one.

The profiler raises the session arrival rate in geometric steps on the
engine without control (``hicache``). At each step the active population
settles towards its new level; per 2-minute window it records the working set
``W`` and the hit rate, and per step the completion rate over the step's
settled part (after ``settle_min``). From one ramp it takes

* ``kappa``: the scale that best aligns the reference hit curve
  (:mod:`basin.predict.cliff`, knee ``x_k`` = 1.9) with the observed fall from
  the plateau to the floor, against ``x = W / C_eff`` where
  ``C_eff = max(C_gpu, C_host)`` (Algorithm 1: with a host tier the larger,
  inclusive tier is the capacity);
* ``lambda_c``: the peak departure rate, the highest completion rate any step
  sustained over its settled part (sessions per minute);
* the highest step rate at which the engine stayed healthy (completions kept
  up with 75% of arrivals, hit rate above the fitted midpoint):
  ``healthy_step_rate_per_min``, a ramp's view of the critical rate.

Ramps repeat with seeds ``seed, seed + 1, ...`` as run plans over the one
executor (:func:`basin.experiments.runner.run_plans`); the profile keeps the lower
quartile of kappa and the median of lambda_c. With several prefill instances
the router changes how prefixes spread, so each router gets its own profile.
The file format is :mod:`basin.catalog.cliff_profiles`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from basin.catalog import Deployment, cache_capacity, load_hardware
from basin.catalog.cliff_profiles import (
    DEFAULT_WORKLOAD,
    RAMP_WORKLOAD_SESSIONS,
    CliffProfile,
    RampRun,
    RampSettings,
    check_whole,
    override_deployment,
    round_figure,
    round_figures,
)
from basin.cliff import X_KNEE
from basin.errors import BasinInputError
from basin.experiments.plan import RunPlan, resolve_plan
from basin.experiments.runner import ScenarioRun, build_workload, run_plan, run_plans
from basin.experiments.scenario import Scenario, WorkloadSpec
from basin.metrics.cliff import cache_cliff_points
from basin.model.params import WorkloadInput
from basin.predict.cliff import fit_kappa, lower_quartile
from basin.workload.synthetic import SYNTHETIC_PRESETS

#: Default ramp, relative to the knee rate: the session rate at which Little's
#: law puts the unloaded working set at the reference knee, ``x_k C_eff`` over
#: the mean context-time a session holds (queueing makes the real cliff come
#: earlier; it only centres the ramp).
RAMP_START_FACTOR = 0.2
RAMP_END_FACTOR = 1.6
#: Assumed service time per call when estimating session lifetimes.
ESTIMATE_CALL_S = 4.0
#: A step is healthy when its settled completions keep up with this share of
#: its settled arrivals and its hit rate is above the fitted curve's midpoint.
HEALTHY_COMPLETION_SHARE = 0.75


# ---------------------------------------------------------------------------
# the one load ramp


@dataclass(frozen=True)
class LoadRamp:
    """Arrival rate ``rates[i]`` (sessions per minute) from minute ``i *
    step_min`` on, for ``len(rates)`` steps, from ``warm_sessions`` sessions
    already active at time zero."""

    rates: tuple[float, ...]
    step_min: float
    warm_sessions: int = 0

    def __post_init__(self) -> None:
        if not self.rates:
            raise BasinInputError("load ramp: give at least one step rate")
        if not self.step_min > 0:
            raise BasinInputError(f"load ramp: step_min must be positive, got {self.step_min!r}")

    @property
    def duration_min(self) -> float:
        return len(self.rates) * self.step_min

    def rate_changes(self) -> list[dict[str, float]]:
        """The steps after the first, as a scenario's ``arrivals.rate_changes``."""
        return [{"at_min": i * self.step_min, "per_min": r} for i, r in enumerate(self.rates) if i > 0]

    def scenario(self, name: str, deployment: str, workload: Mapping[str, Any], *, seed: int = 0,
                 host_ratio: float | None = None, router: str | None = None, policy: str = "hicache",
                 description: str = "load ramp") -> Scenario:
        """The ramp as a scenario: no surge, measured to its end."""
        return Scenario.model_validate({
            "name": name,
            "description": description,
            "deployment": deployment,
            "host_ratio": host_ratio,
            "router": router,
            "workload": dict(workload),
            "arrivals": {"base_per_min": self.rates[0], "warm_sessions": self.warm_sessions,
                         "rate_changes": self.rate_changes()},
            "duration_min": self.duration_min,
            "measure_end_min": self.duration_min,
            "policy": policy,
            "seed": seed,
        })


#: What a ramp draws its sessions from: a preset or file by name, or a
#: scenario's workload section (its scaling and call cut applied).
RampWorkload = str | WorkloadSpec


def workload_spec(workload: RampWorkload, sessions: int | None) -> dict[str, Any]:
    """The scenario workload of a ramp: ``sessions`` synthesised for a
    synthetic preset (unless a workload section says how many); a real table
    or file is taken whole."""
    spec: dict[str, Any] = workload.model_dump() if isinstance(workload, WorkloadSpec) else {"name": workload}
    if spec.get("sessions") is None:
        spec["sessions"] = sessions if spec["name"] in SYNTHETIC_PRESETS else None
    return spec


def workload_label(workload: RampWorkload) -> str:
    """How a profile names the workload it was taken with: the name, and the
    scaling a workload section applies."""
    if isinstance(workload, str):
        return workload
    return WorkloadInput(workload.name, workload.sessions, 0, workload.tool_time, workload.output,
                         workload.prompt, workload.max_calls).label()


def _load_workload(workload: RampWorkload, seed: int, sessions: int | None) -> Any:
    return build_workload(WorkloadSpec.model_validate(workload_spec(workload, sessions)), seed)


# ---------------------------------------------------------------------------
# the profiler's ramp


def _session_demand(workload: Any, call_s: float = ESTIMATE_CALL_S) -> tuple[float, float]:
    """Mean over sessions of (context x time in token-minutes, lifetime in
    minutes), unloaded: each call takes ``call_s`` and is followed by its tool gap."""
    token_min, life_min = [], []
    for s in workload.sessions:
        calls = s.calls
        area = 0.0
        life = 0.0
        for k, c in enumerate(calls):
            gap = c.tool_gap_s if k < len(calls) - 1 else 0.0
            area += (c.prompt_tokens + c.output_tokens / 2.0) * call_s + c.context_tokens * gap
            life += call_s + gap
        token_min.append(area / 60.0)
        life_min.append(life / 60.0)
    return float(np.mean(token_min)), float(np.mean(life_min))


def default_ramp(deployment: str | Deployment, workload: RampWorkload = DEFAULT_WORKLOAD, *, router: str | None = None,
                 host_ratio: float | None = None, seed: int = 0, **overrides: Any) -> RampSettings:
    """The default ramp for a deployment: from 0.2 to 1.6 times the estimated
    knee rate (see ``RAMP_START_FACTOR``) in 15 geometric steps of 15 minutes,
    warm-started at the first step's population; ``overrides`` replace any
    :class:`RampSettings` field."""
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(RampSettings)})
    if unknown:
        raise BasinInputError(f"ramp: unknown setting '{unknown[0]}'; use one of "
                              f"{', '.join(f.name for f in dataclasses.fields(RampSettings))}")
    dep = override_deployment(deployment, router, host_ratio)
    capacity = cache_capacity(dep, load_hardware(dep.hardware))
    sessions = overrides.get("workload_sessions", RAMP_WORKLOAD_SESSIONS)
    wl = _load_workload(workload, seed, sessions)
    token_min, lifetime = _session_demand(wl)
    knee_rate = X_KNEE * capacity.effective_tokens / token_min
    start = overrides.get("start_per_min", round(RAMP_START_FACTOR * knee_rate, 2))
    end = overrides.get("end_per_min", round(RAMP_END_FACTOR * knee_rate, 2))
    if isinstance(start, (int, float)) and isinstance(end, (int, float)) and "end_per_min" not in overrides \
            and end <= start:
        end = start * RAMP_END_FACTOR / RAMP_START_FACTOR
    warm = overrides.get("warm_sessions")
    if warm is None and isinstance(start, (int, float)) and not isinstance(start, bool) and start > 0:
        warm = int(round(start * lifetime))
    settings = {k: v for k, v in overrides.items() if k not in ("start_per_min", "end_per_min", "warm_sessions")}
    return RampSettings(start_per_min=start, end_per_min=end, warm_sessions=warm or 0, **settings)


def load_ramp(ramp: RampSettings) -> LoadRamp:
    """A profile's ramp settings as the load ramp they stand for."""
    return LoadRamp(ramp.rates(), float(ramp.step_min), ramp.warm_sessions)


def profile_scenario(deployment: str, dep: Deployment, workload: RampWorkload, ramp: RampSettings,
                     seed: int) -> Scenario:
    """The scenario of one profiling ramp of ``dep`` (``deployment`` is how to
    load it: a name, shape or file), router and host tier as ``dep`` has them."""
    return load_ramp(ramp).scenario(
        f"profile-{dep.name}-seed{seed}", deployment, workload_spec(workload, ramp.workload_sessions),
        seed=seed, host_ratio=dep.host_ratio, router=dep.router, policy=ramp.policy,
        description="cliff profile ramp")


def simulate_ramp(dep: Deployment, workload: RampWorkload, ramp: RampSettings, seed: int,
                  deployment: str | None = None) -> dict[str, np.ndarray]:
    """Run one profiling ramp on the simulator, in this process; returns its per-minute timeseries."""
    return run_plan(resolve_plan(profile_scenario(deployment or dep.name, dep, workload, ramp, seed))).result.timeseries


def _step_figures(ts: Mapping[str, np.ndarray], ramp: RampSettings, c_eff: float) -> dict[str, tuple[float, ...]]:
    minute = np.asarray(ts["minute"], dtype=np.float64)
    out: dict[str, list[float]] = {k: [] for k in ("arrivals", "completions", "active", "hit", "x")}
    for i in range(ramp.steps):
        lo = i * ramp.step_min + ramp.settle_min
        hi = (i + 1) * ramp.step_min
        sel = (minute >= lo) & (minute < hi)
        n = int(np.sum(sel))
        if n == 0:
            for k in out:
                out[k].append(float("nan"))
            continue
        prompt = float(np.sum(ts["prompt_tokens"][sel]))
        hits = float(np.sum(ts["cached_tokens"][sel]) + np.sum(ts["loaded_tokens"][sel]))
        out["arrivals"].append(float(np.sum(ts["arrivals"][sel])) / n)
        out["completions"].append(float(np.sum(ts["sessions_completed"][sel])) / n)
        out["active"].append(float(np.mean(ts["active_sessions"][sel])))
        out["hit"].append(hits / prompt if prompt > 0 else float("nan"))
        out["x"].append(float(np.mean(ts["working_set_tokens"][sel])) / c_eff)
    return {k: tuple(v) for k, v in out.items()}


def _ramp_points(ts: Mapping[str, np.ndarray], ramp: RampSettings) -> tuple[np.ndarray, np.ndarray]:
    """Window points against the effective cache; windows starting inside the
    first step's settling time (the warm start) are left out."""
    effective = dict(ts)
    effective["cache_capacity_tokens"] = np.maximum(np.asarray(ts["cache_capacity_tokens"], dtype=np.float64),
                                                    np.asarray(ts["host_capacity_tokens"], dtype=np.float64))
    pts = cache_cliff_points(effective, window_min=ramp.window_min)
    keep = pts.start_min >= ramp.settle_min
    return pts.working_set_ratio[keep], pts.hit_rate[keep]


def analyse_ramp(ts: Mapping[str, np.ndarray], ramp: RampSettings, seed: int, label: str = "ramp") -> RampRun:
    """Fit kappa and measure lambda_c on one ramp's timeseries."""
    c_eff = float(max(np.max(ts["cache_capacity_tokens"]), np.max(ts["host_capacity_tokens"])))
    x, hit = _ramp_points(ts, ramp)
    fit = fit_kappa(x, hit, label=label)
    steps = _step_figures(ts, ramp, c_eff)
    completions = np.asarray(steps["completions"])
    lam = float(np.nanmax(completions)) if np.any(np.isfinite(completions)) else float("nan")
    with np.errstate(invalid="ignore"):
        healthy = (completions >= HEALTHY_COMPLETION_SHARE * np.asarray(steps["arrivals"])) \
            & (np.asarray(steps["hit"]) >= (fit.plateau + fit.floor) / 2.0)
    rates = np.asarray(ramp.rates())
    healthy_rate = float(np.max(rates[healthy])) if np.any(healthy) else float("nan")
    return RampRun(
        seed=seed, kappa=round_figure(fit.kappa), plateau_hit=round_figure(fit.plateau),
        floor_hit=round_figure(fit.floor), fit_rmse=round_figure(fit.rmse), lambda_c_per_min=round_figure(lam),
        healthy_step_rate_per_min=round_figure(healthy_rate), step_rate_per_min=round_figures(ramp.rates()),
        step_arrivals_per_min=round_figures(steps["arrivals"]),
        step_completions_per_min=round_figures(steps["completions"]),
        step_active_sessions=round_figures(steps["active"]), step_hit_rate=round_figures(steps["hit"]),
        step_working_set_ratio=round_figures(steps["x"]), points_x=round_figures(x), points_hit=round_figures(hit),
    )


def profile_plan(deployment: str, dep: Deployment, workload: RampWorkload, ramp: RampSettings, seed: int,
                 label: str) -> RunPlan:
    """The plan of one profiling ramp; the worker analyses its timeseries (:func:`analyse_ramp`)."""
    return resolve_plan(profile_scenario(deployment, dep, workload, ramp, seed),
                        measure=functools.partial(_analysed, ramp=ramp, label=label))


def _analysed(run: ScenarioRun, *, ramp: RampSettings, label: str) -> RampRun:
    return analyse_ramp(run.result.timeseries, ramp, run.scenario.seed, label=label)


def _median(values: Sequence[float]) -> float:
    """Median of the finite values (NaN when there are none)."""
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[np.isfinite(arr)]
    return float(np.median(arr)) if arr.size else float("nan")


def profile_deployment(deployment: str | Deployment, workload: RampWorkload = DEFAULT_WORKLOAD,
                       router: str | None = None,
                       repeats: int = 3, seed: int = 0, progress: Callable[[int, int], None] | None = None, *,
                       host_ratio: float | None = None, ramp: RampSettings | None = None,
                       workers: int | None = None) -> CliffProfile:
    """Profile a deployment with ``repeats`` ramps (seeds ``seed``, ``seed + 1``, ...).

    ``router`` and ``host_ratio`` override the deployment's; ``ramp`` replaces
    :func:`default_ramp`. Ramps run as plans over :func:`basin.experiments.runner.run_plans`
    in up to ``workers`` processes (default: the CPU count);
    ``progress(done, total)`` is called as each ramp ends.
    """
    repeats = check_whole("repeats (--repeats)", repeats, 1)
    seed = check_whole("seed (--seed)", seed, 0)
    if workers is not None:
        workers = check_whole("workers (--workers)", workers, 1)
    dep = override_deployment(deployment, router, host_ratio)
    source = dep.name if isinstance(deployment, Deployment) else str(deployment)
    if ramp is None:
        ramp = default_ramp(dep, workload, seed=seed)
    elif not isinstance(ramp, RampSettings):
        raise BasinInputError(f"ramp: expected RampSettings, got {type(ramp).__name__}")
    plans = [profile_plan(source, dep, workload, ramp, seed + i, f"ramp {i + 1} of {repeats} (seed {seed + i})")
             for i in range(repeats)]
    done_runs = tuple(sorted((r.measured for r in run_plans(plans, workers=workers, progress=progress)),
                             key=lambda r: r.seed))
    capacity = cache_capacity(dep, load_hardware(dep.hardware))
    kappas = tuple(r.kappa for r in done_runs)
    lambdas = tuple(r.lambda_c_per_min for r in done_runs)
    return CliffProfile(
        deployment=dep.name, router=dep.router, workload=workload_label(workload),
        kappa=round_figure(lower_quartile(kappas)), x_knee=X_KNEE,
        lambda_c_per_min=round_figure(_median(lambdas)),
        gpu_cache_tokens=capacity.gpu_tokens, host_cache_tokens=capacity.host_tokens,
        kappas=kappas, lambda_c_per_repeat=lambdas,
        healthy_step_rate_per_min=round_figure(_median([r.healthy_step_rate_per_min for r in done_runs])),
        plateau_hit=round_figure(_median([r.plateau_hit for r in done_runs])),
        floor_hit=round_figure(_median([r.floor_hit for r in done_runs])),
        hardware=dep.hardware, prefill_instances=dep.prefill_instances, decode_instances=dep.decode_instances,
        host_ratio=float(dep.host_ratio), seed=seed, ramp=ramp, runs=done_runs,
    )
