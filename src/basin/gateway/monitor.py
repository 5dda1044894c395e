"""The live vulnerability monitor: the fluid model fitted online to what the
gateway observes, answering "how far is this deployment from the trap?".

It starts from the model ``basin model analyze`` builds for the deployment
behind the gateway (its profile and a prior workload) and replaces what the
gateway can measure:

* the mean context of an active session ``c_bar`` is the observed working set
  per admitted session (it places the cliff: ``N = x_k C / c_bar``);
* the tool time per call ``g`` is fitted so the model's departures at the
  observed population equal the observed departure rate, only on the healthy
  side of the cliff (hit rate near the curve's, population below ``N*``):
  that is the only branch a healthy deployment shows;
* the arrival rate is the observed one.

The cliff itself (capacity, hit curve, prefill and decode costs) is the
profile's: a deployment that has not yet fallen off it cannot show where it
is. From the fitted model, ``basin.model``'s own functions give the stable
and tipping populations, the vulnerable band and the smallest trapping surge.

Pure: no clock, no socket. The gateway's control tick hands it cumulative
counts and the current population; times are the gateway's seconds,
multiplied by ``time_scale`` into the model's (1 for a real engine; an
accelerated emulator's ``--speed``). The surge search costs seconds, so it is
a separate step the driver runs off its event loop (:func:`find_smallest_surge`).
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from dataclasses import dataclass
from typing import Literal

from scipy.optimize import brentq

from basin.errors import BasinInputError
from basin.model import (
    FluidModel,
    SmallestSurge,
    WorkloadInput,
    build_model,
    departure_peak,
    low_reuse_rate,
    smallest_trapping_surge,
    stable_and_unstable,
)

State = Literal["warming-up", "idle", "safe", "vulnerable", "near-tipping", "past-tipping", "overloaded"]
#: Every state, in order of alarm (the gauge's label values).
STATES: tuple[State, ...] = ("warming-up", "idle", "safe", "vulnerable", "near-tipping", "past-tipping",
                             "overloaded")
#: States an operator should act on (the alert rule fires on them).
WARNING_STATES: frozenset[State] = frozenset({"near-tipping", "past-tipping", "overloaded"})
#: The fitted tool time stays within this factor of the prior's either way.
GAP_CLAMP = 4.0
#: A fitted input must move by this share before the model is rebuilt.
REFIT_CHANGE = 0.01


@dataclass(frozen=True, slots=True)
class Observation:
    """What the gateway saw at one control tick (its own seconds)."""

    at_s: float
    #: Sessions that have arrived so far (admitted, parked or shed).
    arrived: int
    #: Sessions that have left after their last call (finished or expired) so far.
    departed: int
    #: Admitted sessions, tool time included (the model's ``N``).
    active_sessions: int
    working_set_tokens: int
    #: Prompt tokens found cached over the gateway's hit window (NaN: unknown).
    hit_rate: float


@dataclass(frozen=True, slots=True)
class MonitorSettings:
    """How the monitor smooths and judges (model seconds unless named)."""

    #: Rates and means are taken over this much model time.
    window_s: float = 300.0
    #: Model seconds per gateway second (an accelerated emulator's ``--speed``).
    time_scale: float = 1.0
    #: The trapping surge searched for lasts this long.
    surge_min: float = 10.0
    #: "near-tipping" from this share of the tipping population.
    near_fraction: float = 0.8
    #: Departures in the lifetime window before the tool time is fitted.
    min_departures: int = 20
    #: The lifetime is fitted over this many windows (departures are sparse).
    lifetime_windows: float = 4.0
    #: Healthy, for the lifetime fit: observed hit rate at most this far below the curve's.
    healthy_hit_gap: float = 0.15

    def __post_init__(self) -> None:
        for name in ("window_s", "time_scale", "surge_min", "lifetime_windows"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise BasinInputError(f"monitor setting '{name}': expected a number > 0, got {value!r}")
        if not 0 < self.near_fraction <= 1:
            raise BasinInputError(f"monitor setting 'near_fraction': expected a share in (0, 1], "
                                  f"got {self.near_fraction!r}")
        if self.min_departures < 1:
            raise BasinInputError(f"monitor setting 'min_departures': expected >= 1, got {self.min_departures!r}")


@dataclass(frozen=True)
class Estimate:
    """The fitted model's answers at one tick (rates per model minute, NaN: unknown)."""

    at_s: float
    state: State
    arrival_rate_per_min: float
    departure_rate_per_min: float
    population: float
    mean_context_tokens: float
    tool_gap_s: float
    #: Whether ``tool_gap_s`` is fitted (else the prior's).
    lifetime_fitted: bool
    hit_rate: float
    #: The hit curve's value at the observed working set / capacity.
    model_hit_rate: float
    n_star: float
    d_low_per_min: float
    d_star_per_min: float
    n_stable: float
    n_unstable: float
    model: FluidModel

    @property
    def warning(self) -> bool:
        return self.state in WARNING_STATES

    @property
    def tipping_margin_sessions(self) -> float:
        """Sessions the population can still grow by before the tipping point (NaN: none)."""
        return self.n_unstable - self.population


