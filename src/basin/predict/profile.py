"""BASIN's offline cliff profile: a stepped load ramp in the simulator (paper section 6.5).

The ramp raises the session arrival rate in geometric steps on the engine
without control (``hicache``). At each step the active population settles
towards its new level; per 2-minute window the profiler records the working
set ``W`` and the hit rate, and per step the completion rate over the step's
settled part (after ``settle_min``). From one ramp it takes

* ``kappa``: the scale that best aligns the reference hit curve
  (:mod:`basin.predict.cliff`, knee ``x_k`` = 1.9) with the observed fall from
  the plateau to the floor, against ``x = W / C_eff`` where
  ``C_eff = max(C_gpu, C_host)`` (Algorithm 1: with a host tier the larger,
  inclusive tier is the capacity);
* ``lambda_c``: the peak departure rate, the highest completion rate any step
  sustained over its settled part (sessions per minute);
* the highest step rate at which the engine stayed healthy (completions kept
  up with 75% of arrivals, hit rate above the fitted midpoint), to compare
  with the critical rates the paper profiles.

Ramps repeat with seeds ``seed, seed + 1, ...`` in worker processes; the
profile keeps the lower quartile of kappa and the median of lambda_c. With
several prefill instances the router changes how prefixes spread, so each
router gets its own profile.

A profile is a YAML (or JSON) file under ``profiles/basin/``;
:func:`load_profile` reads it back into a :class:`CliffProfile`, which is what
the controller consumes (``kappa``, ``x_knee``, ``lambda_c_per_min`` and the
two capacities).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import numpy as np

from basin.errors import BasinInputError
from basin.paths import PROFILE_DIR
from basin.predict.cliff import (
    DECLINE_START,
    KAPPA_QUANTILE,
    PLATEAU_DECLINE,
    REFERENCE_STEEPNESS,
    X_KNEE,
    fit_kappa,
    lower_quartile,
    reference_hit,
)
from basin.sim.config import Deployment, RouterName, load_deployment, load_hardware

#: Where profiles live by default.
BASIN_PROFILE_DIR = PROFILE_DIR / "basin"
#: The workload profiles are taken with unless told otherwise.
DEFAULT_WORKLOAD = "terminal-bench"
#: File format version written into every profile.
PROFILE_VERSION = 1
PROFILE_KIND = "basin-cliff-profile"
ROUTERS: tuple[str, ...] = get_args(RouterName)

#: Default ramp, relative to the rate at which Little's law puts the working
#: set at the reference knee (see :func:`estimate_knee_rate`).
RAMP_START_FACTOR = 0.2
RAMP_END_FACTOR = 1.6
RAMP_STEPS = 15
RAMP_STEP_MIN = 15
RAMP_SETTLE_MIN = 5
RAMP_WINDOW_MIN = 2
#: Sessions synthesised per ramp for a synthetic preset (arrivals reuse them
#: in shuffled passes, each copy with its own cache keys).
RAMP_WORKLOAD_SESSIONS = 2000
#: Assumed service time per call when estimating session lifetimes.
ESTIMATE_CALL_S = 4.0
#: A step is healthy when its settled completions keep up with this share of
#: its settled arrivals and its hit rate is above the fitted curve's midpoint.
HEALTHY_COMPLETION_SHARE = 0.75


# ---------------------------------------------------------------------------
# checks


def _number(name: str, value: object, *, minimum: float | None = None, strict: bool = False,
            maximum: float | None = None, fix: str = "") -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating)) \
        and math.isfinite(float(value))  # type: ignore[arg-type]
    if ok and minimum is not None:
        ok = float(value) > minimum if strict else float(value) >= minimum  # type: ignore[arg-type]
    if ok and maximum is not None:
        ok = float(value) <= maximum  # type: ignore[arg-type]
    if not ok:
        bound = ""
        if minimum is not None:
            bound = f" {'>' if strict else '>='} {minimum:g}"
        if maximum is not None:
            bound += f"{' and' if bound else ''} <= {maximum:g}"
        raise BasinInputError(f"{name}: expected a finite number{bound}, got {value!r}{'; ' + fix if fix else ''}")
    return float(value)  # type: ignore[arg-type]


def _whole(name: str, value: object, minimum: int, fix: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer, float)) or \
            (isinstance(value, float) and not value.is_integer()) or int(value) < minimum:
        raise BasinInputError(f"{name}: expected a whole number >= {minimum}, got {value!r}{'; ' + fix if fix else ''}")
    return int(value)


def _check_router(router: str) -> str:
    if router not in ROUTERS:
        raise BasinInputError(f"router '{router}': use one of {', '.join(ROUTERS)}")
    return router


# ---------------------------------------------------------------------------
# the ramp


@dataclass(frozen=True)
class RampSettings:
    """A stepped ramp: ``steps`` rates from ``start_per_min`` to ``end_per_min``
    (geometric), each held ``step_min`` minutes; per-step figures cover the
    minutes after ``settle_min``; cliff points are ``window_min`` windows."""

    start_per_min: float
    end_per_min: float
    steps: int = RAMP_STEPS
    step_min: int = RAMP_STEP_MIN
    settle_min: int = RAMP_SETTLE_MIN
    window_min: int = RAMP_WINDOW_MIN
    #: Sessions active at time zero (about the first step's settled population).
    warm_sessions: int = 0
    #: Sessions synthesised for a synthetic preset (None: the whole workload).
    workload_sessions: int | None = RAMP_WORKLOAD_SESSIONS
    #: The uncontrolled engine being profiled.
    policy: str = "hicache"

    def __post_init__(self) -> None:
        start = _number("ramp start_per_min (--start-rate)", self.start_per_min, minimum=0, strict=True)
        _number("ramp end_per_min (--end-rate)", self.end_per_min, minimum=start, strict=True,
                fix="the ramp must rise: give an end rate above the start rate")
        _whole("ramp steps (--steps)", self.steps, 2)
        step = _whole("ramp step_min (--step-min)", self.step_min, 2)
        window = _whole("ramp window_min", self.window_min, 1)
        settle = _whole("ramp settle_min (--settle-min)", self.settle_min, 0)
        if settle > step - window:
            raise BasinInputError(
                f"ramp settle_min (--settle-min): {settle} leaves less than one {window}-minute window of a {step}-minute "
                f"step; use a settle time of at most {step - window} minutes or longer steps")
        _whole("ramp warm_sessions", self.warm_sessions, 0)
        if self.workload_sessions is not None:
            _whole("ramp workload_sessions", self.workload_sessions, 1)
        for name in ("steps", "step_min", "settle_min", "window_min", "warm_sessions"):
            object.__setattr__(self, name, int(getattr(self, name)))
        object.__setattr__(self, "start_per_min", float(self.start_per_min))
        object.__setattr__(self, "end_per_min", float(self.end_per_min))

    def rates(self) -> tuple[float, ...]:
        """Arrival rate of each step (sessions per minute)."""
        return tuple(float(r) for r in np.geomspace(self.start_per_min, self.end_per_min, self.steps))

    @property
    def duration_min(self) -> int:
        return self.steps * self.step_min

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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


def estimate_knee_rate(workload: Any, effective_cache_tokens: float, x_knee: float = X_KNEE) -> float:
    """Session rate (per minute) at which Little's law puts the unloaded
    working set at ``x_knee`` times the effective cache: ``x_k C_eff`` over
    the mean context-time a session holds. Only centres the default ramp;
    queueing makes the real cliff come earlier."""
    token_min, _ = _session_demand(workload)
    return x_knee * effective_cache_tokens / token_min


def _capacities(dep: Deployment) -> tuple[int, int]:
    """Aggregate GPU prefix cache and host tier of the deployment (as the engine sizes them)."""
    hw = load_hardware(dep.hardware)
    gpu = hw.prefill.prefix_cache_tokens
    return gpu * dep.prefill_instances, int(dep.host_ratio * gpu) * dep.prefill_instances


def resolve_deployment(deployment: str | Deployment, router: str | None = None,
                       host_ratio: float | None = None) -> Deployment:
    """The deployment to profile, with the router and host tier overridden when given."""
    dep = deployment if isinstance(deployment, Deployment) else load_deployment(str(deployment))
    update: dict[str, Any] = {}
    if router is not None:
        update["router"] = _check_router(router)
    if host_ratio is not None:
        update["host_ratio"] = _number("host_ratio (--host-ratio)", host_ratio, minimum=0,
                                       fix="give 0 for GPU-only or a multiple of the GPU prefix cache")
    return dep.model_copy(update=update) if update else dep


def _load_workload(name: str, seed: int, sessions: int | None) -> Any:
    from basin.workload.presets import resolve_workload
    from basin.workload.synthetic import SYNTHETIC_PRESETS

    return resolve_workload(name, seed=seed, n_sessions=sessions if name in SYNTHETIC_PRESETS else None)


def default_ramp(deployment: str | Deployment, workload: str = DEFAULT_WORKLOAD, *, router: str | None = None,
                 host_ratio: float | None = None, seed: int = 0, **overrides: Any) -> RampSettings:
    """The default ramp for a deployment: from 0.2 to 1.6 times the estimated
    knee rate (:func:`estimate_knee_rate`) in 15 geometric steps of 15 minutes,
    warm-started at the first step's population; ``overrides`` replace any
    :class:`RampSettings` field."""
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(RampSettings)})
    if unknown:
        raise BasinInputError(f"ramp: unknown setting '{unknown[0]}'; use one of "
                              f"{', '.join(f.name for f in dataclasses.fields(RampSettings))}")
    dep = resolve_deployment(deployment, router, host_ratio)
    gpu, host = _capacities(dep)
    sessions = overrides.get("workload_sessions", RAMP_WORKLOAD_SESSIONS)
    wl = _load_workload(workload, seed, sessions)
    token_min, lifetime = _session_demand(wl)
    knee_rate = X_KNEE * max(gpu, host) / token_min  # as estimate_knee_rate
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


# ---------------------------------------------------------------------------
# one ramp


@dataclass(frozen=True)
class RampRun:
    """One ramp (one seed): its fit, its steps and its cliff points."""

    seed: int
    kappa: float
    plateau_hit: float
    floor_hit: float
    fit_rmse: float
    #: Peak departure rate: the highest settled completion rate of any step.
    lambda_c_per_min: float
    #: Highest step rate (as set) the engine stayed healthy at; NaN if none.
    critical_rate_per_min: float
    #: Per step, over its settled minutes.
    step_rate_per_min: tuple[float, ...]
    step_arrivals_per_min: tuple[float, ...]
    step_completions_per_min: tuple[float, ...]
    step_active_sessions: tuple[float, ...]
    step_hit_rate: tuple[float, ...]
    step_working_set_ratio: tuple[float, ...]
    #: Cliff points: one per window (working set / C_eff, hit rate).
    points_x: tuple[float, ...]
    points_hit: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


#: Decimals kept for the figures a profile stores (files stay readable and
#: diffable; a ramp's window points are far noisier than 1e-4).
DECIMALS = 4


def _r(value: float) -> float:
    return round(float(value), DECIMALS)


def _rounded(values: Sequence[float] | np.ndarray) -> tuple[float, ...]:
    return tuple(_r(v) for v in values)


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
    from basin.metrics.cliff import cache_cliff_points

    effective = dict(ts)
    effective["cache_capacity_tokens"] = np.maximum(np.asarray(ts["cache_capacity_tokens"], dtype=np.float64),
                                                    np.asarray(ts["host_capacity_tokens"], dtype=np.float64))
    pts = cache_cliff_points(effective, window_min=ramp.window_min)
    keep = pts.start_min >= ramp.settle_min
    return pts.working_set_ratio[keep], pts.hit_rate[keep]


def simulate_ramp(dep: Deployment, workload: str, ramp: RampSettings, seed: int) -> dict[str, np.ndarray]:
    """Run one ramp on the simulator; returns its per-minute timeseries."""
    from basin.policy.registry import make_policy
    from basin.sim.engine import SimConfig, Simulator
    from basin.workload.arrivals import PoissonSchedule, RateChange, draw_arrivals

    hardware = load_hardware(dep.hardware)
    wl = _load_workload(workload, seed, ramp.workload_sessions)
    rates = ramp.rates()
    schedule = PoissonSchedule(
        base_per_min=rates[0],
        rate_changes=tuple(RateChange(at_min=float(i * ramp.step_min), per_min=r)
                           for i, r in enumerate(rates) if i > 0),
    )
    duration_s = ramp.duration_min * 60.0
    arrivals = draw_arrivals(wl, schedule, duration_s, seed=seed, warm_sessions=ramp.warm_sessions)
    config = SimConfig(hardware=hardware, deployment=dep, arrivals=arrivals, duration_s=duration_s,
                       block_tokens=wl.block_tokens, seed=seed)
    return Simulator(config, make_policy(ramp.policy)).run().timeseries


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
    critical = float(np.max(rates[healthy])) if np.any(healthy) else float("nan")
    return RampRun(
        seed=seed, kappa=_r(fit.kappa), plateau_hit=_r(fit.plateau), floor_hit=_r(fit.floor), fit_rmse=_r(fit.rmse),
        lambda_c_per_min=_r(lam), critical_rate_per_min=_r(critical), step_rate_per_min=_rounded(ramp.rates()),
        step_arrivals_per_min=_rounded(steps["arrivals"]), step_completions_per_min=_rounded(steps["completions"]),
        step_active_sessions=_rounded(steps["active"]), step_hit_rate=_rounded(steps["hit"]),
        step_working_set_ratio=_rounded(steps["x"]), points_x=_rounded(x), points_hit=_rounded(hit),
    )


def _ramp_job(args: tuple[Deployment, str, RampSettings, int, str]) -> RampRun:
    dep, workload, ramp, seed, label = args
    return analyse_ramp(simulate_ramp(dep, workload, ramp, seed), ramp, seed, label=label)


# ---------------------------------------------------------------------------
# the profile


@dataclass(frozen=True)
class CliffProfile:
    """A deployment's cliff profile, as the controller reads it.

    The cliff is ``W_c = kappa * x_knee * C_eff`` with ``C_eff = max(C_gpu,
    C_host)`` (both aggregate over prefill instances); ``lambda_c_per_min`` is
    the peak departure rate used for shedding.
    """

    deployment: str
    router: str
    workload: str
    #: The lower quartile of ``kappas``.
    kappa: float
    x_knee: float
    lambda_c_per_min: float
    gpu_cache_tokens: int
    host_cache_tokens: int
    #: Kappa and lambda_c of each repeated ramp (seeds ``seed``, ``seed + 1``, ...).
    kappas: tuple[float, ...]
    lambda_c_per_repeat: tuple[float, ...]
    #: Median over ramps of the highest step rate the engine stayed healthy at
    #: (resolution: one step of the ramp); for comparison with profiled critical rates.
    critical_rate_per_min: float
    #: Median plateau and floor hit rates of the fitted curves.
    plateau_hit: float
    floor_hit: float
    hardware: str
    prefill_instances: int
    decode_instances: int
    host_ratio: float
    seed: int
    ramp: RampSettings
    steepness: float = REFERENCE_STEEPNESS
    plateau_decline: float = PLATEAU_DECLINE
    decline_start: float = DECLINE_START
    kappa_quantile: float = KAPPA_QUANTILE
    runs: tuple[RampRun, ...] = field(default=(), repr=False)
    version: int = PROFILE_VERSION

    @property
    def effective_cache_tokens(self) -> int:
        """``C_eff = max(C_gpu, C_host)``."""
        return max(self.gpu_cache_tokens, self.host_cache_tokens)

    @property
    def cliff_ratio(self) -> float:
        """Working set at the cliff over ``C_eff``: ``kappa * x_knee``."""
        return self.kappa * self.x_knee

    @property
    def cliff_tokens(self) -> float:
        """``W_c = kappa * x_knee * C_eff`` (tokens)."""
        return self.cliff_ratio * self.effective_cache_tokens

    @property
    def repeats(self) -> int:
        return len(self.kappas)

    def hit(self, x: np.ndarray | float) -> np.ndarray:
        """The profiled hit curve at working-set ratio ``x = W / C_eff``."""
        return reference_hit(x, self.kappa, self.plateau_hit, self.floor_hit, self.x_knee, self.steepness,
                             self.plateau_decline, self.decline_start)

    def to_dict(self) -> dict[str, Any]:
        """Plain types, summary first (the file layout)."""
        return {
            "kind": PROFILE_KIND,
            "version": self.version,
            "deployment": self.deployment,
            "router": self.router,
            "workload": self.workload,
            "kappa": self.kappa,
            "x_knee": self.x_knee,
            "cliff_ratio": _r(self.cliff_ratio),
            "cliff_tokens": int(round(self.cliff_tokens)),
            "lambda_c_per_min": self.lambda_c_per_min,
            "gpu_cache_tokens": self.gpu_cache_tokens,
            "host_cache_tokens": self.host_cache_tokens,
            "effective_cache_tokens": self.effective_cache_tokens,
            "kappas": list(self.kappas),
            "kappa_quantile": self.kappa_quantile,
            "lambda_c_per_repeat": list(self.lambda_c_per_repeat),
            "critical_rate_per_min": self.critical_rate_per_min,
            "plateau_hit": self.plateau_hit,
            "floor_hit": self.floor_hit,
            "steepness": self.steepness,
            "plateau_decline": self.plateau_decline,
            "decline_start": self.decline_start,
            "hardware": self.hardware,
            "prefill_instances": self.prefill_instances,
            "decode_instances": self.decode_instances,
            "host_ratio": self.host_ratio,
            "seed": self.seed,
            "ramp": self.ramp.to_dict(),
            "runs": [r.to_dict() for r in self.runs],
        }


def _median(values: Sequence[float]) -> float:
    """Median of the finite values (NaN when there are none)."""
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[np.isfinite(arr)]
    return float(np.median(arr)) if arr.size else float("nan")


def profile_deployment(deployment: str | Deployment, workload: str = DEFAULT_WORKLOAD, router: str | None = None,
                       repeats: int = 3, seed: int = 0, progress: Callable[[int, int], None] | None = None, *,
                       host_ratio: float | None = None, ramp: RampSettings | None = None,
                       workers: int | None = None) -> CliffProfile:
    """Profile a deployment with ``repeats`` ramps (seeds ``seed``, ``seed + 1``, ...).

    ``router`` and ``host_ratio`` override the deployment's; ``ramp`` replaces
    :func:`default_ramp`. Ramps run in up to ``workers`` processes (default:
    the CPU count); ``progress(done, total)`` is called as each ramp ends.
    """
    repeats = _whole("repeats (--repeats)", repeats, 1)
    seed = _whole("seed (--seed)", seed, 0)
    dep = resolve_deployment(deployment, router, host_ratio)
    if ramp is None:
        ramp = default_ramp(dep, workload, seed=seed)
    elif not isinstance(ramp, RampSettings):
        raise BasinInputError(f"ramp: expected RampSettings, got {type(ramp).__name__}")
    n_workers = min(repeats, _whole("workers (--workers)", workers, 1) if workers is not None else (os.cpu_count() or 1))
    jobs = [(dep, workload, ramp, seed + i, f"ramp {i + 1} of {repeats} (seed {seed + i})") for i in range(repeats)]
    runs: list[RampRun | None] = [None] * repeats
    if n_workers <= 1:
        for i, job in enumerate(jobs):
            runs[i] = _ramp_job(job)
            if progress is not None:
                progress(i + 1, repeats)
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        # fork where there is one: spawn would re-run an unguarded calling script
        # in every worker. The workers only simulate (no I/O, no locks shared).
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        with ProcessPoolExecutor(max_workers=n_workers, mp_context=multiprocessing.get_context(method)) as pool:
            futures = {pool.submit(_ramp_job, job): i for i, job in enumerate(jobs)}
            for done, fut in enumerate(as_completed(futures), start=1):
                runs[futures[fut]] = fut.result()
                if progress is not None:
                    progress(done, repeats)
    done_runs = tuple(r for r in runs if r is not None)
    gpu, host = _capacities(dep)
    kappas = tuple(r.kappa for r in done_runs)
    lambdas = tuple(r.lambda_c_per_min for r in done_runs)
    return CliffProfile(
        deployment=dep.name, router=dep.router, workload=workload,
        kappa=_r(lower_quartile(kappas)), x_knee=X_KNEE,
        lambda_c_per_min=_r(_median(lambdas)),
        gpu_cache_tokens=gpu, host_cache_tokens=host,
        kappas=kappas, lambda_c_per_repeat=lambdas,
        critical_rate_per_min=_r(_median([r.critical_rate_per_min for r in done_runs])),
        plateau_hit=_r(_median([r.plateau_hit for r in done_runs])),
        floor_hit=_r(_median([r.floor_hit for r in done_runs])),
        hardware=dep.hardware, prefill_instances=dep.prefill_instances, decode_instances=dep.decode_instances,
        host_ratio=float(dep.host_ratio), seed=seed, ramp=ramp, runs=done_runs,
    )


# ---------------------------------------------------------------------------
# files


def _workload_stem(workload: str) -> str:
    path = Path(workload)
    stem = path.name.split(".")[0] if path.suffix else workload
    return "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in stem)


def profile_name(deployment: str | Deployment, router: str | None = None, workload: str = DEFAULT_WORKLOAD,
                 host_ratio: float | None = None) -> str:
    """File stem of a profile: ``<deployment>[-gpu-only|-host<r>][-<router>][-<workload>]``.

    The host suffix appears when ``host_ratio`` overrides the deployment's,
    the router when the deployment has several prefill instances (a single
    instance routes nothing), the workload when it is not terminal-bench.
    """
    base = deployment if isinstance(deployment, Deployment) else load_deployment(str(deployment))
    dep = resolve_deployment(base, router, host_ratio)
    parts = [dep.name]
    if dep.host_ratio != base.host_ratio:
        parts.append("gpu-only" if dep.host_ratio == 0 else f"host{dep.host_ratio:g}")
    if dep.prefill_instances > 1:
        parts.append(dep.router)
    if workload != DEFAULT_WORKLOAD:
        parts.append(_workload_stem(workload))
    return "-".join(parts)


def default_profile_path(deployment: str | Deployment, router: str | None = None,
                         workload: str = DEFAULT_WORKLOAD, host_ratio: float | None = None) -> Path:
    """Where ``basin profile`` writes (and the controller looks for) a profile:
    ``profiles/basin/<profile_name>.yaml``."""
    return BASIN_PROFILE_DIR / f"{profile_name(deployment, router, workload, host_ratio)}.yaml"


def _suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".json"):
        raise BasinInputError(f"{path}: a profile file ends in .yaml, .yml or .json")
    return suffix


def profile_text(profile: CliffProfile, fmt: str = "yaml") -> str:
    data = profile.to_dict()
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    import yaml

    header = (f"# BASIN cliff profile of {profile.deployment} ({profile.router}, {profile.workload}); written by "
              "`basin profile`, regenerate rather than edit.\n")
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)


def save_profile(profile: CliffProfile, path: str | os.PathLike[str]) -> Path:
    """Write ``profile`` as YAML or JSON (by the file's suffix)."""
    out = Path(path)
    fmt = "json" if _suffix(out) == ".json" else "yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(profile_text(profile, fmt), encoding="utf-8")
    return out


def _profile_file(path_or_name: str | os.PathLike[str]) -> Path:
    path = Path(path_or_name)
    if path.suffix.lower() in (".yaml", ".yml", ".json"):
        if not path.is_file():
            raise BasinInputError(f"{path}: profile file not found; write it with `basin profile DEPLOYMENT --out {path}`")
        return path
    for suffix in (".yaml", ".json"):
        candidate = BASIN_PROFILE_DIR / f"{path_or_name}{suffix}"
        if candidate.is_file():
            return candidate
    known = sorted(p.stem for p in BASIN_PROFILE_DIR.glob("*.yaml")) if BASIN_PROFILE_DIR.is_dir() else []
    raise BasinInputError(
        f"unknown profile '{path_or_name}': use one of {', '.join(known) or '(none yet)'}, a .yaml/.json path, "
        f"or create it with `basin profile DEPLOYMENT`")


class _Reader:
    """Typed field access that names the file and field in every error."""

    def __init__(self, path: Path, data: Mapping[str, Any], prefix: str = "") -> None:
        self.path, self.data, self.prefix = path, data, prefix

    def _fail(self, key: str, what: str) -> BasinInputError:
        got = self.data.get(key, "(missing)")
        return BasinInputError(f"{self.path}: field '{self.prefix}{key}': expected {what}, got {got!r}; "
                               "regenerate the profile with `basin profile`")

    def get(self, key: str) -> Any:
        if key not in self.data:
            raise self._fail(key, "a value")
        return self.data[key]

    def number(self, key: str, positive: bool = False) -> float:
        v = self.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) or math.isnan(v)) \
                or (positive and not v > 0):
            raise self._fail(key, "a positive number" if positive else "a number")
        return float(v)

    def whole(self, key: str, minimum: int = 0) -> int:
        v = self.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise self._fail(key, f"a whole number >= {minimum}")
        return int(v)

    def text(self, key: str) -> str:
        v = self.get(key)
        if not isinstance(v, str) or not v:
            raise self._fail(key, "a name")
        return v

    def numbers(self, key: str, positive: bool = False) -> tuple[float, ...]:
        v = self.get(key)
        if not isinstance(v, list) or any(isinstance(e, bool) or not isinstance(e, (int, float)) for e in v) \
                or (positive and any(not e > 0 for e in v)):
            raise self._fail(key, "a list of positive numbers" if positive else "a list of numbers")
        return tuple(float(e) for e in v)

    def mapping(self, key: str) -> _Reader:
        v = self.get(key)
        if not isinstance(v, Mapping):
            raise self._fail(key, "a mapping")
        return _Reader(self.path, v, f"{self.prefix}{key}.")


