"""The cache cliff as a function: prefix hit rate against working set / cache.

The fluid model needs ``h(x)`` with ``x = W / C``: the share of prompt tokens
found cached when the active sessions' contexts add up to ``x`` times the
prefix-cache capacity. Two sources:

* :class:`PaperHitCurve`, the shape the paper measured on real hardware
  (Fig. 6b, defined once in :mod:`basin.cliff`): a plateau near 0.95 sagging
  as the working set approaches the knee, then a sharp fall to a low floor
  near ``x_k ~ 1.9``. Its levels and knee are open, so an operator can move
  the knee or the floor without data.
* :class:`TableHitCurve`, a plain table of ``(ratio, hit_rate)`` points read
  from a CSV file or fitted from measured cliff points (simulator runs or
  real ones; :func:`fit_table`), interpolated linearly.

Both are non-increasing in ``x``: the model's equilibria are found by sign
changes of ``D(N) - lambda``, and a curve that rose again with more demand
would only create spurious crossings out of measurement noise. Tables are made
monotone when built (isotonic regression), never silently at evaluation.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from basin.cliff import X_KNEE, reference_hit
from basin.errors import BasinInputError, where


class HitCurve(Protocol):
    """What the model needs from a cliff curve."""

    @property
    def label(self) -> str:
        """Short description printed as the origin of the curve's parameters."""
        ...

    def __call__(self, ratio: np.ndarray | float) -> np.ndarray:
        """Hit rate at working set / cache capacity ``ratio`` (array in, array out)."""
        ...

    @property
    def knee_ratio(self) -> float:
        """Working-set ratio of the cliff (``x_k``): where reuse collapses."""
        ...

    @property
    def floor(self) -> float:
        """Hit rate far past the cliff (the low-reuse state)."""
        ...


