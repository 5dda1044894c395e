"""Figures of the fluid model: the departure curve with its equilibria (the
paper's Fig. 9a), population trajectories and hit curves against measured
cliff points. The classification against the simulator (Fig. 9b) is an
experiment's figure: :func:`basin.experiments.classify.plot_classification`.

Matplotlib's object API on the Agg canvas only (no pyplot), as in
:mod:`basin.experiments.plots`: no display needed, no global state.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from basin.model.throughput import FluidModel
from basin.plotting import new_figure as _figure
from basin.plotting import save_figure as _save

if TYPE_CHECKING:

    from basin.model.analysis import Analysis
    from basin.model.dynamics import Trajectory
    from basin.model.hitcurve import HitCurve


def plot_departure_curve(analysis: Analysis, out_png: str | os.PathLike[str], *, n_max: float | None = None,
                         bounds: bool = True, sim_points: tuple[np.ndarray, np.ndarray] | None = None,
                         title: str | None = None) -> Path:
    """D(N) with the arrival line, N_s, N_u and N* marked (Fig. 9a); the three
    throughput bounds divided by K as thin lines; optionally measured
    ``(N, departures per minute)`` points of a simulator run."""
    model = analysis.model
    k = model.params.calls_per_session
    top = n_max or max(model.n_scale() * 0.6, 1.4 * (analysis.n_unstable or analysis.peak.n_star))
    n = np.linspace(0.0, top, 800)
    d = model.departures_per_min(n)
    fig = _figure(7.0, 4.2)
    ax = fig.add_subplot(1, 1, 1)
    if bounds:
        ax.plot(n, 60 * model.closed_loop_bound(n) / k, color="0.6", lw=0.9, ls=":", label="closed-loop bound")
        ax.plot(n, 60 * model.prefill_bound(n) / k, color="tab:orange", lw=0.9, ls=":", label="prefill bound")
        ax.axhline(60 * model.decode_bound() / k, color="tab:purple", lw=0.9, ls=":", label="decode bound")
    if sim_points is not None:
        ax.scatter(sim_points[0], sim_points[1], s=8, color="0.5", alpha=0.5, label="simulator (2-min windows)")
    ax.plot(n, d, color="tab:blue", lw=2.0, label="departures D(N)")
    ax.axhline(analysis.d_low_per_min, color="tab:blue", lw=0.8, ls="--",
               label=f"D_low {analysis.d_low_per_min:.2f}/min")
    ax.plot([analysis.peak.n_star], [analysis.peak.d_star_per_min], "^", color="tab:blue", ms=8,
            label=f"N* {analysis.peak.n_star:.0f}, D(N*) {analysis.peak.d_star_per_min:.2f}/min")
    if analysis.rate_per_min is not None:
        lam = analysis.rate_per_min
        ax.axhline(lam, color="tab:red", lw=1.2, label=f"arrivals {lam:g}/min")
        if analysis.n_stable is not None:
            ax.plot([analysis.n_stable], [lam], "o", color="tab:green", ms=8,
                    label=f"N_s {analysis.n_stable:.0f} (stable)")
        if analysis.n_unstable is not None:
            ax.plot([analysis.n_unstable], [lam], "o", mfc="white", mec="tab:red", mew=2, ms=8,
                    label=f"N_u {analysis.n_unstable:.0f} (unstable)")
            ax.fill_between(n, 0, lam, where=n > analysis.n_unstable, color="tab:red", alpha=0.08,
                            label="trapped: dN/dt > 0")
    ymax = max(float(np.max(d)), analysis.rate_per_min or 0.0) * 1.6
    ax.set_ylim(0, ymax)
    ax.set_xlim(0, top)
    ax.set_xlabel("active sessions N")
    ax.set_ylabel("sessions per minute")
    p = model.params
    ax.set_title(title or f"{p.deployment} ({p.workload}): departure curve")
    ax.legend(fontsize=7, loc="upper right", ncol=2)
    return _save(fig, out_png)


def plot_trajectories(trajectories: Mapping[str, Trajectory], out_png: str | os.PathLike[str], *,
                      title: str = "fluid model: population after a surge") -> Path:
    """Active sessions over time for each named trajectory, with the arrival
    rate below and each run's final unstable equilibrium dashed."""
    fig = _figure(7.0, 4.6)
    ax, ax_rate = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1])
    colors = ["tab:blue", "tab:red", "tab:green", "tab:purple", "tab:orange", "tab:brown"]
    for (name, t), c in zip(trajectories.items(), colors * 4):
        ax.plot(t.t_min, t.n, color=c, lw=1.6, label=f"{name}: {t.outcome}")
        if np.any(t.q > 0.5):
            ax.plot(t.t_min, t.q, color=c, lw=1.0, ls="-.", label=f"{name}: parked")
        if t.n_unstable is not None:
            ax.axhline(t.n_unstable, color=c, lw=0.7, ls="--")
        ax_rate.plot(t.t_min, t.rate_per_min, color=c, lw=1.0)
    ax.set_ylabel("active sessions N")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left")
    top = max(float(np.max(t.n)) for t in trajectories.values())
    ax.set_ylim(0, min(top * 1.1, 4 * max((t.n_unstable or 0) for t in trajectories.values()) or top * 1.1))
    ax_rate.set_ylabel("arrivals /min")
    ax_rate.set_xlabel("minute")
    return _save(fig, out_png)


