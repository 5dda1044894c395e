"""The fluid model checked against the simulator: which resource limits
service first, over a grid of deployments (``basin model classify``), and
the simulator's own hit curve (``basin model fit-curve``).

The model's side is :mod:`basin.model.classify` (the grid and the model's
verdicts); this module runs the simulator as run plans over the one
executor (:func:`basin.experiments.runner.run_plans`).

How the simulator's first limit is measured
-------------------------------------------
Each deployment gets a slow linear load ramp of the session arrival rate
(a :class:`basin.experiments.ramp.LoadRamp` in 2-minute steps), warm started
from a modest population, so the population climbs through the loads where a
limit appears. Per 2-minute window, pooled with the windows before it until
they hold ``MIN_CALLS`` finished calls (a few calls a minute make a hit rate
a lottery at long tool times), three signals are followed:

* reuse: the prefix hit rate (cached + loaded from the host tier, over prompt
  tokens). The cache side is reached when it falls ``HIT_DROP`` below the
  run's healthy plateau (the best pooled level before decode memory filled):
  reuse has left its plateau and passed the sag before the knee;
* prefill backlog: at least ``PREFILL_QUEUE`` requests queued for prefill.
  Requests reserve decode memory before they queue for prefill, so a prefill
  queue exists only when prefill (whose work is the uncached share of every
  prompt) is the bottleneck: the cache-dependent prefill bound of the model.
  This catches deployments where a sag of reuse, not yet a collapse, is
  already enough to saturate prefill;
* decode memory: the share of decode KV held by *decoding* requests (not by
  reservations of requests still awaiting prefill, which fill memory as a
  consequence of a cache collapse). The decode limit is reached when it is at
  or above ``DECODE_FULL``.

A side is reached when its condition holds for ``PERSIST_WINDOWS`` windows in
a row after the warm-up; whichever side is reached first is the simulator's
first limit (a tie goes to the cache). A cache-first deployment loses reuse
(or saturates prefill) while decode memory still has room, then fills it with
idle reservations; a decode-first one fills decode memory with running
requests while reuse holds, and loses reuse only later, as waiting calls
stretch sessions.

The ramp's range comes from a decode-memory ceiling computed from the
profile alone (memory over decode time at the mean prompt), never from the
model: it starts at ``RAMP_LOW`` and ends at ``RAMP_HIGH`` times that
ceiling, over ``RAMP_LIFETIMES`` session lifetimes (``RAMP_MIN_MIN`` to
``RAMP_MAX_MIN`` minutes), so the population has time to follow the rate.

Runs are cached on disk under a key hashing the scenario, the profiles it
reads and the simulator's source, so a rerun after a code change re-simulates
and an unchanged rerun only re-reads the timeseries.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np

import basin
from basin import diskcache
from basin.catalog import load_deployment, load_hardware
from basin.errors import BasinInputError
from basin.experiments.plan import PlanResult, resolve_plan
from basin.experiments.ramp import LoadRamp
from basin.experiments.runner import ScenarioRun, run_plans
from basin.experiments.scenario import Scenario, load_scenario
from basin.metrics import cache_cliff_points
from basin.model.classify import GRID_SESSIONS, GRID_WORKLOAD, GridPoint, grid_model, grid_workload, model_limits
from basin.model.hitcurve import HitCurve, fit_table
from basin.model.params import resolve_deployment
from basin.model.resources import DEFAULT_TOLERANCE, LimitClassification, resource_condition
from basin.model.throughput import FluidModel
from basin.plotting import new_figure, save_figure

#: Ramp design (module docstring).
RAMP_LOW = 0.1
RAMP_HIGH = 1.3
RAMP_LIFETIMES = 10.0
RAMP_MIN_MIN = 240.0
RAMP_MAX_MIN = 720.0
RAMP_STEP_MIN = 2.0
#: Sessions in the workload pool each ramp draws from (the model's grid workload).
RAMP_SESSIONS = GRID_SESSIONS

#: Detection thresholds (module docstring).
HIT_DROP = 0.2
PREFILL_QUEUE = 4.0
DECODE_FULL = 0.85
WINDOW_MIN = 2
#: Signals pool trailing windows until they hold this many calls (at most MAX_SPAN_WINDOWS).
MIN_CALLS = 300
MAX_SPAN_WINDOWS = 15
#: A limit counts once it has held this many windows in a row.
PERSIST_WINDOWS = 3
#: The first minutes hold the warm start's transient (its contexts enter the
#: cache in one go); no verdict is taken from them.
WARMUP_MIN = 20.0

#: Bumped when the ramp or the stored columns change, to invalidate cached runs.
CACHE_FORMAT = 1
_STORED_COLUMNS = (
    "minute", "arrivals", "calls_completed", "sessions_completed", "prompt_tokens", "cached_tokens",
    "loaded_tokens", "uncached_tokens", "active_sessions", "working_set_tokens", "cache_capacity_tokens",
    "host_capacity_tokens", "decode_kv_decoding_tokens", "decode_kv_reserved_idle_tokens",
    "decode_kv_capacity_tokens", "decode_wait_len", "decode_running", "prefill_queue_len", "ttft_p50_s",
)

SimLimit = Literal["cache", "decode", "none"]


# ---------------------------------------------------------------- the ramp
@dataclass(frozen=True, slots=True)
class RampPlan:
    """A linear ramp of the base arrival rate and its warm start."""

    low_per_min: float
    high_per_min: float
    duration_min: float
    warm_sessions: int

    def load_ramp(self) -> LoadRamp:
        """The plan as a load ramp: ``RAMP_STEP_MIN`` steps from the low to the high rate."""
        n = int(self.duration_min // RAMP_STEP_MIN)
        span = self.high_per_min - self.low_per_min
        rates = [self.low_per_min] + [round(self.low_per_min + span * i / max(n - 1, 1), 6) for i in range(1, n)]
        return LoadRamp(tuple(rates), RAMP_STEP_MIN, self.warm_sessions)

    def rate_changes(self) -> list[dict[str, float]]:
        return self.load_ramp().rate_changes()


def decode_ceiling_per_min(point: GridPoint) -> tuple[float, float]:
    """The decode-memory ceiling in sessions per minute and the session
    lifetime in minutes of ``point``'s workload, from the profile alone:
    ``n_d`` instances each holding ``KV / (P + reserve)`` requests that decode
    ``m`` steps at that batch. Deliberately simpler than the model's decode
    bound and independent of it, so the ramps (and their cache keys) stay
    put while the model evolves."""
    dep, hw = resolve_deployment(point.deployment, point.host_ratio)
    w = grid_workload(point.tool_time)
    calls = [c for s in w.sessions for c in s.calls]
    k = len(calls) / len(w.sessions)
    prompt = float(np.mean([c.prompt_tokens for c in calls]))
    steps = float(np.mean([max(c.output_tokens - 1, 0) for c in calls]))
    gap = float(np.mean([c.tool_gap_s for c in calls]))
    dec = hw.decode
    batch = dec.kv_tokens / (prompt + dec.reserve_output_tokens)
    per_call_s = steps * dec.step_s(batch, batch * prompt)
    ceiling = 60.0 * dep.decode_instances * batch / per_call_s / k
    lifetime_min = k * (gap + per_call_s) / 60.0
    return ceiling, lifetime_min


def ramp_plan(point: GridPoint) -> RampPlan:
    """The ramp for a deployment: from the decode-memory ceiling and the
    session lifetime (module docstring)."""
    ceiling, lifetime_min = decode_ceiling_per_min(point)
    duration = float(np.clip(RAMP_LIFETIMES * lifetime_min, RAMP_MIN_MIN, RAMP_MAX_MIN))
    duration = RAMP_STEP_MIN * math.ceil(duration / RAMP_STEP_MIN)
    low = round(RAMP_LOW * ceiling, 4)
    return RampPlan(low, round(RAMP_HIGH * ceiling, 4), duration, int(round(low * lifetime_min)))


def ramp_scenario(point: GridPoint, plan: RampPlan, seed: int = 0) -> Scenario:
    """The simulator scenario of a deployment's ramp."""
    return plan.load_ramp().scenario(
        f"ramp-{point.deployment}-h{point.host_ratio:g}-t{point.tool_time:g}", point.deployment,
        {"name": GRID_WORKLOAD, "sessions": RAMP_SESSIONS, "tool_time": point.tool_time},
        seed=seed, host_ratio=point.host_ratio, policy="hicache",
        description="fluid-model classification ramp")


