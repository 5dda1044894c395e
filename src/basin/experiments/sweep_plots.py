"""The plots a sweep feeds: a small registry of kinds, each checked against
the sweep before any run and drawn from the sweep's rows afterwards.

- ``heatmap``: a summary field over two axes (``x``, ``y``), one panel per
  system, averaged over seeds; with ``field: trapped`` each cell shows
  "trapped in k of n seeds".
- ``line``: a summary field over one axis, one line per system: the mean over
  seeds, with their range shaded; ``trapped`` gives the share of seeds trapped.

A plot shows every axis of the sweep: an axis with more than one value that is
neither on the plot nor ``seed`` (averaged over) is refused, since averaging
over it would hide it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from basin.catalog.files import close_names
from basin.errors import BasinInputError
from basin.plotting import new_figure, save_figure

if TYPE_CHECKING:
    from basin.experiments.sweep import PlotSpec, Sweep

Row = Mapping[str, Any]


def _where(sweep: Sweep, i: int) -> str:
    return f"{sweep.path}: field 'plot.{i}" if len(sweep.spec.plot) > 1 else f"{sweep.path}: field 'plot"


def check_plots(sweep: Sweep) -> None:
    """Refuse, before any run, a plot that names no field or axis of the sweep
    or that would hide one of its axes."""
    from basin.experiments.sweep import TRAPPED, numeric_summary_fields

    shown_fields = (*numeric_summary_fields(), TRAPPED)
    axes = [a for a in sweep.axis_values if a != "system"]
    for i, spec in enumerate(sweep.spec.plot):
        where = _where(sweep, i)
        if spec.field not in shown_fields:
            close = close_names(spec.field, list(shown_fields))
            raise BasinInputError(f"{where}.field': '{spec.field}' is not a number of the run summary"
                                  + (f"; did you mean {' or '.join(close)}?" if close else "")
                                  + f" (fields: {', '.join(shown_fields)})")
        on_plot = [spec.x] + ([spec.y] if spec.y is not None else [])
        for name, label in zip(on_plot, ("x", "y")):
            if name not in axes:
                close = close_names(name, axes)
                raise BasinInputError(f"{where}.{label}': '{name}' is not an axis of this sweep"
                                      + (f"; did you mean {' or '.join(close)}?" if close else "")
                                      + f" (axes: {', '.join(axes)})")
        if spec.kind == "heatmap" and (spec.y is None or spec.y == spec.x):
            raise BasinInputError(f"{where}.y': a heatmap needs a second axis, other than x ({spec.x}); "
                                  f"give y: one of {', '.join(a for a in axes if a != spec.x) or '(none)'}")
        if spec.kind == "line" and spec.y is not None:
            raise BasinInputError(f"{where}.y': a line plot has one axis (x) and one line per system; "
                                  "drop y, or use kind: heatmap")
        if spec.out is not None:
            supported = new_figure(1, 1).canvas.get_supported_filetypes()
            suffix = Path(spec.out).suffix.lower().lstrip(".")
            if Path(spec.out).name != spec.out or spec.out.startswith("."):
                raise BasinInputError(f"{where}.out': '{spec.out}' is a path; give a file name, written into "
                                      "the sweep's output folder")
            if suffix and suffix not in supported:
                raise BasinInputError(f"{where}.out': cannot write a figure as '.{suffix}'; end the name in one "
                                      f"of {', '.join('.' + s for s in sorted(supported))}")
        hidden = [a for a in axes if a not in on_plot and a != "seed" and len(sweep.axis_values[a]) > 1]
        if hidden:
            raise BasinInputError(f"{where}': axis {', '.join(hidden)} has several values but the {spec.kind} "
                                  f"shows only {' and '.join(on_plot)} per system (averaging over seeds); put "
                                  "it on the plot, give it one value, or split the sweep")


def _cell(rows: Sequence[Row], field: str) -> tuple[float, float, float, str]:
    """(mean, low, high, label) of ``field`` over the rows (the seeds of one cell)."""
    from basin.experiments.sweep import TRAPPED, is_finite

    if not rows:
        return math.nan, math.nan, math.nan, ""
    if field == TRAPPED:
        k = sum(1 for r in rows if r.get("state") == "trapped")
        share = k / len(rows)
        return share, share, share, f"{k}/{len(rows)}"
    values = [float(r[field]) for r in rows if is_finite(r.get(field))]
    if not values:
        return math.nan, math.nan, math.nan, "-"
    mean = float(np.mean(values))
    return mean, min(values), max(values), f"{mean:.3g}"


def _match(rows: Sequence[Row], coords: Mapping[str, Any]) -> list[Row]:
    return [r for r in rows if all(r.get(k) == v for k, v in coords.items())]


def _ticks(values: Sequence[Any]) -> list[str]:
    return [f"{v:g}" if isinstance(v, float) else str(v) for v in values]


def _label(spec: PlotSpec) -> str:
    from basin.experiments.sweep import TRAPPED

    return "trapped (share of seeds)" if spec.field == TRAPPED else spec.field


def _title(sweep: Sweep, spec: PlotSpec) -> str:
    return spec.title or f"{sweep.name}: {_label(spec)}"


def draw_heatmap(sweep: Sweep, spec: PlotSpec, rows: Sequence[Row], out: Path) -> Path:
    from basin.experiments.sweep import TRAPPED

    assert spec.y is not None  # check_plots refused a heatmap without one
    xs, ys = sweep.axis_values[spec.x], sweep.axis_values[spec.y]
    systems = sweep.systems
    grids = []
    for system in systems:
        grid = np.full((len(ys), len(xs)), np.nan)
        labels = [["" for _ in xs] for _ in ys]
        for j, yv in enumerate(ys):
            for i, xv in enumerate(xs):
                mean, _, _, text = _cell(_match(rows, {spec.x: xv, spec.y: yv, "system": system}), spec.field)
                grid[j, i], labels[j][i] = mean, text
        grids.append((grid, labels))
    finite = [g[np.isfinite(g)] for g, _ in grids]
    every = np.concatenate(finite) if finite else np.array([])
    trapped = spec.field == TRAPPED
    vmin, vmax = (0.0, 1.0) if trapped else ((float(every.min()), float(every.max())) if every.size else (0, 1))
    fig = new_figure(max(4.5, 0.55 * len(xs) + 2.2) * len(systems) + 0.8, max(3.2, 0.45 * len(ys) + 1.8))
    axes = fig.subplots(1, len(systems), squeeze=False)[0]
    image = None
    for ax, system, (grid, labels) in zip(axes, systems, grids):
        image = ax.imshow(grid, origin="lower", aspect="auto", cmap="Reds" if trapped else "viridis",
                          vmin=vmin, vmax=vmax)
        for j in range(len(ys)):
            for i in range(len(xs)):
                share = (grid[j, i] - vmin) / ((vmax - vmin) or 1.0)
                # Reds is dark at its top, viridis at its bottom: white text there.
                dark = not math.isnan(share) and (share > 0.5 if trapped else share < 0.5)
                ax.text(i, j, labels[j][i], ha="center", va="center", fontsize=8,
                        color="white" if dark else "black")
        ax.set_xticks(range(len(xs)), _ticks(xs))
        ax.set_yticks(range(len(ys)), _ticks(ys))
        ax.set_xlabel(spec.x)
        ax.set_ylabel(spec.y)
        ax.set_title(system, fontsize=10)
    if image is not None:
        fig.colorbar(image, ax=list(axes), label=_label(spec), shrink=0.9)
    fig.suptitle(_title(sweep, spec))
    return save_figure(fig, out)


def draw_line(sweep: Sweep, spec: PlotSpec, rows: Sequence[Row], out: Path) -> Path:
    from basin.experiments.sweep import is_finite

    xs = sweep.axis_values[spec.x]
    numeric = all(is_finite(v) for v in xs)
    pos = np.array([float(v) for v in xs]) if numeric else np.arange(len(xs), dtype=float)
    fig = new_figure(6.5, 4.0)
    ax = fig.subplots()
    for k, system in enumerate(sweep.systems):
        cells = [_cell(_match(rows, {spec.x: xv, "system": system}), spec.field) for xv in xs]
        mean = np.array([c[0] for c in cells])
        low, high = np.array([c[1] for c in cells]), np.array([c[2] for c in cells])
        ax.plot(pos, mean, marker="o", ms=4, lw=1.5, color=f"C{k}", label=system)
        if np.any(high > low):
            ax.fill_between(pos, low, high, color=f"C{k}", alpha=0.18, lw=0)
    if not numeric:
        ax.set_xticks(pos, _ticks(xs))
    ax.set_xlabel(spec.x)
    ax.set_ylabel(_label(spec) + (" (mean; range over seeds shaded)" if len(sweep.axis_values["seed"]) > 1 else ""))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(_title(sweep, spec))
    return save_figure(fig, out)


#: Plot kinds by name: each draws one figure from the sweep's rows.
PLOT_KINDS: dict[str, Callable[[Sweep, PlotSpec, Sequence[Row], Path], Path]] = {
    "heatmap": draw_heatmap,
    "line": draw_line,
}


def plot_path(sweep: Sweep, spec: PlotSpec, out_dir: Path) -> Path:
    return out_dir / (spec.out or f"{sweep.name}-{spec.kind}-{spec.field}.png")


def draw_plots(sweep: Sweep, rows: Sequence[Row], out_dir: Path) -> list[Path]:
    """Every plot of the sweep, written into ``out_dir``."""
    return [PLOT_KINDS[spec.kind](sweep, spec, rows, plot_path(sweep, spec, out_dir)) for spec in sweep.spec.plot]
