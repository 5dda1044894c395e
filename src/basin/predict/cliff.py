"""The reference hit curve and the fit of the cliff scale kappa (paper section 6.5).

The reference curve (:mod:`basin.cliff`, the one definition of the shape
and its constants) describes how the prefix hit rate falls as the working set
``W`` grows past the effective cache ``C_eff``, in the shape the paper reports
for its real runs (Fig. 6b) and our calibrated engine reproduces
(docs/calibration.md).

A deployment's curve is the reference stretched along ``x``: ``h(x) =
h_ref(x / kappa)``, so its cliff is at ``W_c = kappa * x_k * C_eff``. Fitting
kappa is a one-dimensional search: for a given kappa the model is linear in
``(plateau, floor)``, which least squares gives in closed form, so every
candidate is scored by its best plateau and floor. A log-spaced grid finds the
basin and a bounded scalar search refines it.

This module fits the curve and re-exports it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from basin.catalog.cliff_profiles import KAPPA_QUANTILE
from basin.cliff import (
    DECLINE_START,
    PLATEAU_DECLINE,
    REFERENCE_STEEPNESS,
    X_KNEE,
    reference_hit,
    reference_shape,
)
from basin.errors import BasinInputError

#: Smallest fall (plateau minus floor) that counts as a cliff.
MIN_DROP = 0.25
#: Fewest points on each side of the fitted knee.
MIN_SIDE_POINTS = 2
#: Search range of kappa.
KAPPA_BOUNDS = (0.05, 20.0)


@dataclass(frozen=True, slots=True)
class CliffFit:
    """The best alignment of the reference curve with one ramp's points."""

    kappa: float
    plateau: float
    floor: float
    #: Root-mean-square error of the fitted curve over the points.
    rmse: float
    n_points: int
    #: Points left and right of the fitted knee ``kappa * x_knee``.
    n_plateau_side: int
    n_floor_side: int
    x_knee: float = X_KNEE
    steepness: float = REFERENCE_STEEPNESS
    decline: float = PLATEAU_DECLINE
    decline_start: float = DECLINE_START

    @property
    def cliff_ratio(self) -> float:
        """Working set over effective cache at the fitted knee."""
        return self.kappa * self.x_knee

    def hit(self, x: np.ndarray | float) -> np.ndarray:
        return reference_hit(x, self.kappa, self.plateau, self.floor, self.x_knee, self.steepness,
                             self.decline, self.decline_start)


def _levels(s: np.ndarray, h: np.ndarray) -> tuple[float, float, float]:
    """Least-squares ``(plateau, floor)`` for ``h ~ floor + (plateau - floor) * s``
    under ``0 <= floor <= plateau <= 1``, and the sum of squared errors.

    The model is ``plateau * s + floor * (1 - s)``. When the unconstrained
    optimum leaves the triangle, the constrained one lies on one of its three
    edges (floor = 0, plateau = 1, plateau = floor), each a clipped
    one-parameter least-squares problem.
    """

    def sse(plateau: float, floor: float) -> float:
        return float(np.sum((floor + (plateau - floor) * s - h) ** 2))

    def clip(v: float) -> float:
        return min(max(v, 0.0), 1.0)

    a = np.column_stack([s, 1.0 - s])
    coef, *_ = np.linalg.lstsq(a, h, rcond=None)
    plateau, floor = float(coef[0]), float(coef[1])
    if not (0.0 <= floor <= plateau <= 1.0):
        r = 1.0 - s
        ss, rr = float(np.dot(s, s)), float(np.dot(r, r))
        edges = [
            (clip(float(np.dot(s, h)) / ss) if ss > 0 else 0.0, 0.0),       # floor = 0
            (1.0, clip(float(np.dot(r, h - s)) / rr) if rr > 0 else 1.0),   # plateau = 1
            (clip(float(np.mean(h))),) * 2,                                  # flat: plateau = floor
        ]
        plateau, floor = min(edges, key=lambda pf: sse(*pf))
    return plateau, floor, sse(plateau, floor)