# ---------------------------------------------------------------- the cache
#: Sources a hicache ramp executes besides the whole of basin.sim: a change
#: to any of them re-simulates.
_RUN_SOURCES = (
    "workload/arrivals.py", "workload/presets.py", "workload/records.py", "workload/synthetic.py",
    "workload/transforms.py", "workload/agent_tables.py",
    "policy/base.py", "policy/hicache.py",
    "experiments/plan.py", "experiments/runner.py", "experiments/scenario.py",
)


@lru_cache(maxsize=1)
def code_digest() -> str:
    """Digest of the code a run executes besides its scenario and profiles:
    the simulator's sources, the runner and policy it uses, the workload
    code and the shipped presets. Unrelated modules (other policies, metrics,
    the CLI) are left out so that work elsewhere does not discard the cache."""
    root = Path(basin.__file__).resolve().parent
    files = list((root / "sim").glob("*.py")) + [root / rel for rel in _RUN_SOURCES]
    files += (root / "workload" / "presets_data").glob("*.yaml")
    return diskcache.source_digest(files)


def run_key(scenario: Scenario) -> str:
    """Cache key of a run: every field of the scenario, the deployment and
    hardware profiles it reads (their values, so comments do not count), the
    cache format and :func:`code_digest`."""
    dep = load_deployment(scenario.deployment)
    parts = [scenario.model_dump(mode="json"), dep.model_dump(mode="json"),
             load_hardware(dep.hardware).model_dump(mode="json")]
    return diskcache.make_key("classify-run", CACHE_FORMAT, json.dumps(parts, sort_keys=True), code_digest())