def _read_run(r: _Reader) -> RampRun:
    return RampRun(
        seed=r.whole("seed"), kappa=r.number("kappa", positive=True), plateau_hit=r.number("plateau_hit"),
        floor_hit=r.number("floor_hit"), fit_rmse=r.number("fit_rmse"), lambda_c_per_min=r.number("lambda_c_per_min"),
        critical_rate_per_min=r.number("critical_rate_per_min"),
        **{name: r.numbers(name) for name in (
            "step_rate_per_min", "step_arrivals_per_min", "step_completions_per_min", "step_active_sessions",
            "step_hit_rate", "step_working_set_ratio", "points_x", "points_hit")},
    )


def profile_from_dict(data: Any, path: str | os.PathLike[str] = "<profile>") -> CliffProfile:
    """A :class:`CliffProfile` from the plain mapping :meth:`CliffProfile.to_dict` gives."""
    where = Path(path)
    if not isinstance(data, Mapping):
        raise BasinInputError(f"{where}: expected a mapping of profile fields at the top level")
    r = _Reader(where, data)
    if data.get("kind") != PROFILE_KIND:
        raise BasinInputError(f"{where}: field 'kind': expected '{PROFILE_KIND}', got {data.get('kind')!r}; "
                              "this is not a BASIN cliff profile")
    version = r.whole("version", 1)
    if version > PROFILE_VERSION:
        raise BasinInputError(f"{where}: field 'version': {version} is newer than this basin-serve reads "
                              f"({PROFILE_VERSION}); update basin-serve or regenerate the profile")
    ramp_r = r.mapping("ramp")
    ramp_fields = {f.name for f in dataclasses.fields(RampSettings)}
    unknown = sorted(set(ramp_r.data) - ramp_fields)
    if unknown:
        raise BasinInputError(f"{where}: field 'ramp.{unknown[0]}': not a ramp setting")
    try:
        ramp = RampSettings(**dict(ramp_r.data))
    except BasinInputError as exc:
        raise BasinInputError(f"{where}: field 'ramp': {exc}") from None
    except TypeError as exc:  # a setting without a default is missing
        raise BasinInputError(f"{where}: field 'ramp': {exc}; regenerate the profile with `basin profile`") from None
    runs_raw = r.get("runs")
    if not isinstance(runs_raw, list) or any(not isinstance(x, Mapping) for x in runs_raw):
        raise BasinInputError(f"{where}: field 'runs': expected a list of mappings")
    runs = tuple(_read_run(_Reader(where, x, f"runs.{i}.")) for i, x in enumerate(runs_raw))
    kappas = r.numbers("kappas", positive=True)
    if not kappas:
        raise BasinInputError(f"{where}: field 'kappas': expected at least one value")
    router = r.text("router")
    if router not in ROUTERS:
        raise BasinInputError(f"{where}: field 'router': '{router}' is not one of {', '.join(ROUTERS)}")
    return CliffProfile(
        deployment=r.text("deployment"), router=router, workload=r.text("workload"),
        kappa=r.number("kappa", positive=True), x_knee=r.number("x_knee", positive=True),
        lambda_c_per_min=r.number("lambda_c_per_min"),
        gpu_cache_tokens=r.whole("gpu_cache_tokens", 1), host_cache_tokens=r.whole("host_cache_tokens", 0),
        kappas=kappas, lambda_c_per_repeat=r.numbers("lambda_c_per_repeat"),
        critical_rate_per_min=r.number("critical_rate_per_min"),
        plateau_hit=r.number("plateau_hit"), floor_hit=r.number("floor_hit"),
        hardware=r.text("hardware"), prefill_instances=r.whole("prefill_instances", 1),
        decode_instances=r.whole("decode_instances", 1), host_ratio=r.number("host_ratio"),
        seed=r.whole("seed"), ramp=ramp, steepness=r.number("steepness", positive=True),
        plateau_decline=r.number("plateau_decline"), decline_start=r.number("decline_start"),
        kappa_quantile=r.number("kappa_quantile"), runs=runs, version=version,
    )