def _finite(name: str, value: float, lo: float, hi: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BasinInputError(f"hit curve field '{name}': expected a finite number, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo:g} and {hi:g}" if hi is not None else f">= {lo:g}"
        raise BasinInputError(f"hit curve field '{name}': expected a value {bound}, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class PaperHitCurve:
    """The paper's real-system cliff shape (Fig. 6b), as :mod:`basin.cliff`
    defines it for everything else (BASIN's profiles, the profiler's fit),
    with its levels and knee open: an operator can move the knee or the
    floor without data. Defaults: a plateau of 0.95, the knee at 1.9 times
    the cache, a floor of 0.30 (CALIBRATION.md; the trapped H100 run held 0.27).
    """

    plateau: float = 0.95
    knee: float = X_KNEE
    floor_rate: float = 0.30
    label: str = "paper shape (Fig. 6b): plateau 0.95, knee at 1.9, floor 0.30"

    def __post_init__(self) -> None:
        _finite("plateau", self.plateau, 0.0, 1.0)
        _finite("floor", self.floor_rate, 0.0, 1.0)
        _finite("knee", self.knee, 1e-6)
        if not self.plateau >= self.floor_rate:
            raise BasinInputError(
                "hit curve: expected plateau >= floor (a cliff falls with demand), got "
                f"{self.plateau:g}, {self.floor_rate:g}")

    def __call__(self, ratio: np.ndarray | float) -> np.ndarray:
        return reference_hit(ratio, self.knee / X_KNEE, self.plateau, self.floor_rate)

    @property
    def knee_ratio(self) -> float:
        return self.knee

    @property
    def floor(self) -> float:
        return self.floor_rate


def _non_increasing(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Least-squares non-increasing fit of ``values`` (weighted), in order.

    scikit-learn's isotonic regression (pool-adjacent-violators), imported
    here: the model's commands must not pay for scikit-learn at import time.
    """
    # Lazy: scikit-learn takes about 0.6 s to import; only this path uses it.
    from sklearn.isotonic import IsotonicRegression

    order = np.arange(values.size, dtype=float)
    fit = IsotonicRegression(increasing=False).fit_transform(order, values, sample_weight=weights)
    return np.asarray(fit, dtype=float)


@dataclass(frozen=True, slots=True)
class TableHitCurve:
    """A measured cliff: hit rate at given working-set ratios, linear in between,
    flat beyond both ends (the first and last points are the best evidence of
    the plateau and the floor)."""

    ratios: tuple[float, ...]
    hit_rates: tuple[float, ...]
    label: str = "table"

    def __post_init__(self) -> None:
        x = np.asarray(self.ratios, dtype=float)
        h = np.asarray(self.hit_rates, dtype=float)
        if x.ndim != 1 or x.size < 2 or x.size != h.size:
            raise BasinInputError(
                f"hit curve '{self.label}': needs at least two (ratio, hit_rate) points, as many rates as ratios")
        if not (np.all(np.isfinite(x)) and np.all(np.isfinite(h))):
            raise BasinInputError(f"hit curve '{self.label}': ratios and hit rates must be finite numbers")
        if np.any(x < 0) or np.any(np.diff(x) <= 0):
            raise BasinInputError(f"hit curve '{self.label}': ratios must be >= 0 and strictly increasing")
        if np.any(h < 0) or np.any(h > 1):
            raise BasinInputError(f"hit curve '{self.label}': hit rates must lie in [0, 1]")
        if np.any(np.diff(h) > 1e-12):
            raise BasinInputError(
                f"hit curve '{self.label}': hit rates must not rise with the working set; "
                "fit the table with basin.model.hitcurve.fit_table, which makes it monotone")

    def __call__(self, ratio: np.ndarray | float) -> np.ndarray:
        return np.interp(np.asarray(ratio, dtype=float), self.ratios, self.hit_rates)

    @property
    def knee_ratio(self) -> float:
        """Where the curve crosses halfway between its first and last value:
        the middle of the cliff, which for the paper's shape is its knee."""
        h = np.asarray(self.hit_rates)
        x = np.asarray(self.ratios)
        mid = (h[0] + h[-1]) / 2.0
        if h[0] - h[-1] < 1e-9:
            return float(x[-1])
        below = int(np.argmax(h <= mid))
        if below == 0:
            return float(x[0])
        x0, x1, h0, h1 = x[below - 1], x[below], h[below - 1], h[below]
        return float(x0 + (h0 - mid) / (h0 - h1) * (x1 - x0)) if h0 != h1 else float(x1)

    @property
    def floor(self) -> float:
        return float(self.hit_rates[-1])

    def to_csv(self, path: str | Path) -> None:
        """Write ``ratio,hit_rate`` rows; :func:`load_table_csv` reads them back."""
        with Path(path).open("w", encoding="utf-8", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["ratio", "hit_rate"])
            for x, h in zip(self.ratios, self.hit_rates):
                writer.writerow([f"{x:.4f}", f"{h:.4f}"])


def load_table_csv(path: str | Path) -> TableHitCurve:
    """A hit curve from a CSV with columns ``ratio`` and ``hit_rate``.

    Rows may come in any order; they are sorted by ratio. A curve that rises
    with the working set is refused rather than smoothed: a measured table
    should be fitted with :func:`fit_table` first.
    """
    p = Path(path)
    if not p.is_file():
        raise BasinInputError(f"{p}: hit-curve file not found (expected a CSV with columns ratio,hit_rate)")
    try:
        with p.open("r", encoding="utf-8", newline="") as fh:
            reader = csv.DictReader(fh)
            header = list(reader.fieldnames or [])
            rows = [(reader.line_num, row) for row in reader]
    except (csv.Error, UnicodeDecodeError) as exc:
        raise BasinInputError(f"{p}: unreadable CSV ({exc})") from None
    for col in ("ratio", "hit_rate"):
        if col not in header:
            raise BasinInputError(f"{where(p, line=1)}: missing column '{col}'; expected a header 'ratio,hit_rate'")
    points = []
    for line, row in rows:
        values = []
        for col in ("ratio", "hit_rate"):
            try:
                values.append(float(row[col]))
            except (TypeError, ValueError):
                raise BasinInputError(
                    f"{where(p, line=line, field=col)}: expected a number, got {row[col]!r}") from None
        points.append(tuple(values))
    points.sort()
    return TableHitCurve(tuple(x for x, _ in points), tuple(h for _, h in points), label=f"table {p.name}")


def fit_table(ratios: Sequence[float] | np.ndarray, hit_rates: Sequence[float] | np.ndarray, *,
              bin_width: float = 0.1, min_points: int = 3, label: str = "fitted") -> TableHitCurve:
    """A monotone table through measured cliff points.

    Points are binned by ratio; each bin with at least ``min_points`` points
    gives its median hit rate at the bin's median ratio (robust to the few
    windows caught mid-transition). The bin medians are then made
    non-increasing by weighted isotonic regression (weights: points per
    bin), the least-squares monotone fit.
    """
    x = np.asarray(ratios, dtype=float)
    h = np.asarray(hit_rates, dtype=float)
    keep = np.isfinite(x) & np.isfinite(h)
    x, h = x[keep], h[keep]
    if bin_width <= 0 or min_points < 1:
        raise BasinInputError("fit_table: bin_width must be > 0 and min_points >= 1")
    if x.size == 0:
        raise BasinInputError("fit_table: no finite (ratio, hit_rate) points to fit")
    idx = np.floor(x / bin_width).astype(int)
    xs, hs, ws = [], [], []
    for b in np.unique(idx):
        sel = idx == b
        if sel.sum() >= min_points:
            xs.append(float(np.median(x[sel])))
            hs.append(float(np.median(h[sel])))
            ws.append(float(sel.sum()))
    if len(xs) < 2:
        raise BasinInputError(
            f"fit_table: only {len(xs)} bin(s) with at least {min_points} points; measure a wider range "
            "of working sets or lower min_points")
    fitted = np.clip(_non_increasing(np.array(hs), np.array(ws)), 0.0, 1.0)
    xs_arr = np.round(np.array(xs), 4)
    fitted = np.round(fitted, 4)
    # Inside a run of equal hit rates only its ends carry information (the
    # interpolation between them is flat anyway): drop the middle points.
    keep = np.ones(xs_arr.size, dtype=bool)
    keep[1:-1] = ~((fitted[1:-1] == fitted[:-2]) & (fitted[1:-1] == fitted[2:]))
    return TableHitCurve(tuple(xs_arr[keep]), tuple(fitted[keep]), label=label)