def default_cache_dir() -> Path:
    """The project's disk cache, ``classify`` folder (:func:`basin.diskcache.cache_dir`)."""
    return diskcache.cache_dir("classify")


@dataclass(frozen=True)
class RunCache:
    """Finished ramp timeseries on disk, one ``.npz`` per run key.

    Kept as ``.npz`` rather than :func:`basin.diskcache.cached`'s pickles: a
    grid takes hours, its runs are read back one by one (``--ramp-plots``) and
    arrays load without unpickling code. Writes are atomic like the disk
    cache's, and an unwritable folder costs a warning, never the run.
    """

    directory: Path

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.npz"

    def get(self, key: str) -> dict[str, np.ndarray] | None:
        p = self.path(key)
        if not p.is_file():
            return None
        try:
            with np.load(p) as data:
                return {k: data[k] for k in data.files}
        except (OSError, ValueError, EOFError):
            return None  # a torn write from an interrupted run: simulate again

    def put(self, key: str, timeseries: dict[str, np.ndarray]) -> None:
        tmp = self.directory / f".{key}.{os.getpid()}.tmp.npz"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            # cast: the stubs would match a ``**`` mapping against ``allow_pickle: bool``
            np.savez_compressed(tmp, **cast(dict[str, Any], timeseries))
            os.replace(tmp, self.path(key))
        except OSError as exc:
            warnings.warn(f"could not keep a classify run in {self.directory}: {exc}", stacklevel=2)


def stored_columns(run: ScenarioRun) -> dict[str, np.ndarray]:
    """The timeseries columns the detection and the cliff need, taken in the
    worker (a top-level function: it is pickled with the plan)."""
    ts = run.result.timeseries
    return {k: np.asarray(ts[k]) for k in _STORED_COLUMNS if k in ts}


# ----------------------------------------------------------- the detection
@dataclass(frozen=True, slots=True)
class SimVerdict:
    """What the ramp showed: the first limit and when each was reached."""

    limit: SimLimit
    cache_onset_min: float | None
    decode_onset_min: float | None
    plateau_hit_rate: float
    rate_at_limit_per_min: float | None
    peak_departures_per_min: float
    n_at_peak: float

    def to_dict(self) -> dict[str, Any]:
        return {"limit": self.limit, "cache_onset_min": self.cache_onset_min,
                "decode_onset_min": self.decode_onset_min, "plateau_hit_rate": self.plateau_hit_rate,
                "rate_at_limit_per_min": self.rate_at_limit_per_min,
                "peak_departures_per_min": self.peak_departures_per_min, "n_at_peak": self.n_at_peak}