def find_smallest_surge(model: FluidModel, rate_per_min: float, duration_min: float) -> SmallestSurge | None:
    """:func:`basin.model.surge.smallest_trapping_surge`, or None when the rate
    has no stable population to push from (at or above the peak, or zero)."""
    if not rate_per_min > 0:
        return None
    ns, _ = stable_and_unstable(model, rate_per_min)
    if ns is None:
        return None
    return smallest_trapping_surge(model, rate_per_min, duration_min)


def _nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


class VulnerabilityMonitor:
    """Feed :meth:`observe` each tick; :attr:`last` is the latest estimate and
    :attr:`surge` the latest smallest trapping surge (with the time it was for)."""

    def __init__(self, prior: FluidModel, settings: MonitorSettings | None = None):
        self.prior = prior
        self.settings = settings or MonitorSettings()
        self._samples: deque[tuple[float, Observation]] = deque()
        self._model = prior
        self._key = (prior.params.mean_context_tokens, prior.params.tool_gap_s)
        self._peak = departure_peak(prior)
        self._d_low = low_reuse_rate(prior)
        self.last: Estimate | None = None
        self.surge: SmallestSurge | None = None
        self.surge_at_s: float | None = None

    # ------------------------------------------------------------ fitting
    def _with(self, c_bar: float, gap_s: float) -> FluidModel:
        """The prior with the observed context size and the fitted tool time."""
        params = dataclasses.replace(self.prior.params, mean_context_tokens=c_bar, tool_gap_s=gap_s)
        return dataclasses.replace(self.prior, params=params)

    def _fit_gap(self, c_bar: float, population: float, departures_per_min: float) -> float | None:
        """The tool time at which the model departs ``departures_per_min`` from ``population``."""
        prior_gap = max(self.prior.params.tool_gap_s, 1e-3)
        lo, hi = prior_gap / GAP_CLAMP, prior_gap * GAP_CLAMP

        def excess(gap: float) -> float:
            return float(self._with(c_bar, gap).departures_per_min(population)) - departures_per_min

        # More tool time, fewer departures: the excess falls with the gap.
        a, b = excess(lo), excess(hi)
        if math.isnan(a) or math.isnan(b):
            return None
        if a <= 0:
            return lo  # faster than the clamp allows: held at its edge
        if b >= 0:
            return hi  # slower than the clamp allows
        return float(brentq(excess, lo, hi, xtol=1e-3))

    def _model_for(self, c_bar: float, gap_s: float) -> FluidModel:
        old_c, old_g = self._key
        if abs(c_bar - old_c) > REFIT_CHANGE * old_c or abs(gap_s - old_g) > REFIT_CHANGE * max(old_g, 1e-3):
            self._model = self._with(c_bar, gap_s)
            self._key = (c_bar, gap_s)
            self._peak = departure_peak(self._model)
            self._d_low = low_reuse_rate(self._model)
        return self._model

    # ------------------------------------------------------------ the tick
    def observe(self, obs: Observation) -> Estimate:
        """Take one tick's observation; returns (and keeps) the new estimate."""
        cfg = self.settings
        t = obs.at_s * cfg.time_scale
        if self._samples and t < self._samples[-1][0]:
            raise BasinInputError(f"monitor: observation at {obs.at_s!r} s is earlier than the last one; "
                                  "hand observations in time order")
        self._samples.append((t, obs))
        keep_s = cfg.window_s * max(cfg.lifetime_windows, 1.0)
        while len(self._samples) > 2 and self._samples[1][0] <= t - keep_s:
            self._samples.popleft()
        window = [(ts, o) for ts, o in self._samples if ts >= t - cfg.window_s]
        # Rates span from the last sample at or before the window's start (or the first one kept).
        older = [s for s in self._samples if s[0] <= t - cfg.window_s]
        t0, first = older[-1] if older else self._samples[0]
        span_min = (t - t0) / 60.0
        arrival = (obs.arrived - first.arrived) / span_min if span_min > 0 else math.nan
        departure = (obs.departed - first.departed) / span_min if span_min > 0 else math.nan
        population = sum(o.active_sessions for _, o in window) / len(window)
        work = sum(o.working_set_tokens for _, o in window) / len(window)
        prior = self.prior.params
        c_bar = work / population if population > 0 and work > 0 else prior.mean_context_tokens

        gap, fitted = self._key[1], False
        lt0, lfirst = self._samples[0]
        life_min = (t - lt0) / 60.0
        life_departures = obs.departed - lfirst.departed
        model_hit = float(self._with(c_bar, gap).hit_rate(population))
        healthy = math.isnan(obs.hit_rate) or obs.hit_rate >= model_hit - cfg.healthy_hit_gap
        if life_departures >= cfg.min_departures and life_min > 0 and population > 0 and healthy \
                and population < self._peak.n_star:
            life_population = sum(o.active_sessions for _, o in self._samples) / len(self._samples)
            found = self._fit_gap(c_bar, life_population, life_departures / life_min)
            if found is not None:
                gap, fitted = found, True
        elif self.last is not None and self.last.lifetime_fitted:
            fitted = True  # keep the last fit through a surge or an unhealthy spell
        model = self._model_for(c_bar, gap)
        ns = nu = None
        if math.isfinite(arrival):
            ns, nu = stable_and_unstable(model, arrival)
        state = self._state(span_min * 60.0, arrival, population, nu)
        self.last = Estimate(
            at_s=obs.at_s, state=state, arrival_rate_per_min=arrival, departure_rate_per_min=departure,
            population=population, mean_context_tokens=c_bar, tool_gap_s=self._key[1], lifetime_fitted=fitted,
            hit_rate=obs.hit_rate, model_hit_rate=float(model.hit_rate(population)), n_star=self._peak.n_star,
            d_low_per_min=self._d_low, d_star_per_min=self._peak.d_star_per_min, n_stable=_nan(ns),
            n_unstable=_nan(nu), model=model)
        return self.last

    def _state(self, span_s: float, rate: float, population: float, nu: float | None) -> State:
        cfg = self.settings
        if span_s < 0.25 * cfg.window_s or not math.isfinite(rate):
            return "warming-up"  # too little time for a rate
        if rate == 0 and population == 0:
            return "idle"
        if rate > self._peak.d_star_per_min:
            return "overloaded"  # no stable population at this rate: it grows until the rate falls
        if nu is not None and population >= nu:
            return "past-tipping"
        if nu is not None and population >= cfg.near_fraction * nu:
            return "near-tipping"
        if rate >= self._d_low:
            return "vulnerable"
        return "safe"

    # ------------------------------------------------------------ the surge
    def surge_job(self) -> tuple[FluidModel, float, float] | None:
        """What :func:`find_smallest_surge` needs for the latest estimate (None before one)."""
        est = self.last
        if est is None or est.state == "warming-up" or not math.isfinite(est.arrival_rate_per_min):
            return None
        return est.model, est.arrival_rate_per_min, self.settings.surge_min

    def surge_found(self, surge: SmallestSurge | None, at_s: float) -> None:
        """Keep a finished search's answer (None: the rate had no stable population)."""
        self.surge, self.surge_at_s = surge, at_s


def build_monitor(deployment: str, workload: str = "terminal-bench", host_ratio: float | None = None,
                  curve: str = "paper", settings: MonitorSettings | None = None) -> VulnerabilityMonitor:
    """A monitor whose prior is the model ``basin model analyze -d DEPLOYMENT``
    builds (same profile, workload and curve), so the two agree before any
    observation; a bad name is refused naming the gateway setting."""
    try:
        prior = build_model(deployment, WorkloadInput(name=workload), host_ratio=host_ratio, curve=curve)
    except BasinInputError as exc:
        raise BasinInputError(f"monitor (monitor_deployment {deployment!r}, monitor_workload {workload!r}, "
                              f"monitor_curve {curve!r}): {exc}") from None
    return VulnerabilityMonitor(prior, settings)
