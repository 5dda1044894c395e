"""The plots a sweep feeds: a small registry of kinds, each checked against
the sweep before any run and drawn from the sweep's rows afterwards.

- ``heatmap``: a summary field over two axes (``x``, ``y``), one panel per
  system, averaged over seeds; with ``field: trapped`` each cell shows
  "trapped in k of n seeds".
- ``line``: a summary field over one axis, one line per system: the mean over
  seeds, with their range shaded; ``trapped`` gives the share of seeds trapped.
- ``frontier``: for each value of ``y`` (and of ``group``, one panel each) and
  each system, the highest value of the numeric axis ``x`` up to which the
  runs hold: at most ``max_trapped`` of the seeds end in a ``fails`` state at
  that value and at every lower one. Each bar is coloured by how the runs at
  the first value that fails went wrong: reuse lost (trapped, or the last
  window's hit rate 0.10 or more below the pre-surge one: the cache limits
  first) or reuse held (compute limits first).
- ``relative``: ``field`` of every value of ``x`` (typically ``case``) divided
  by its value at ``reference``, paired by seed (and every other coordinate),
  as horizontal bars spanning the seeds with the median marked; one bar per
  value of ``y`` and system.

A plot shows every axis of the sweep: an axis with more than one value that is
neither on the plot nor ``seed`` (averaged over) is refused, since averaging
over it would hide it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from basin.catalog.files import close_names
from basin.errors import BasinInputError
from basin.experiments.plots import LINE_STYLES, MARKERS
from basin.experiments.sweep_spec import TRAPPED, PlotSpec, Sweep, is_finite, numeric_summary_fields
from basin.metrics.state import LabelRule
from basin.plotting import new_figure, save_figure

Row = Mapping[str, Any]


def _where(sweep: Sweep, i: int) -> str:
    return f"{sweep.path}: field 'plot.{i}" if len(sweep.spec.plot) > 1 else f"{sweep.path}: field 'plot"


def check_plots(sweep: Sweep) -> None:
    """Refuse, before any run, a plot that names no field or axis of the sweep
    or that would hide one of its axes."""
    shown_fields = (*numeric_summary_fields(), TRAPPED)
    axes = [a for a in sweep.axis_values if a != "system"]
    for i, spec in enumerate(sweep.spec.plot):
        where = _where(sweep, i)
        foreign = sorted(f for f in spec.model_fields_set & set(_KIND_OPTIONS["all"])
                         if f not in _KIND_OPTIONS[spec.kind])
        if foreign:
            users = [k for k, opts in _KIND_OPTIONS.items() if foreign[0] in opts and k != "all"]
            raise BasinInputError(f"{where}.{foreign[0]}': a {spec.kind} plot takes no '{foreign[0]}' (that is an "
                                  f"option of kind {' or '.join(users)}); drop it")
        if spec.kind == "frontier" and "field" in spec.model_fields_set and spec.field != TRAPPED:
            raise BasinInputError(f"{where}.field': a frontier shows where runs stop recovering (the share of "
                                  f"seeds in a 'fails' state), not '{spec.field}'; drop field")
        if spec.field not in shown_fields:
            close = close_names(spec.field, list(shown_fields))
            raise BasinInputError(f"{where}.field': '{spec.field}' is not a number of the run summary"
                                  + (f"; did you mean {' or '.join(close)}?" if close else "")
                                  + f" (fields: {', '.join(shown_fields)})")
        named = [(spec.x, "x"), *([(spec.y, "y")] if spec.y is not None else []),
                 *([(spec.group, "group")] if spec.group is not None else [])]
        on_plot = [n for n, _ in named]
        for name, label in named:
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
        for (name, label), (other, other_label) in ((a, b) for j, a in enumerate(named) for b in named[:j]):
            if name == other:
                raise BasinInputError(f"{where}.{label}': '{name}' is already {other_label}; each axis once")
        if spec.kind == "frontier":
            _check_frontier(sweep, spec, where)
        if spec.kind == "relative":
            _check_relative(sweep, spec, where)
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


#: The options of each kind besides kind, x, field, out and title ("all": every such option).
_KIND_OPTIONS: dict[str, tuple[str, ...]] = {
    "all": ("y", "group", "fails", "max_trapped", "reference"),
    "heatmap": ("y",),
    "line": ("y",),  # refused below with its own message
    "frontier": ("y", "group", "fails", "max_trapped"),
    "relative": ("y", "reference"),
}
#: A frontier's failing states unless its ``fails`` says otherwise.
DEFAULT_FAILS = ("trapped",)
#: A frontier's largest failing share of seeds at a value that holds (a majority fails).
DEFAULT_MAX_TRAPPED = 0.5


def _check_frontier(sweep: Sweep, spec: PlotSpec, where: str) -> None:
    xs = sweep.axis_values[spec.x]
    if not all(is_finite(v) for v in xs):
        raise BasinInputError(f"{where}.x': a frontier searches a numeric axis (a load, a surge size); "
                              f"'{spec.x}' has the values {', '.join(_ticks(xs))}")
    if len(xs) < 2:
        raise BasinInputError(f"{where}.x': '{spec.x}' has one value; a frontier needs several to search")
    if spec.fails is not None and not spec.fails:
        raise BasinInputError(f"{where}.fails': no state given; list the states that count as not "
                              "recovered, e.g. [trapped, overloaded]")


def _check_relative(sweep: Sweep, spec: PlotSpec, where: str) -> None:
    if spec.field == TRAPPED:
        raise BasinInputError(f"{where}.field': a relative plot divides a number of the run summary by its "
                              "reference value; 'trapped' is a share of seeds: use a heatmap or line")
    values = sweep.axis_values[spec.x]
    if spec.reference is None:
        raise BasinInputError(f"{where}.reference': a relative plot needs the value of x ({spec.x}) the others "
                              f"are divided by; give reference: one of {', '.join(_ticks(values))}")
    if spec.reference not in values:
        close = close_names(str(spec.reference), [str(v) for v in values])
        raise BasinInputError(f"{where}.reference': {spec.reference!r} is not a value of {spec.x}"
                              + (f"; did you mean {' or '.join(close)}?" if close else "")
                              + f" (values: {', '.join(_ticks(values))})")
    if len(values) < 2:
        raise BasinInputError(f"{where}.x': '{spec.x}' has only the reference value; nothing to compare")


def _cell(rows: Sequence[Row], field: str) -> tuple[float, float, float, str]:
    """(mean, low, high, label) of ``field`` over the rows (the seeds of one cell)."""
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


#: Summary fields in words, with their units.
FIELD_LABELS = {
    "goodput_per_h": "goodput (sessions/h)", "active_sessions_final": "active sessions at the end",
    "hit_rate_final": "prefix hit rate, last window", "hit_rate_pre": "prefix hit rate before the surge",
    "completed_fraction": "sessions completed (fraction)", "shed_fraction": "sessions shed (fraction)",
    "slowdown_p50": "median session slowdown (x unloaded)", "slowdown_p90": "p90 session slowdown (x unloaded)",
    "ttft_p50_final_s": "median TTFT, last window (s)", "l_late_s": "L_late (s)",
}
#: Scenario keys in words, with their units (others: the key, its unit from its suffix).
AXIS_LABELS = {
    "surge.factor": "surge.factor (arrival rate in the surge, x the base rate)",
    "arrivals.base_per_min": "arrivals.base_per_min (sessions/min)",
    "host_ratio": "host_ratio (host tier, x the GPU prefix cache)",
    "arrivals.base_fraction_of_critical": "arrivals.base_fraction_of_critical (x the critical rate)",
}
_SUFFIX_UNITS = (("_per_min", "sessions/min"), ("_min", "min"), ("_s", "s"), ("_tokens", "tokens"))


def _unit_label(name: str) -> str:
    unit = next((u for suffix, u in _SUFFIX_UNITS if name.endswith(suffix)), None)
    return f"{name} ({unit})" if unit else name


def _label(spec: PlotSpec) -> str:
    if spec.field == TRAPPED:
        return "trapped (share of seeds)"
    return FIELD_LABELS.get(spec.field) or _unit_label(spec.field)


def axis_label(sweep: Sweep, name: str, rows: Sequence[Row]) -> str:
    """An axis in words with its unit; a derived axis with the rate it is a
    multiple of (the critical rate, the scenario's base rate or a number) in
    sessions per minute, read from the runs' resolved rates."""
    derived = sweep.spec.derived.get(name)
    if derived is None:
        return AXIS_LABELS.get(name) or _unit_label(name)
    ratios = {round(float(r[f"{name}.per_min"]) / float(r[name]), 6) for r in rows
              if r.get(name) and r.get(f"{name}.per_min") is not None}
    rate = f", {next(iter(ratios)):.3g}/min" if len(ratios) == 1 else ""
    what = "after-surge rate" if derived.sets == "arrivals.rate_changes" else "base rate"
    if derived.of == "critical":
        return f"{name}\n({what}, x the critical rate λc{rate})"
    if derived.of == "base":
        return f"{name}\n({what}, x the scenario's base rate{rate})"
    return f"{name}\n({what}, x {derived.of:g}/min)"


def _title(sweep: Sweep, spec: PlotSpec) -> str:
    return spec.title or f"{sweep.name}: {_label(spec)}"


def draw_heatmap(sweep: Sweep, spec: PlotSpec, rows: Sequence[Row], out: Path) -> Path:
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
        ax.set_xlabel(axis_label(sweep, spec.x, rows))
        ax.set_ylabel(axis_label(sweep, spec.y, rows))
        ax.set_title(system, fontsize=10)
    if image is not None:
        fig.colorbar(image, ax=list(axes), label=_label(spec), shrink=0.9)
    fig.suptitle(_title(sweep, spec))
    return save_figure(fig, out)


def draw_line(sweep: Sweep, spec: PlotSpec, rows: Sequence[Row], out: Path) -> Path:
    xs = sweep.axis_values[spec.x]
    numeric = all(is_finite(v) for v in xs)
    pos = np.array([float(v) for v in xs]) if numeric else np.arange(len(xs), dtype=float)
    fig = new_figure(6.5, 4.0)
    ax = fig.subplots()

    for k, system in enumerate(sweep.systems):
        cells = [_cell(_match(rows, {spec.x: xv, "system": system}), spec.field) for xv in xs]
        mean = np.array([c[0] for c in cells])
        low, high = np.array([c[1] for c in cells]), np.array([c[2] for c in cells])
        # Colour, line style and marker each tell the systems apart (two may coincide).
        ax.plot(pos, mean, marker=MARKERS[k % len(MARKERS)], ls=LINE_STYLES[k % len(LINE_STYLES)], ms=5,
                lw=1.5, color=f"C{k % 10}", label=system, alpha=0.9)
        if np.any(high > low):
            ax.fill_between(pos, low, high, color=f"C{k}", alpha=0.18, lw=0)
    if not numeric:
        ax.set_xticks(pos, _ticks(xs))
    ax.set_xlabel(axis_label(sweep, spec.x, rows))
    ax.set_ylabel(_label(spec) + (" (mean; range over seeds shaded)" if len(sweep.axis_values["seed"]) > 1 else ""))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(_title(sweep, spec))
    return save_figure(fig, out)


# ---------------------------------------------------------------- frontier
@dataclass(frozen=True, slots=True)
class FrontierCell:
    """Where the runs of one bar of a frontier stop holding."""

    system: str
    y: Any
    group: Any
    #: The highest value of x up to which every value holds; None: the lowest already fails.
    frontier: float | None
    #: The lowest value of x that fails; None: every value holds (the frontier is a lower bound).
    first_fail: float | None
    #: What gave way first at ``first_fail``, by most failing seeds: ``cache`` (reuse
    #: lost: trapped, or a final hit rate 0.10 or more below the pre-surge one)
    #: or ``compute`` (degraded with reuse held); None when nothing fails.
    limit: str | None
    #: A value above ``first_fail`` holds again (the runs are not monotone in x).
    holds_again: bool
    #: Failing seeds / seeds at each value of x, in order.
    shares: tuple[tuple[float, int, int], ...]


def frontier_cells(sweep: Sweep, spec: PlotSpec, rows: Sequence[Row]) -> list[FrontierCell]:
    """Every bar of a frontier plot, for its figure and for reading off numbers."""
    fails = set(spec.fails or DEFAULT_FAILS)
    limit_share = DEFAULT_MAX_TRAPPED if spec.max_trapped is None else spec.max_trapped
    xs = sorted(float(v) for v in sweep.axis_values[spec.x])
    ys = sweep.axis_values[spec.y] if spec.y is not None else (None,)
    groups = sweep.axis_values[spec.group] if spec.group is not None else (None,)
    cells = []
    for system in sweep.systems:
        for gv in groups:
            for yv in ys:
                where = {"system": system, **({spec.y: yv} if spec.y is not None else {}),
                         **({spec.group: gv} if spec.group is not None else {})}
                frontier: float | None = None
                first_fail: float | None = None
                limit: str | None = None
                again = False
                shares = []
                for xv in xs:
                    runs = [r for r in _match(rows, where) if float(r[spec.x]) == xv]
                    states = [str(r.get("state")) for r in runs if r.get("state") in fails]
                    shares.append((xv, len(states), len(runs)))
                    holds = bool(runs) and len(states) / len(runs) <= limit_share + 1e-12
                    if first_fail is None:
                        if holds:
                            frontier = xv
                        elif runs:
                            first_fail = xv
                            lost = [_reuse_lost(r) for r in runs if r.get("state") in fails]
                            limit = "cache" if 2 * sum(lost) >= len(lost) else "compute"
                    elif holds:
                        again = True
                cells.append(FrontierCell(system, yv, gv, frontier, first_fail, limit, again, tuple(shares)))
    return cells


def _reuse_lost(row: Row) -> bool:
    """The run failed with its cache: trapped, or its last window's hit rate
    at least 0.10 below the pre-surge one (an overload that began in the last
    window with reuse already gone is the cache's too)."""
    if row.get("state") == "trapped":
        return True
    pre, final = row.get("hit_rate_pre"), row.get("hit_rate_final")
    if not (is_finite(pre) and is_finite(final)):
        return False
    return float(final) <= float(pre) - LabelRule().min_hit_rate_drop + 1e-12  # type: ignore[arg-type]


#: Bar colours of a frontier by what gave way first at its first failing value.
_LIMIT_STYLE: dict[str | None, tuple[str, str]] = {
    "cache": ("C3", "fails with reuse lost (cache first)"),
    "compute": ("C0", "fails with reuse held (compute first)"),
    None: ("0.8", "holds over the whole grid (a lower bound)"),
}


def draw_frontier(sweep: Sweep, spec: PlotSpec, rows: Sequence[Row], out: Path) -> Path:
    cells = frontier_cells(sweep, spec, rows)
    ys = sweep.axis_values[spec.y] if spec.y is not None else (None,)
    groups = sweep.axis_values[spec.group] if spec.group is not None else (None,)
    systems = sweep.systems
    xs = sorted(float(v) for v in sweep.axis_values[spec.x])
    fig = new_figure(max(4.0, 3.3 * len(groups)) + 0.5, max(2.6, 0.42 * len(ys) + 1.6) * len(systems) + 0.9)
    axes = fig.subplots(len(systems), len(groups), squeeze=False, sharex=True)
    used: dict[str | None, None] = {}
    for si, system in enumerate(systems):
        for gi, gv in enumerate(groups):
            ax = axes[si][gi]
            for j, yv in enumerate(ys):
                cell = next(c for c in cells if c.system == system and c.group == gv and c.y == yv)
                colour, _ = _LIMIT_STYLE[cell.limit]
                used[cell.limit] = None
                width = cell.frontier if cell.frontier is not None else 0.0
                ax.barh(j, width, height=0.7, color=colour, hatch="//" if cell.first_fail is None else None,
                        edgecolor="0.4" if cell.first_fail is None else colour)
                if cell.frontier is None:
                    text = f"< {xs[0]:g}"
                elif cell.first_fail is None:
                    text = f">= {cell.frontier:g}"
                else:
                    text = f"{cell.frontier:g}" + ("*" if cell.holds_again else "")
                ax.text(width + 0.01 * xs[-1], j, text, va="center", ha="left", fontsize=8)
            ax.set_yticks(range(len(ys)), _ticks(ys) if spec.y is not None else [""])
            ax.set_xlim(0, xs[-1] * 1.15)
            ax.grid(True, axis="x", alpha=0.3)
            title = " ".join(p for p in ((f"{spec.group}={_ticks([gv])[0]}" if spec.group is not None else ""),
                                         (system if len(systems) > 1 else "")) if p)
            if title:
                ax.set_title(title, fontsize=10)
            if gi == 0 and spec.y is not None:
                ax.set_ylabel(axis_label(sweep, spec.y, rows))
            if si == len(systems) - 1:
                ax.set_xlabel(f"highest value that holds of {axis_label(sweep, spec.x, rows)}")
    # Lazy: matplotlib takes 0.1-0.3 s to import; only this path uses it.
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=_LIMIT_STYLE[k][0], label=_LIMIT_STYLE[k][1],
                     hatch="//" if k is None else None, edgecolor="0.4") for k in used]
    fig.legend(handles=handles, loc="outside lower center", ncols=min(3, len(handles)), fontsize=8)
    share = DEFAULT_MAX_TRAPPED if spec.max_trapped is None else spec.max_trapped
    fails = "/".join(spec.fails or DEFAULT_FAILS)
    fig.suptitle(spec.title or f"{sweep.name}: highest {spec.x} with at most {share:.0%} of seeds {fails}"
                 + (" (* holds again higher up)" if any(c.holds_again for c in cells) else ""), fontsize=10)
    return save_figure(fig, out)