def plot_hit_curves(curves: Sequence[HitCurve], out_png: str | os.PathLike[str], *,
                    points: tuple[np.ndarray, np.ndarray] | None = None, x_max: float = 4.0,
                    names: Sequence[str] | None = None) -> Path:
    """Hit curves against working set / cache, with measured cliff points;
    ``names`` label the curves in the legend (default: their labels)."""
    fig = _figure(6.0, 3.8)
    ax = fig.add_subplot(1, 1, 1)
    if points is not None:
        ax.scatter(points[0], points[1], s=6, color="0.6", alpha=0.5, label="simulator windows (2 min)")
    x = np.linspace(0.0, x_max, 600)
    labels = list(names) if names is not None else [c.label for c in curves]
    for c, name, color in zip(curves, labels, ["tab:blue", "tab:red", "tab:green", "tab:purple"]):
        ax.plot(x, c(x), color=color, lw=2.0, label=f"{name} (knee {c.knee_ratio:.2f}, floor {c.floor:.2f})")
    ax.set_xlim(0, x_max)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("working set / cache capacity (W / C)")
    ax.set_ylabel("prefix hit rate")
    ax.legend(fontsize=7, loc="lower left")
    return _save(fig, out_png)


def plot_model_vs_ramp(model: FluidModel, ramps: Sequence[Mapping[str, np.ndarray]], out_png: str | os.PathLike[str],
                       *, title: str | None = None) -> Path:
    """The model's D(N) against a simulator ramp's 2-minute windows (active
    sessions, call completions / K): how well the curve's shape holds."""
    fig = _figure(6.5, 3.8)
    ax = fig.add_subplot(1, 1, 1)
    k = model.params.calls_per_session
    top = 1.0
    for ts in ramps:
        minutes = np.asarray(ts["active_sessions"]).size // 2 * 2
        n = np.asarray(ts["active_sessions"], dtype=float)[:minutes].reshape(-1, 2).mean(axis=1)
        calls = np.asarray(ts["calls_completed"], dtype=float)[:minutes].reshape(-1, 2).sum(axis=1) / 2.0
        ax.scatter(n, calls / k, s=6, alpha=0.5, color="0.5")
        top = max(top, float(np.percentile(n, 90)))
    nn = np.linspace(0, top * 1.2, 600)
    ax.plot(nn, model.departures_per_min(nn), color="tab:blue", lw=2, label="model D(N)")
    ax.scatter([], [], s=6, color="0.5", label="simulator ramp, 2-min windows")
    ax.axhline(60 * model.decode_bound() / k, color="tab:purple", lw=0.9, ls=":", label="decode bound")
    ax.set_xlabel("active sessions N")
    ax.set_ylabel("sessions per minute (calls / K)")
    p = model.params
    ax.set_title(title or f"{p.deployment} ({p.workload}): model vs simulator ramp", fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, out_png)
