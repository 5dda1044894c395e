"""Call throughput X(N) of a session population N: three bounds and their
smooth minimum (the paper's Eq. 1 and the text after it).

* Closed loop: a session issues its next call one tool gap after the last
  finished, so ``X <= N / (g + L)``. The paper writes ``L0``, the unloaded
  call latency, which is exact for small N. Here ``L`` also carries the decode
  slowdown that the closed loop's own throughput causes: ``X`` calls per
  second in decode for ``T`` seconds keep ``B = X T`` requests in a decode
  batch, and each step then costs ``s1`` more per request
  (``DecodeProfile.step_s``). Without it the bound overstates throughput at
  the populations where the cliff sits by 40% on the calibrated H100 profile
  (243 against 173 calls/min at 56 sessions), enough to call the paper's own
  cache-first 1P1D decode-first.
  ``L`` equals ``L0`` at ``N -> 0``, so the paper's form is the limit.
* Prefill: ``X <= mu_p / u(N)``, uncached work per call
  ``u(N) = max(n_new, (1 - h(N c_bar / C)) P)``.
* Decode: at most ``B_max`` requests fit in each instance's KV; each then
  decodes for ``m (s0 + s1 B_max)``: ``X <= n_d B_max / T(B_max)``.

A colocated deployment (servers whose prefill and decode share compute and
one KV pool, docs/colocated.md) differs in two places. Compute: a call's
prefill and its share of the decode steps take the same server's time, so
the prefill and decode bounds combine as times do,
``1 / X_c = u(N) / mu_p + 1 / X_d``. Memory: the cache is what the running
requests leave of the pool, ``C - kv_req B(N)`` with ``B(N) = min(B_max,
N L0 / (L0 + g))`` requests running (the unloaded share of a session's time
in a call; a request queued for admission holds no KV in vLLM), so the
working-set ratio is ``N c_bar / (C - kv_req B(N))``.

The smooth minimum is the p-norm of reciprocals,
``X = (sum_i X_i^-p)^(-1/p)``: it is never above any bound (each term alone
already gives ``X <= X_i``), it is within ``2^(-1/p)`` of the smallest at a
crossing of two, and it is smooth, so the departure curve has a well-defined
peak where the closed loop meets the falling prefill bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from basin.errors import BasinInputError
from basin.model.hitcurve import HitCurve
from basin.model.params import FluidParams

#: Exponent of the smooth minimum (see the module docstring). At 8 a crossing
#: of two equal bounds sits 8% below them, the rounding a saturating queue shows.
DEFAULT_SHARPNESS = 8.0


def smooth_min(bounds: list[np.ndarray] | tuple[np.ndarray, ...], sharpness: float = DEFAULT_SHARPNESS) -> np.ndarray:
    """``(sum_i b_i^-p)^(-1/p)`` elementwise; an infinite bound drops out and a
    zero bound gives zero. Never exceeds ``min_i b_i``."""
    if not (math.isfinite(sharpness) and sharpness > 0):
        raise BasinInputError(f"smooth-min sharpness must be a finite number > 0, got {sharpness!r}")
    arrays = np.broadcast_arrays(*[np.asarray(b, dtype=float) for b in bounds])
    stacked = np.stack(arrays)
    if np.any(stacked < 0) or np.any(np.isnan(stacked)):
        raise BasinInputError("smooth_min: bounds must be >= 0 (a throughput bound cannot be negative)")
    lo = np.min(stacked, axis=0)
    out = np.zeros_like(lo)
    pos = np.isfinite(lo) & (lo > 0)
    # Scaling by the smallest bound keeps every power in [0, 1]: no overflow for any p.
    ratio = np.divide(lo, stacked, out=np.zeros_like(stacked), where=np.isfinite(stacked) & (stacked > 0))
    s = np.sum(ratio ** sharpness, axis=0)
    out[pos] = lo[pos] * s[pos] ** (-1.0 / sharpness)
    out[~np.isfinite(lo)] = np.inf
    return np.minimum(out, lo)


@dataclass(frozen=True)
class FluidModel:
    """The parameters, the hit curve and the smooth-min exponent: everything
    needed to evaluate X(N) and D(N)."""

    params: FluidParams
    curve: HitCurve
    sharpness: float = DEFAULT_SHARPNESS

    def __post_init__(self) -> None:
        p = self.sharpness
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or p <= 0:
            raise BasinInputError(f"sharpness: the smooth minimum's exponent must be a finite number > 0 "
                                  f"(default {DEFAULT_SHARPNESS:g}), got {p!r}")

    # ----------------------------------------------------------------- inputs
    def working_set_ratio(self, n: np.ndarray | float) -> np.ndarray:
        """``W / C`` with ``W = N c_bar``; colocated, over the cache the running
        requests leave (see the module docstring)."""
        p = self.params
        n = np.asarray(n, dtype=float)
        if not p.colocated:
            return n * p.mean_context_tokens / p.cache_tokens
        free = p.cache_tokens - p.decode_kv_per_request_tokens * self.running_requests(n)
        floor = p.cache_tokens * 1e-6
        return n * p.mean_context_tokens / np.maximum(free, floor)

    def running_requests(self, n: np.ndarray | float) -> np.ndarray:
        """Colocated: requests holding KV at population N, ``min(B_max n_d, N L0 / (L0 + g))``."""
        p = self.params
        share = p.unloaded_call_s / (p.unloaded_call_s + p.tool_gap_s) if p.unloaded_call_s + p.tool_gap_s > 0 \
            else 1.0
        return np.minimum(np.asarray(n, dtype=float) * share, p.max_batch_per_instance * p.decode_instances)

    def hit_rate(self, n: np.ndarray | float) -> np.ndarray:
        return np.asarray(self.curve(self.working_set_ratio(n)), dtype=float)

    def uncached_per_call(self, n: np.ndarray | float) -> np.ndarray:
        """``u(N) = max(n_new, (1 - h) P)``: a call computes at least its new suffix."""
        p = self.params
        return np.maximum(p.new_tokens, (1.0 - self.hit_rate(n)) * p.prompt_tokens)

    # ----------------------------------------------------------------- bounds
    def closed_loop_bound(self, n: np.ndarray | float) -> np.ndarray:
        """Calls per second N sessions issue when every call takes ``L`` (see the
        module docstring): the root of ``X (c + A B) = N``, with ``c = g + L0``,
        ``A = m s1``, and ``B = y m (s0 + s1) / (1 - y A)`` the mean number of
        other requests a call shares its decode steps with at ``y = X / n_d``
        calls per second per decode instance.

        Multiplying out gives ``n_d A (m (s0 + s1) - c) y^2 + (n_d c + N A) y - N = 0``,
        whose root in ``[0, 1 / A)`` is taken in the form that never cancels:
        ``y = 2N / (n_d c + N A + sqrt((n_d c - N A)^2 + 4 n_d A m (s0 + s1) N))``.
        """
        p = self.params
        n = np.asarray(n, dtype=float)
        c = p.tool_gap_s + p.unloaded_call_s
        a = p.decode_steps * p.decode_step_per_request_s
        b = p.decode_steps * (p.decode_step_base_s + p.decode_step_per_request_s)
        n_d = p.decode_instances
        if a <= 0:
            return n / c if c > 0 else np.where(n > 0, np.inf, 0.0)
        root = np.sqrt((n_d * c - n * a) ** 2 + 4.0 * n_d * a * b * n)
        denom = n_d * c + n * a + root
        y = np.divide(2.0 * n, denom, out=np.zeros_like(n), where=denom > 0)
        return n_d * y

    def prefill_bound(self, n: np.ndarray | float) -> np.ndarray:
        """``mu_p / u(N)`` calls per second."""
        return self.params.prefill_tokens_per_s / self.uncached_per_call(n)

    def decode_bound(self) -> float:
        """``n_d B_max / T(B_max)`` calls per second: decode memory full."""
        p = self.params
        t = float(p.decode_call_s(p.max_batch_per_instance))
        return math.inf if t <= 0 else p.decode_instances * p.max_batch_per_instance / t

    def closed_loop_limit(self) -> float:
        """What the closed-loop bound tends to as N grows: ``n_d / (m s1)``,
        decode throughput with an unbounded batch (each extra request slows
        every step by as much as it adds)."""
        p = self.params
        ms1 = p.decode_steps * p.decode_step_per_request_s
        return math.inf if ms1 <= 0 else p.decode_instances / ms1

    def low_reuse_prefill_bound(self) -> float:
        """The prefill bound once reuse has collapsed to the curve's floor."""
        p = self.params
        return p.prefill_tokens_per_s / max(p.new_tokens, (1.0 - self.curve.floor) * p.prompt_tokens)

    # ------------------------------------------------------------- throughput
    def compute_bound(self, n: np.ndarray | float) -> np.ndarray:
        """Colocated: prefill and decode on the same servers, their times added."""
        d = self.decode_bound()
        decode_s_per_call = 0.0 if math.isinf(d) else 1.0 / d
        return 1.0 / (self.uncached_per_call(n) / self.params.prefill_tokens_per_s + decode_s_per_call)

    def throughput(self, n: np.ndarray | float) -> np.ndarray:
        """X(N), calls per second: smooth minimum of the three bounds (colocated:
        of the closed loop and the shared compute)."""
        n = np.asarray(n, dtype=float)
        if self.params.colocated:
            return smooth_min([self.closed_loop_bound(n), self.compute_bound(n)], self.sharpness)
        return smooth_min([self.closed_loop_bound(n), self.prefill_bound(n),
                           np.full_like(n, self.decode_bound())], self.sharpness)

    def cache_limited_throughput(self, n: np.ndarray | float) -> np.ndarray:
        """Smooth minimum of the closed-loop and prefill bounds alone: what the
        engine would do with unlimited decode memory (section 5.1's comparison)."""
        n = np.asarray(n, dtype=float)
        return smooth_min([self.closed_loop_bound(n), self.prefill_bound(n)], self.sharpness)

    def departures_per_min(self, n: np.ndarray | float) -> np.ndarray:
        """D(N) = X(N) / K, sessions per minute."""
        return 60.0 * self.throughput(n) / self.params.calls_per_session

    def n_scale(self) -> float:
        """A population well past the cliff (three knees' worth of working set),
        the natural end of a plot or a search for the falling branch."""
        p = self.params
        return 3.0 * self.curve.knee_ratio * p.cache_tokens / p.mean_context_tokens