# ---------------------------------------------------------------- relative
@dataclass(frozen=True, slots=True)
class RelativeBar:
    """One bar of a relative plot: the ratios to the reference over the seeds."""

    x: Any
    y: Any
    system: str
    ratios: tuple[float, ...]

    @property
    def median(self) -> float:
        return float(np.median(self.ratios)) if self.ratios else math.nan


def relative_bars(sweep: Sweep, spec: PlotSpec, rows: Sequence[Row]) -> list[RelativeBar]:
    """Every bar of a relative plot: each row's field over the reference row
    with the same other coordinates (the same seed, system, ...)."""
    others = [c for c in sweep.coord_columns if c not in (spec.x, f"{spec.x}.per_min")]
    reference: dict[tuple[Any, ...], float] = {}
    for r in rows:
        if r.get(spec.x) == spec.reference and is_finite(r.get(spec.field)):
            reference[tuple(r.get(c) for c in others)] = float(r[spec.field])
    ys = sweep.axis_values[spec.y] if spec.y is not None else (None,)
    bars = []
    for xv in sweep.axis_values[spec.x]:
        if xv == spec.reference:
            continue
        for yv in ys:
            for system in sweep.systems:
                ratios = []
                for r in _match(rows, {spec.x: xv, "system": system, **({spec.y: yv} if spec.y else {})}):
                    ref = reference.get(tuple(r.get(c) for c in others))
                    if ref is not None and ref != 0 and is_finite(r.get(spec.field)):
                        ratios.append(float(r[spec.field]) / ref)
                bars.append(RelativeBar(xv, yv, system, tuple(ratios)))
    return bars


