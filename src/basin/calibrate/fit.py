"""Least-squares fits of the catalogue's cost formulas to measured calls,
and the spread of repeated measurements.

The formulas are the hardware profile's own (:mod:`basin.catalog.hardware`):

- time to first token of ``u`` uncached tokens after ``p`` cached ones:
  ``c * steps + u / linear + attention * u * (p + u / 2)``, where ``steps``
  is 1 (a fixed cost per call) or the prefill steps the call took (a fixed
  cost per step of a colocated server's token budget);
- a decode step of ``B`` requests holding ``C`` context tokens in all:
  ``base + per_request * B + per_context_token * C``, in two stages: the
  context term from single calls (``B = 1``, contexts from short to the
  longest prompt), then base and per-request cost from batches with that
  term taken out. (Fitted in one go, a few percent of error in a batch's
  timing moves the small context term by tens of percent.)

All are linear in their unknowns, which must not be negative, so each is a
bounded linear least-squares problem (scipy's ``lsq_linear``). Rows are
weighted by the inverse of the measured time: a 20 ms call counts as much as
a 2 s one, so the fixed cost is not drowned by the long prompts. Residuals
are kept relative (measured / fitted - 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import lsq_linear


def spread(samples: Sequence[float]) -> dict[str, object]:
    """Samples with their median and interquartile range, as written to the profile."""
    values = [float(v) for v in samples]
    if not values:
        return {"samples": [], "n": 0}
    q1, med, q3 = np.percentile(values, [25, 50, 75])
    return {"samples": values, "n": len(values), "median": float(med), "q1": float(q1), "q3": float(q3),
            "iqr": float(q3 - q1)}


@dataclass(frozen=True)
class LinearFit:
    """Non-negative coefficients of ``y ~ X @ coef`` with relative residuals."""

    names: tuple[str, ...]
    coef: tuple[float, ...]
    residuals: tuple[float, ...]

    def __getitem__(self, name: str) -> float:
        return self.coef[self.names.index(name)]

    @property
    def rms_residual(self) -> float:
        return float(np.sqrt(np.mean(np.square(self.residuals)))) if self.residuals else 0.0

    def record(self) -> dict[str, object]:
        return {"coefficients": dict(zip(self.names, self.coef)), "relative_residuals": list(self.residuals),
                "rms_relative_residual": self.rms_residual, "points": len(self.residuals)}


def fit_nonnegative(names: Sequence[str], x: np.ndarray, y: np.ndarray) -> LinearFit:
    """``y ≈ x @ coef`` with ``coef >= 0``, weighted by ``1 / y``."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if len(y) < x.shape[1]:
        raise ValueError(f"{len(y)} points cannot fit {x.shape[1]} coefficients")
    w = 1.0 / np.maximum(y, 1e-12)
    scale = np.maximum(np.abs(x * w[:, None]).max(axis=0), 1e-300)  # columns of one magnitude for the solver
    res = lsq_linear((x * w[:, None]) / scale, y * w, bounds=(0.0, np.inf), method="bvls")
    coef = res.x / scale
    fitted = x @ coef
    residuals = y / np.maximum(fitted, 1e-300) - 1.0
    return LinearFit(tuple(names), tuple(float(c) for c in coef), tuple(float(r) for r in residuals))


#: The prefill fit's coefficients, in order.
PREFILL_TERMS = ("fixed_s", "s_per_token", "attention_s_per_token_position", "s_per_prompt_token")


def fit_prefill(uncached: Sequence[float], cached: Sequence[float], ttft_s: Sequence[float],
                steps: Sequence[float] | None = None) -> LinearFit:
    """``ttft = fixed * steps + u * s_per_token + attention * u * (p + u / 2)
    + (u + p) * s_per_prompt_token`` (``steps`` 1 when not given).

    The last term is what every prompt token costs, cached or not (the
    server's tokenizer and prefix lookup). Only calls after a cached prefix
    tell it from ``s_per_token``: without one it is 0.
    """
    u = np.asarray(uncached, dtype=float)
    p = np.asarray(cached, dtype=float)
    n = np.ones_like(u) if steps is None else np.asarray(steps, dtype=float)
    columns = [n, u, u * (p + u / 2.0)]
    if np.any(p > 0) and len(u) > len(PREFILL_TERMS):
        fit = fit_nonnegative(PREFILL_TERMS, np.column_stack([*columns, u + p]), np.asarray(ttft_s))
        if fit["s_per_token"] > 0:
            return fit
    fit = fit_nonnegative(PREFILL_TERMS[:3], np.column_stack(columns), np.asarray(ttft_s))
    return LinearFit(PREFILL_TERMS, (*fit.coef, 0.0), fit.residuals)


def fit_context(context_tokens: Sequence[float], step_s: Sequence[float]) -> LinearFit:
    """Single-call decode steps: ``step = one_request_s + per_context_token_s * context``."""
    c = np.asarray(context_tokens, dtype=float)
    x = np.column_stack([np.ones_like(c), c])
    return fit_nonnegative(("one_request_s", "per_context_token_s"), x, np.asarray(step_s))


def fit_batch(batch: Sequence[float], context_tokens: Sequence[float], step_s: Sequence[float],
              per_context_token_s: float) -> LinearFit:
    """Batched decode steps with the context term (from single calls) held:
    ``step = base + per_request * batch + per_context_token_s * context``,
    weighted and with residuals relative to the whole measured step."""
    b = np.asarray(batch, dtype=float)
    step = np.asarray(step_s, dtype=float)
    held = per_context_token_s * np.asarray(context_tokens, dtype=float)
    x = np.column_stack([np.ones_like(b), b])
    w = 1.0 / np.maximum(step, 1e-12)
    scale = np.maximum(np.abs(x * w[:, None]).max(axis=0), 1e-300)
    res = lsq_linear((x * w[:, None]) / scale, (step - held) * w, bounds=(0.0, np.inf), method="bvls")
    coef = res.x / scale
    residuals = step / np.maximum(x @ coef + held, 1e-300) - 1.0
    return LinearFit(("base_s", "per_request_s"), tuple(float(c) for c in coef),
                     tuple(float(r) for r in residuals))