def load_profile(path_or_name: str | os.PathLike[str]) -> CliffProfile:
    """Read a profile: a ``.yaml``/``.yml``/``.json`` path, or a name under
    ``profiles/basin/`` such as ``1p3d-h200`` or ``2p6d-h200-least-loaded``."""
    path = _profile_file(path_or_name)
    text = path.read_text(encoding="utf-8")
    if _suffix(path) == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BasinInputError(f"{path}: not valid JSON ({exc})") from None
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise BasinInputError(f"{path}: not valid YAML ({exc})") from None
    return profile_from_dict(data, path)


def profile_for(deployment: str | Deployment, router: str | None = None, workload: str = DEFAULT_WORKLOAD,
                host_ratio: float | None = None) -> CliffProfile:
    """The shipped (or previously written) profile of a deployment as run:
    ``load_profile(default_profile_path(...))``, with an error that gives the
    command creating it when there is none."""
    path = default_profile_path(deployment, router, workload, host_ratio)
    if not path.is_file():
        dep = resolve_deployment(deployment if isinstance(deployment, Deployment) else str(deployment),
                                 router, host_ratio)
        cmd = [f"basin profile {dep.name if isinstance(deployment, Deployment) else deployment}"]
        if dep.prefill_instances > 1:
            cmd.append(f"--router {dep.router}")
        if host_ratio is not None:
            cmd.append(f"--host-ratio {host_ratio:g}")
        if workload != DEFAULT_WORKLOAD:
            cmd.append(f"--workload {workload}")
        raise BasinInputError(f"no cliff profile at {path}; create it with `{' '.join(cmd)}`")
    return load_profile(path)