def _windows(ts: dict[str, np.ndarray], column: str, how: str = "mean") -> np.ndarray:
    values = np.asarray(ts[column], dtype=float)
    n = values.size // WINDOW_MIN
    v = values[: n * WINDOW_MIN].reshape(n, WINDOW_MIN)
    return v.sum(axis=1) if how == "sum" else v.mean(axis=1)


def _trailing(values: np.ndarray, weights: np.ndarray, calls: np.ndarray) -> np.ndarray:
    """Weighted mean of ``values`` over the trailing windows that hold at least
    ``MIN_CALLS`` finished calls (at most ``MAX_SPAN_WINDOWS``; NaN when even
    those hold fewer). With long tool times a few calls a minute make a
    2-minute hit rate a lottery (one session back from a long gap recomputes
    100K tokens); pooling enough calls makes the level mean something."""
    out = np.full(values.size, np.nan)
    for i in range(values.size):
        n_calls, num, den = 0.0, 0.0, 0.0
        for j in range(i, max(-1, i - MAX_SPAN_WINDOWS), -1):
            n_calls += calls[j]
            if np.isfinite(values[j]) and weights[j] > 0:
                num += values[j] * weights[j]
                den += weights[j]
            if n_calls >= MIN_CALLS:
                break
        if n_calls >= MIN_CALLS and den > 0:
            out[i] = num / den
    return out


def _onset(mask: np.ndarray) -> int | None:
    """First window from which ``mask`` holds for ``PERSIST_WINDOWS`` windows in a row."""
    run = 0
    for i, ok in enumerate(mask):
        run = run + 1 if ok else 0
        if run >= PERSIST_WINDOWS:
            return i - PERSIST_WINDOWS + 1
    return None


