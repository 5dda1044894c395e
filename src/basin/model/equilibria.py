"""Where arrivals balance departures: the departure peak, the low-reuse rate,
the stable and unstable equilibria of ``dN/dt = lambda - D(N)``, the
vulnerable band of base rates and the drain time of a backlog (section 5).

An equilibrium ``N_e`` solves ``D(N_e) = lambda``. It is stable when
``D'(N_e) > 0``: one more session raises departures above arrivals and the
population shrinks back; unstable when ``D'(N_e) < 0``, where a population
pushed past it keeps growing (the trap). With a peak ``D(N*)`` and a falling
branch that levels at ``D_low``, every base rate in ``[D_low, D(N*)]`` has
both, which is why a finite surge can leave such a load trapped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq, minimize_scalar

from basin.errors import BasinInputError
from basin.model.throughput import FluidModel, smooth_min

#: Grid points of the first, coarse pass over the population axis.
_GRID = 4001
#: The falling branch is searched up to this many times the plot scale.
_MAX_EXTENSION = 2 ** 14


@dataclass(frozen=True, slots=True)
class Equilibrium:
    """A zero of ``lambda - D(N)`` and its stability (``slope`` is ``D'(N)`` per minute per session)."""

    n: float
    slope_per_min: float

    @property
    def stable(self) -> bool:
        return self.slope_per_min > 0


@dataclass(frozen=True, slots=True)
class DeparturePeak:
    n_star: float
    d_star_per_min: float


def _check_rate(rate_per_min: float) -> float:
    if isinstance(rate_per_min, bool) or not isinstance(rate_per_min, (int, float)) or not math.isfinite(rate_per_min) \
            or rate_per_min < 0:
        raise BasinInputError(f"rate: expected a session arrival rate >= 0 per minute, got {rate_per_min!r}")
    return float(rate_per_min)


def departure_peak(model: FluidModel) -> DeparturePeak:
    """``N*`` and ``D(N*)``: the population where departures are highest.

    A dense grid finds the highest point; a bounded scalar search between its
    neighbours refines it (D is smooth, so the refinement is safe).
    """
    n = np.linspace(0.0, model.n_scale(), _GRID)
    d = model.departures_per_min(n)
    i = int(np.argmax(d))
    lo, hi = n[max(i - 1, 0)], n[min(i + 1, n.size - 1)]
    if hi > lo:
        res = minimize_scalar(lambda x: -float(model.departures_per_min(x)), bounds=(lo, hi), method="bounded",
                              options={"xatol": 1e-6 * max(hi, 1.0)})
        if -res.fun >= d[i]:
            return DeparturePeak(float(res.x), float(-res.fun))
    return DeparturePeak(float(n[i]), float(d[i]))


def low_reuse_rate(model: FluidModel) -> float:
    """``D_low``: departures once reuse has collapsed to the hit curve's floor
    and the population is unbounded (``N -> infinity``), sessions per minute."""
    bounds = [model.low_reuse_prefill_bound(), model.decode_bound(), model.closed_loop_limit()]
    x = smooth_min([np.array(b) for b in bounds], model.sharpness)
    return float(60.0 * x / model.params.calls_per_session)


def vulnerable_band(model: FluidModel) -> tuple[float, float]:
    """``[D_low, D(N*)]``, sessions per minute: base rates a finite surge can trap."""
    return low_reuse_rate(model), departure_peak(model).d_star_per_min


def _slope(model: FluidModel, n: float) -> float:
    h = max(1e-4 * n, 1e-3)
    lo = max(n - h, 0.0)
    return float((model.departures_per_min(n + h) - model.departures_per_min(lo)) / (n + h - lo))


def equilibria(model: FluidModel, rate_per_min: float) -> tuple[Equilibrium, ...]:
    """Every population where departures equal ``rate_per_min``, in increasing N.

    Sign changes of ``D(N) - lambda`` on a grid are refined with Brent's
    method. The grid is extended until departures fall below the rate or the
    search passes ``2^14`` times the plot scale: a rate at or below ``D_low``
    has no falling-branch crossing at any finite population.
    """
    rate = _check_rate(rate_per_min)
    if rate == 0:
        return (Equilibrium(0.0, _slope(model, 0.0)),)
    top = model.n_scale()
    scale = 1
    while True:
        n = np.linspace(0.0, top * scale, _GRID)
        g = model.departures_per_min(n) - rate
        peak = int(np.argmax(g))
        # Stop once past the peak the curve has dropped below the rate, or the search is exhausted.
        if g[peak] <= 0 or g[-1] < 0 or scale >= _MAX_EXTENSION:
            break
        scale *= 4
    roots: list[Equilibrium] = []
    sign = np.sign(g)
    for i in np.nonzero(sign[:-1] * sign[1:] < 0)[0]:
        r = brentq(lambda x: float(model.departures_per_min(x)) - rate, n[i], n[i + 1], xtol=1e-9, rtol=1e-12)
        roots.append(Equilibrium(float(r), _slope(model, float(r))))
    for i in np.nonzero(sign == 0)[0]:
        roots.append(Equilibrium(float(n[i]), _slope(model, float(n[i]))))
    roots.sort(key=lambda e: e.n)
    return tuple(roots)


def stable_and_unstable(model: FluidModel, rate_per_min: float) -> tuple[float | None, float | None]:
    """``(N_s, N_u)``: the first stable equilibrium and the first unstable one
    above it (None where there is none: ``N_u`` below ``D_low``, both above
    the peak)."""
    eqs = equilibria(model, rate_per_min)
    ns = next((e.n for e in eqs if e.stable), None)
    nu = next((e.n for e in eqs if not e.stable and (ns is None or e.n > ns)), None)
    if ns is None:
        nu = None
    return ns, nu


def drain_time_min(model: FluidModel, backlog_sessions: float, rate_per_min: float) -> float:
    """Minutes to drain ``backlog_sessions`` at base rate ``lambda`` with the
    active population held at the peak (Eq. 4): ``S / (D(N*) - lambda)``;
    infinite when the rate reaches the peak."""
    rate = _check_rate(rate_per_min)
    if not (math.isfinite(backlog_sessions) and backlog_sessions >= 0):
        raise BasinInputError(f"backlog: expected a number of sessions >= 0, got {backlog_sessions!r}")
    surplus = departure_peak(model).d_star_per_min - rate
    if backlog_sessions == 0:
        return 0.0
    return backlog_sessions / surplus if surplus > 0 else math.inf