# ---------------------------------------------------------------------------
# the figure


def plot_profile(profile: CliffProfile, out_png: str | os.PathLike[str]) -> Path:
    """Two panels: hit rate against ``W / C_eff`` per window with each ramp's
    fitted curve and the profile's (lower-quartile kappa); and per step the
    arrival rate, the settled completion rate and the active sessions."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12.0, 4.8), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    ax_hit, ax_steps = fig.subplots(1, 2)
    x_max = 0.0
    for i, run in enumerate(profile.runs):
        x = np.asarray(run.points_x)
        x_max = max(x_max, float(np.max(x)) if x.size else 0.0)
        ax_hit.scatter(x, run.points_hit, s=12, alpha=0.55, color=f"C{i % 10}",
                       label=f"seed {run.seed}: kappa {run.kappa:.2f}")
    # Deep in the trap the working set runs far past the cliff; the floor is
    # clear well before that, so the axis stops at 2.5 times the cliff.
    x_right = min(max(x_max, 0.1), 2.5 * profile.cliff_ratio)
    hidden = sum(int(np.sum(np.asarray(run.points_x) > x_right)) for run in profile.runs)
    grid = np.linspace(0.0, x_right, 400)
    for i, run in enumerate(profile.runs):
        ax_hit.plot(grid, reference_hit(grid, run.kappa, run.plateau_hit, run.floor_hit, profile.x_knee,
                                        profile.steepness, profile.plateau_decline, profile.decline_start),
                    color=f"C{i % 10}", lw=1.0, alpha=0.8)
    ax_hit.plot(grid, profile.hit(grid), color="k", lw=2.2,
                label=f"profile: kappa {profile.kappa:.2f} (lower quartile)")
    ax_hit.axvline(profile.cliff_ratio, color="k", ls="--", lw=1.0,
                   label=f"cliff W/C_eff = kappa x_k = {profile.cliff_ratio:.2f}")
    ax_hit.axvline(1.0, color="0.5", ls=":", lw=1.0, label="W = C_eff")
    if hidden:
        ax_hit.text(0.98, 0.97, f"{hidden} windows further right not shown", transform=ax_hit.transAxes,
                    ha="right", va="top", fontsize="small", color="0.3")
    ax_hit.set_xlabel("working set / C_eff   (C_eff = max(GPU cache, host tier))")
    ax_hit.set_ylabel(f"prefix hit rate ({profile.ramp.window_min}-min windows)")
    ax_hit.set_ylim(0.0, 1.02)
    ax_hit.set_xlim(0.0, grid[-1])
    ax_hit.grid(True, alpha=0.3)
    ax_hit.legend(loc="lower left", fontsize="small")
    ax_hit.set_title("hit rate against working set")

    ramp = profile.ramp
    edges = np.arange(ramp.steps + 1) * ramp.step_min
    rates = np.asarray(ramp.rates())
    ax_steps.stairs(rates, edges, color="0.3", lw=1.5, label="arrival rate (set)")
    mid = edges[:-1] + (ramp.settle_min + ramp.step_min) / 2.0
    ax_act = ax_steps.twinx()
    for i, run in enumerate(profile.runs):
        ax_steps.plot(mid, run.step_completions_per_min, "o-", color=f"C{i % 10}", ms=4, lw=1.0,
                      label=f"completions/min, seed {run.seed}")
        ax_act.plot(mid, run.step_active_sessions, "s:", color=f"C{i % 10}", ms=3, lw=1.0, alpha=0.7)
    ax_steps.axhline(profile.lambda_c_per_min, color="k", ls="--", lw=1.0,
                     label=f"lambda_c = {profile.lambda_c_per_min:.1f}/min (median)")
    ax_steps.set_xlabel("ramp time (min); markers: settled part of each step")
    ax_steps.set_ylabel("sessions per minute")
    ax_act.set_ylabel("active sessions (squares, dotted)")
    ax_act.set_yscale("log")
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ax_act.yaxis.set_major_formatter(ScalarFormatter())
    ax_act.yaxis.set_minor_formatter(NullFormatter())
    ax_steps.set_ylim(bottom=0.0)
    ax_steps.grid(True, alpha=0.3)
    ax_steps.legend(loc="upper left", fontsize="small")
    ax_steps.set_title("the ramp: arrivals, completions, active sessions")
    host = (f"host {profile.host_ratio:g}x" if profile.host_ratio > 0 else "GPU-only")
    fig.suptitle(f"cliff profile: {profile.deployment} ({profile.prefill_instances}P{profile.decode_instances}D, "
                 f"{host}, {profile.router}), {profile.workload}, {profile.repeats} ramps")
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out