def detect_first_limit(ts: dict[str, np.ndarray], calls_per_session: float) -> SimVerdict:
    """The simulator's first limit from a ramp's per-minute timeseries (module docstring)."""
    prompt = _windows(ts, "prompt_tokens", "sum")
    hits = _windows(ts, "cached_tokens", "sum") + _windows(ts, "loaded_tokens", "sum")
    calls = _windows(ts, "calls_completed", "sum")
    hit = np.divide(hits, prompt, out=np.full_like(prompt, np.nan), where=prompt > 0)
    decoding = _windows(ts, "decode_kv_decoding_tokens") / _windows(ts, "decode_kv_capacity_tokens")
    hit_s = _trailing(hit, prompt, calls)
    dec_s = _trailing(decoding, np.ones_like(decoding), calls)
    start = int(math.ceil(WARMUP_MIN / WINDOW_MIN))
    if hit_s.size <= start + PERSIST_WINDOWS:
        raise BasinInputError(f"ramp too short to classify: needs more than {WARMUP_MIN + 6:g} minutes")
    queue = _windows(ts, "prefill_queue_len")
    decode_i = _onset(dec_s[start:] >= DECODE_FULL)
    # The healthy plateau: the best sustained reuse before decode memory filled.
    upto = start + (decode_i if decode_i is not None else hit_s.size)
    healthy = hit_s[start:max(upto, start + 1)]
    plateau = float(np.nanmax(healthy)) if np.any(np.isfinite(healthy)) else float(np.nanmax(hit_s))
    cache_i = _onset((hit_s[start:] < plateau - HIT_DROP) | (queue[start:] >= PREFILL_QUEUE))
    cache_t = None if cache_i is None else float((cache_i + start) * WINDOW_MIN)
    decode_t = None if decode_i is None else float((decode_i + start) * WINDOW_MIN)
    if cache_t is None and decode_t is None:
        limit: SimLimit = "none"
    elif decode_t is None or (cache_t is not None and cache_t <= decode_t):
        # A tie goes to the cache: reuse already gone when memory filled.
        limit = "cache"
    else:
        limit = "decode"
    at = min(t for t in (cache_t, decode_t) if t is not None) if limit != "none" else None
    arrivals = _windows(ts, "arrivals", "sum") / WINDOW_MIN
    rate_at = None
    if at is not None:
        i = int(at // WINDOW_MIN)
        rate_at = float(np.mean(arrivals[max(0, i - 2): i + 1]))
    dep = _trailing(calls / WINDOW_MIN / calls_per_session, np.ones_like(calls), calls)
    n = _windows(ts, "active_sessions")
    k = int(np.nanargmax(dep[start:])) + start
    return SimVerdict(limit, cache_t, decode_t, plateau, rate_at, float(dep[k]), float(n[k]))


@dataclass(frozen=True)
class GridResult:
    """One deployment: its parameters, the simulator's verdict and the model's."""

    point: GridPoint
    model: FluidModel
    classification: LimitClassification
    sims: tuple[SimVerdict, ...]
    keys: tuple[str, ...]
    cached: int = 0

    @property
    def simulated(self) -> SimLimit:
        """Majority of the seeds' verdicts (ties go to cache: the costly miss
        for an operator is an unflagged cache-first deployment)."""
        votes = [s.limit for s in self.sims if s.limit != "none"]
        if not votes:
            return "none"
        return "cache" if votes.count("cache") * 2 >= len(votes) else "decode"

    @property
    def modelled(self) -> str:
        return self.classification.first_limit

    def to_dict(self) -> dict[str, Any]:
        p = self.model.params
        cond = resource_condition(self.model)
        return {
            **self.point.to_dict(),
            "label": self.point.label,
            "parameters": {"cache_tokens": p.cache_tokens, "decode_kv_tokens": p.decode_kv_tokens,
                           "tool_gap_s": p.tool_gap_s, "mean_context_tokens": p.mean_context_tokens,
                           "fraction_in_service": p.fraction_in_service,
                           "prefill_tokens_per_s": p.prefill_tokens_per_s,
                           "decode_bound_calls_per_s": self.classification.decode_bound_calls_per_s},
            "simulated": self.simulated,
            "model": self.modelled,
            "model_ratio": self.classification.ratio,
            "eq2_cache_first": cond.cache_first,
            "sim_runs": [s.to_dict() for s in self.sims],
        }


@dataclass(frozen=True)
class GridSummary:
    results: tuple[GridResult, ...]
    tolerance: float
    curve_label: str
    seeds: tuple[int, ...] = field(default=(0,))

    def confusion(self) -> dict[str, dict[str, int]]:
        """Counts by simulated (rows) and modelled (columns) first limit."""
        table = {s: {"cache": 0, "decode": 0} for s in ("cache", "decode", "none")}
        for r in self.results:
            table[r.simulated][r.modelled] += 1
        return table

    @property
    def decided(self) -> list[GridResult]:
        return [r for r in self.results if r.simulated != "none"]

    @property
    def accuracy(self) -> float:
        d = self.decided
        return sum(r.simulated == r.modelled for r in d) / len(d) if d else math.nan

    @property
    def cache_first_recall(self) -> float:
        cache = [r for r in self.results if r.simulated == "cache"]
        return sum(r.modelled == "cache" for r in cache) / len(cache) if cache else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {
            "deployments": [r.to_dict() for r in self.results],
            "confusion": self.confusion(),
            "accuracy": self.accuracy,
            "cache_first_recall": self.cache_first_recall,
            "n_deployments": len(self.results),
            "tolerance": self.tolerance,
            "hit_curve": self.curve_label,
            "seeds": list(self.seeds),
        }


def ensure_runs(scenarios: dict[str, Scenario], *, workers: int | None = None, cache_dir: Path | None = None,
                on_done: Callable[[str, bool], None] | None = None) -> dict[str, dict[str, np.ndarray]]:
    """The timeseries of every scenario in ``scenarios`` (by run key): read
    from the cache, or simulated as run plans over
    :func:`basin.experiments.runner.run_plans` in ``workers`` processes (default: all cores) and cached as each ends.
    ``on_done(key, cached)`` is called once per run."""
    cache = RunCache(cache_dir or default_cache_dir())
    series: dict[str, dict[str, np.ndarray]] = {}
    todo = []
    for key, sc in scenarios.items():
        got = cache.get(key)
        if got is not None:
            series[key] = got
            if on_done:
                on_done(key, True)
        else:
            todo.append((key, sc))
    if not todo:
        return series
    # Longest runs first keeps the pool busy to the end.
    todo.sort(key=lambda job: -job[1].duration_min * (job[1].arrivals.base_per_min or 0.0))

    def keep(index: int, result: PlanResult) -> None:
        key = todo[index][0]
        series[key] = result.measured
        cache.put(key, result.measured)
        if on_done:
            on_done(key, False)

    run_plans([resolve_plan(sc, measure=stored_columns) for _, sc in todo], keep, workers=workers)
    return series


def grid_scenarios(points: Sequence[GridPoint], curve: HitCurve, seeds: Sequence[int]
                   ) -> tuple[dict[str, Scenario], dict[GridPoint, list[str]], dict[GridPoint, FluidModel]]:
    """Ramp scenarios of every point and seed, by run key; the keys of each
    point; the model of each point."""
    scenarios, keys = _ramp_scenarios(points, seeds)
    return scenarios, keys, {pt: grid_model(pt, curve) for pt in points}


def _ramp_scenarios(points: Sequence[GridPoint], seeds: Sequence[int]
                    ) -> tuple[dict[str, Scenario], dict[GridPoint, list[str]]]:
    scenarios: dict[str, Scenario] = {}
    keys: dict[GridPoint, list[str]] = {}
    for pt in points:
        plan = ramp_plan(pt)
        keys[pt] = []
        for seed in seeds:
            sc = ramp_scenario(pt, plan, seed)
            key = run_key(sc)
            keys[pt].append(key)
            scenarios[key] = sc
    return scenarios, keys


def run_grid(points: Sequence[GridPoint], curve: HitCurve, *, seeds: Iterable[int] = (0,),
             workers: int | None = None, cache_dir: Path | None = None,
             tolerance: float = DEFAULT_TOLERANCE,
             on_done: Callable[[str, bool], None] | None = None) -> GridSummary:
    """Simulate (or read from the cache) every ramp of ``points`` and classify
    each deployment with the simulator and with the model
    (:func:`basin.model.classify.model_limits`).

    ``on_done(run_key, cached)`` is called once per finished run, for progress.
    """
    seeds = tuple(seeds)
    if not points:
        raise BasinInputError("classify: the grid is empty")
    if not seeds:
        raise BasinInputError("classify: give at least one seed")
    scenarios, keys = _ramp_scenarios(points, seeds)
    verdicts_of_model = model_limits(points, curve, tolerance)
    cache = RunCache(cache_dir or default_cache_dir())
    cached_before = {k for k in scenarios if cache.path(k).is_file()}
    series = ensure_runs(scenarios, workers=workers, cache_dir=cache_dir, on_done=on_done)
    results = []
    for pt in points:
        m, classification = verdicts_of_model[pt]
        verdicts = tuple(detect_first_limit(series[k], m.params.calls_per_session) for k in keys[pt])
        results.append(GridResult(pt, m, classification, verdicts, tuple(keys[pt]),
                                  sum(k in cached_before for k in keys[pt])))
    return GridSummary(tuple(results), tolerance, curve.label, seeds)


# ------------------------------------------------- the simulator's hit curve
#: The runs the simulator's hit curve is measured on: the calibration
#: scenario without a surge, with +33% and with +100%, four seeds each, every
#: 2-minute window of all of them, as the paper's Fig. 6b takes its curve from
#: every window of its real runs (docs/calibration.md draws the same points).
PROFILE_SCENARIO = "trap-1p1d"
PROFILE_FACTORS: tuple[float, ...] = (1.0, 1.33, 2.0)
PROFILE_SEEDS: tuple[int, ...] = (0, 1, 2, 3)
#: A 2-minute window needs this many finished calls for its hit rate to count.
PROFILE_MIN_CALLS = 60


def cliff_points(ts: dict[str, np.ndarray], host_ratio: float) -> tuple[np.ndarray, np.ndarray]:
    """``(W / C, hit rate)`` per 2-minute window, with ``C`` the larger of the
    GPU cache and the inclusive host tier (the model's ``C``), leaving out
    windows with too few calls to measure and any after decode memory first
    filled with running requests (there the hit rate reflects decode waits)."""
    pts = cache_cliff_points(ts, window_min=WINDOW_MIN)
    calls = _windows(ts, "calls_completed", "sum")
    i = (pts.start_min // WINDOW_MIN).astype(int)
    decoding = _windows(ts, "decode_kv_decoding_tokens") / _windows(ts, "decode_kv_capacity_tokens")
    full = _onset(decoding >= DECODE_FULL)
    keep = calls[i] >= PROFILE_MIN_CALLS
    if full is not None:
        keep &= i < full
    return pts.working_set_ratio[keep] / max(1.0, host_ratio), pts.hit_rate[keep]


def profile_hit_curve(scenario: str = PROFILE_SCENARIO, factors: Sequence[float] = PROFILE_FACTORS,
                      seeds: Sequence[int] = PROFILE_SEEDS, *, workers: int | None = None,
                      cache_dir: Path | None = None, bin_width: float = 0.1,
                      on_done: Callable[[str, bool], None] | None = None):
    """The simulator's hit curve: cliff points of ``scenario`` run with each
    surge factor and seed, fitted into a monotone table
    (:func:`basin.model.hitcurve.fit_table`). Returns the table and the raw
    points ``(x, h)``."""
    if not factors or not seeds:
        raise BasinInputError("fit-curve: give at least one surge factor and one seed")
    runs: dict[str, Scenario] = {}
    hosts: dict[str, float] = {}
    for f in factors:
        for seed in seeds:
            sc = load_scenario(scenario, [f"surge.factor={f}", f"seed={seed}"])
            key = run_key(sc)
            runs[key] = sc
            host = sc.host_ratio
            if host is None:
                host = resolve_deployment(sc.deployment)[0].host_ratio
            hosts[key] = host
    series = ensure_runs(runs, workers=workers, cache_dir=cache_dir, on_done=on_done)
    xs, hs = [], []
    for key in runs:
        x, h = cliff_points(series[key], hosts[key])
        xs.append(x)
        hs.append(h)
    x_all, h_all = np.concatenate(xs), np.concatenate(hs)
    label = (f"simulator cliff: {x_all.size} windows of {scenario} x surge {', '.join(f'{f:g}' for f in factors)}, "
             f"seeds {', '.join(map(str, seeds))}")
    return fit_table(x_all, h_all, bin_width=bin_width, label=label), (x_all, h_all)


# ------------------------------------------------------------- the figure
def plot_classification(summary: GridSummary, out_png: str | os.PathLike[str]) -> Path:
    """The paper's Fig. 9b: each deployment's model ratio (cache-limited peak
    over decode bound) against the simulator's verdict; the model flags those
    left of the dashed line."""
    fig = new_figure(7.0, 3.6)
    ax = fig.add_subplot(1, 1, 1)
    rows = {"cache": 1.0, "decode": 0.0, "none": -1.0}
    markers = {"1p1d": "o", "1p2d": "s", "1p3d": "D"}
    rng = np.random.default_rng(0)
    for r in summary.results:
        y = rows[r.simulated] + rng.uniform(-0.15, 0.15)
        shape = markers.get(r.point.deployment[:4], "o")
        hit = r.simulated == r.modelled
        color = "tab:green" if hit else "tab:red"
        ax.scatter([r.classification.ratio], [y], marker=shape, s=30, facecolor=color if hit else "white",
                   edgecolor=color, linewidths=1.5)
    ax.axvline(1.0 + summary.tolerance, color="0.3", ls="--", lw=1.0)
    ax.set_xscale("log")
    show_none = any(r.simulated == "none" for r in summary.results)
    ax.set_yticks([1.0, 0.0] + ([-1.0] if show_none else []))
    ax.set_yticklabels(["sim: cache first", "sim: decode first"] + (["sim: none"] if show_none else []))
    for shape, name in (("o", "1P1D"), ("s", "1P2D"), ("D", "1P3D")):
        ax.scatter([], [], marker=shape, s=30, facecolor="0.5", edgecolor="0.5", label=name)
    ax.scatter([], [], marker="o", s=30, facecolor="white", edgecolor="tab:red", linewidths=1.5,
               label="model disagrees")
    ax.legend(fontsize=7, loc="center left")
    ax.set_xlabel("model: cache-limited peak / decode bound (cache-first: left of the dashed line)", fontsize=9)
    ax.set_title(f"{len(summary.results)} deployments: accuracy {summary.accuracy:.0%}, "
                 f"cache-first recall {summary.cache_first_recall:.0%}", fontsize=10)
    return save_figure(fig, out_png)