def draw_relative(sweep: Sweep, spec: PlotSpec, rows: Sequence[Row], out: Path) -> Path:
    bars = relative_bars(sweep, spec, rows)
    xs = [v for v in sweep.axis_values[spec.x] if v != spec.reference]
    series = list(dict.fromkeys((b.y, b.system) for b in bars))
    several_systems = len(sweep.systems) > 1
    height = 0.8 / len(series)
    fig = new_figure(6.8, max(3.0, 0.22 * len(xs) * len(series) + 0.3 * len(xs) + 1.4))
    ax = fig.subplots()
    finite = [v for b in bars for v in b.ratios]
    for k, (yv, system) in enumerate(series):
        label = ", ".join(p for p in ((f"{spec.y}={_ticks([yv])[0]}" if spec.y is not None else ""),
                                      (system if several_systems or spec.y is None else "")) if p)
        for i, xv in enumerate(xs):
            bar = next(b for b in bars if b.x == xv and b.y == yv and b.system == system)
            if not bar.ratios:
                continue
            centre = len(xs) - 1 - i + (len(series) - 1 - 2 * k) * height / 2
            low, high = min(bar.ratios), max(bar.ratios)
            ax.barh(centre, max(high - low, 1e-3), left=low, height=height * 0.9, color=f"C{k}", alpha=0.75,
                    label=label if i == 0 else None)
            ax.plot([bar.median] * 2, [centre - height * 0.45, centre + height * 0.45], color="black", lw=1.6)
            ax.text(max(high, 1.0) + 0.005, centre, f"{bar.median:.3f}", va="center", fontsize=7)
    ax.axvline(1.0, color="0.3", lw=1, ls="--")
    ax.set_yticks(range(len(xs)), _ticks(list(reversed(xs))))
    if finite:
        lo, hi = min(min(finite), 1.0), max(max(finite), 1.0)
        pad = 0.08 * (hi - lo or 0.1)
        ax.set_xlim(lo - pad, hi + 3 * pad)
    n_seeds = len(sweep.axis_values.get("seed", ()))
    ax.set_xlabel(f"{spec.field} / its value at {spec.x}={_ticks([spec.reference])[0]}, same seed")
    ax.set_ylabel(spec.x)
    ax.grid(True, axis="x", alpha=0.3)
    if any(lbl for lbl in ax.get_legend_handles_labels()[1]):
        ax.legend(fontsize=8, loc="best")
    ax.set_title((spec.title or f"{sweep.name}: {spec.field} relative to {spec.x}="
                  f"{_ticks([spec.reference])[0]}") + f"\nbar: range over {n_seeds} seed(s); black tick: median",
                 fontsize=10)
    return save_figure(fig, out)


#: Plot kinds by name: each draws one figure from the sweep's rows.
PLOT_KINDS: dict[str, Callable[[Sweep, PlotSpec, Sequence[Row], Path], Path]] = {
    "heatmap": draw_heatmap,
    "line": draw_line,
    "frontier": draw_frontier,
    "relative": draw_relative,
}


def plot_path(sweep: Sweep, spec: PlotSpec, out_dir: Path) -> Path:
    field = TRAPPED if spec.kind == "frontier" else spec.field
    return out_dir / (spec.out or f"{sweep.name}-{spec.kind}-{field}.png")


def draw_plots(sweep: Sweep, rows: Sequence[Row], out_dir: Path) -> list[Path]:
    """Every plot of the sweep, written into ``out_dir``."""
    return [PLOT_KINDS[spec.kind](sweep, spec, rows, plot_path(sweep, spec, out_dir)) for spec in sweep.spec.plot]
