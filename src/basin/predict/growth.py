"""The fit behind BASIN's online correction (``online_correction``).

The paper keeps a session's reservation fixed from its first call to its end.
A resident's growth so far says more about its peak than its first call did:
after ``k`` calls with context ``c`` the regression::

    log peak = a + b log(1 + c) + d log(1 + k) + e log(W0)

with ``W0`` the first-call point prediction, is fitted here by weighted least
squares over every (session, call) prefix of the training workload but the
last (a session that has made its last call departs). Each session weighs 1
in total, so long sessions do not dominate. ``W0`` is the *cross-fitted*
prediction, as the controller meets it. ``offset`` is the weighted
``level``-quantile of the log residuals, which lifts the revision to the
predictor's stated reservation level.

Numpy only: the policy gets four coefficients and an offset, never a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from basin.errors import BasinInputError, where
from basin.workload.records import Session


@dataclass(frozen=True)
class GrowthFit:
    """Coefficients of the revision (see the module docstring) and how well it did in training."""

    intercept: float
    coef_context: float
    coef_calls: float
    coef_initial: float
    offset: float
    level: float | None
    prefixes: int
    #: Weighted coverage of the revised reservation over the training prefixes.
    coverage: float
    #: Weighted mean of revised reservation / peak.
    reserved_over_peak: float

    def coefficients(self) -> dict[str, float]:
        """What the policy's ``GrowthCorrection`` is built from."""
        return {"intercept": self.intercept, "coef_context": self.coef_context, "coef_calls": self.coef_calls,
                "coef_initial": self.coef_initial, "offset": self.offset}


def prefix_rows(sessions: Sequence[Session], initial: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Design matrix ``[1, log(1 + c), log(1 + k), log W0]``, log peaks and weights, one row per prefix."""
    xs: list[tuple[float, float, float, float]] = []
    ys: list[float] = []
    ws: list[float] = []
    for s, w0 in zip(sessions, initial):
        n = len(s.calls) - 1
        if n < 1:
            continue
        lp = float(np.log(max(s.peak_context_tokens, 1)))
        lw0 = float(np.log(max(w0, 1.0)))
        for k in range(1, n + 1):
            xs.append((1.0, float(np.log1p(s.calls[k - 1].context_tokens)), float(np.log1p(k)), lw0))
            ys.append(lp)
            ws.append(1.0 / n)
    return np.array(xs, dtype=float).reshape(-1, 4), np.array(ys), np.array(ws)


def weighted_quantile(values: np.ndarray, weights: np.ndarray, level: float) -> float:
    """The smallest value whose cumulative weight share reaches ``level``."""
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order]) / weights.sum()
    return float(values[order][min(int(np.searchsorted(cum, level)), len(values) - 1)])


def fit_growth(sessions: Sequence[Session], initial: np.ndarray, level: float | None = None) -> GrowthFit:
    """Fit the revision on ``sessions`` given their first-call predictions ``initial`` (tokens)."""
    x, y, w = prefix_rows(sessions, np.asarray(initial, dtype=float))
    if len(y) < 8:
        raise BasinInputError(f"{where(field='sessions')}: the online correction needs sessions of two or "
                              f"more calls to fit on, found {len(y)} prefixes; use a larger workload or "
                              "leave online_correction off")
    sw = np.sqrt(w)
    coef, *_ = np.linalg.lstsq(x * sw[:, None], y * sw, rcond=None)
    resid = y - x @ coef
    offset = weighted_quantile(resid, w, level) if level is not None else 0.0
    context = np.expm1(x[:, 1])
    log_res = np.maximum(x @ coef + offset, np.log(np.maximum(context, 1.0)))
    covered = float(np.sum(w * (log_res >= y - 1e-12)) / w.sum())
    ratio = float(np.sum(w * np.exp(log_res - y)) / w.sum())
    return GrowthFit(float(coef[0]), float(coef[1]), float(coef[2]), float(coef[3]), float(offset), level,
                     len(y), covered, ratio)