def _check_points(x: Sequence[float] | np.ndarray, hit: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    xa = np.asarray(x, dtype=np.float64).ravel()
    ha = np.asarray(hit, dtype=np.float64).ravel()
    if xa.size != ha.size:
        raise BasinInputError(
            f"cliff fit: {xa.size} working-set ratios but {ha.size} hit rates; give one of each per window")
    keep = np.isfinite(xa) & np.isfinite(ha)
    xa, ha = xa[keep], ha[keep]
    if np.any(xa < 0) or np.any((ha < 0) | (ha > 1)):
        raise BasinInputError("cliff fit: working-set ratios must be >= 0 and hit rates between 0 and 1")
    return xa, ha


def fit_kappa(x: Sequence[float] | np.ndarray, hit: Sequence[float] | np.ndarray, *,
              x_knee: float = X_KNEE, steepness: float = REFERENCE_STEEPNESS,
              decline: float = PLATEAU_DECLINE, decline_start: float = DECLINE_START,
              min_drop: float = MIN_DROP, min_side_points: int = MIN_SIDE_POINTS,
              bounds: tuple[float, float] = KAPPA_BOUNDS, label: str = "cliff fit") -> CliffFit:
    """Fit the cliff scale kappa to points ``(x, hit)`` (x = W / C_eff per window).

    Raises :class:`BasinInputError` when the points do not show a cliff: a
    fall of less than ``min_drop`` from plateau to floor, or fewer than
    ``min_side_points`` points on either side of the fitted knee (the ramp
    stopped before the cliff, or started past it). ``label`` names the data
    in that message.
    """
    # Lazy: scipy takes about 0.27 s to import; only this path uses it.
    from scipy.optimize import minimize_scalar

    xa, ha = _check_points(x, hit)
    if xa.size < 2 * min_side_points + 1:
        raise BasinInputError(
            f"{label}: {xa.size} usable windows; a fit needs at least {2 * min_side_points + 1} "
            "(lengthen the ramp: more --steps or a longer --step-min)")
    lo, hi = bounds
    if not (0 < lo < hi and math.isfinite(hi)):
        raise BasinInputError(f"{label}: kappa bounds must satisfy 0 < low < high, got {bounds!r}")
    if not (x_knee > 0 and steepness > 0 and 0 <= decline < 1 and 0 <= decline_start < 1):
        raise BasinInputError(
            f"{label}: reference curve needs x_knee > 0, steepness > 0, 0 <= decline < 1 and "
            f"0 <= decline_start < 1; got {x_knee!r}, {steepness!r}, {decline!r}, {decline_start!r}")

    def sse(log_kappa: float) -> float:
        return _levels(reference_shape(xa / math.exp(log_kappa), x_knee, steepness, decline, decline_start), ha)[2]

    grid = np.linspace(math.log(lo), math.log(hi), 801)
    scores = np.array([sse(g) for g in grid])
    best = int(np.argmin(scores))
    left, right = grid[max(best - 1, 0)], grid[min(best + 1, grid.size - 1)]
    if right > left:
        res = minimize_scalar(sse, bounds=(left, right), method="bounded", options={"xatol": 1e-6})
        log_kappa = float(res.x) if res.fun <= scores[best] else float(grid[best])
    else:
        log_kappa = float(grid[best])
    kappa = math.exp(log_kappa)
    plateau, floor, total = _levels(reference_shape(xa / kappa, x_knee, steepness, decline, decline_start), ha)
    knee_x = kappa * x_knee
    n_left = int(np.sum(xa < knee_x))
    n_right = int(xa.size - n_left)
    fit = CliffFit(kappa=kappa, plateau=plateau, floor=floor, rmse=math.sqrt(total / xa.size),
                   n_points=int(xa.size), n_plateau_side=n_left, n_floor_side=n_right,
                   x_knee=x_knee, steepness=steepness, decline=decline, decline_start=decline_start)
    if plateau - floor < min_drop:
        raise BasinInputError(
            f"{label}: no cliff in the ramp: the hit rate falls only from {plateau:.2f} to {floor:.2f} "
            f"over working sets {xa.min():.2f}-{xa.max():.2f} x C_eff (a cliff needs a fall of "
            f"{min_drop:.2f}); raise --end-rate so the ramp passes the cliff")
    if n_right < min_side_points:
        raise BasinInputError(
            f"{label}: the ramp ended at the cliff ({n_right} windows past the fitted knee "
            f"{knee_x:.2f} x C_eff, need {min_side_points}); raise --end-rate or add --steps")
    if n_left < min_side_points:
        raise BasinInputError(
            f"{label}: the ramp started past the cliff ({n_left} windows before the fitted knee "
            f"{knee_x:.2f} x C_eff, need {min_side_points}); lower --start-rate")
    return fit


def lower_quartile(values: Sequence[float] | np.ndarray, q: float = KAPPA_QUANTILE) -> float:
    """The ``q`` quantile (default the lower quartile) by numpy's linear
    interpolation: with three repeats, halfway between the smallest and the median."""
    arr = np.asarray(values, dtype=np.float64).ravel()
    if arr.size == 0 or not np.all(np.isfinite(arr)):
        raise BasinInputError(f"lower quartile: expected one or more finite values, got {list(arr)!r}")
    if not 0.0 <= q <= 1.0:
        raise BasinInputError(f"lower quartile: quantile must be in [0, 1], got {q!r}")
    return float(np.quantile(arr, q))
