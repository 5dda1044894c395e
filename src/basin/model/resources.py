"""Which resource limits service first: the cache cliff or decode memory.

Two answers, both from section 5.1:

* The resource condition (Eq. 2), in populations: the cliff comes near
  ``N_c = x_k C / c_bar`` and decode memory fills near
  ``N_d = D_KV / (f c_bar)``; the cache comes first when ``N_c < N_d``,
  i.e. ``C < D_KV / (x_k f)`` (the paper rounds ``x_k`` to 2).
* The throughput classification: the peak of the cache-limited throughput
  (closed-loop and prefill bounds alone, i.e. with unlimited decode memory)
  against the decode bound. If the cache-limited peak does not exceed the
  decode bound, falling reuse caps service before decode does: cache-first.
  The paper flags a deployment when the ratio is below 1 plus a 1% tolerance
  at the crossover; so do we by default.

The first answer needs only capacities and ``f``; the second also accounts for
service rates, which is why the paper (and ``first_limit``) uses it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from scipy.optimize import minimize_scalar

from basin.errors import BasinInputError
from basin.model.throughput import FluidModel

#: Relative tolerance at the crossover of the throughput classification (the paper's 1%).
DEFAULT_TOLERANCE = 0.01

Limit = Literal["cache", "decode"]


@dataclass(frozen=True, slots=True)
class ResourceCondition:
    """Eq. 2 evaluated: populations of the cliff and of decode saturation."""

    n_cliff: float
    n_decode: float
    cache_tokens: float
    threshold_cache_tokens: float

    @property
    def cache_first(self) -> bool:
        return self.n_cliff < self.n_decode

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "cache_first": self.cache_first}


@dataclass(frozen=True, slots=True)
class LimitClassification:
    """Section 5.1's throughput comparison (calls per second)."""

    cache_peak_calls_per_s: float
    n_cache_peak: float
    decode_bound_calls_per_s: float
    tolerance: float

    @property
    def ratio(self) -> float:
        """Cache-limited peak over the decode bound (the x-axis of the paper's Fig. 9b)."""
        d = self.decode_bound_calls_per_s
        return math.inf if d == 0 else self.cache_peak_calls_per_s / d

    @property
    def first_limit(self) -> Limit:
        return "cache" if self.ratio <= 1.0 + self.tolerance else "decode"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio, "first_limit": self.first_limit}


def resource_condition(model: FluidModel) -> ResourceCondition:
    p = model.params
    x_k, f, c = p.knee_ratio, p.fraction_in_service, p.mean_context_tokens
    n_cliff = x_k * p.cache_tokens / c
    n_decode = math.inf if f <= 0 else p.decode_kv_tokens / (f * c)
    threshold = math.inf if f <= 0 else p.decode_kv_tokens / (x_k * f)
    return ResourceCondition(n_cliff, n_decode, p.cache_tokens, threshold)


def classify_limit(model: FluidModel, tolerance: float = DEFAULT_TOLERANCE) -> LimitClassification:
    """The first limit by throughput: the peak over N of the cache-limited
    throughput, compared with the decode bound."""
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise BasinInputError(f"tolerance: expected a number >= 0 (0.01 is the paper's 1%), got {tolerance!r}")
    n = np.linspace(0.0, model.n_scale(), 4001)
    x = model.cache_limited_throughput(n)
    i = int(np.argmax(x))
    lo, hi = n[max(i - 1, 0)], n[min(i + 1, n.size - 1)]
    n_peak, x_peak = float(n[i]), float(x[i])
    if hi > lo:
        res = minimize_scalar(lambda v: -float(model.cache_limited_throughput(v)), bounds=(lo, hi),
                              method="bounded", options={"xatol": 1e-6 * max(hi, 1.0)})
        if -res.fun >= x_peak:
            n_peak, x_peak = float(res.x), float(-res.fun)
    return LimitClassification(x_peak, n_peak, model.decode_bound(), tolerance)
