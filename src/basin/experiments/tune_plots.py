"""The plot of a tuning: each system's goodput at its defaults and at its best setting."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from basin.experiments.sweep_spec import is_finite
from basin.experiments.tune_report import Choice
from basin.experiments.tune_spec import Tuning
from basin.plotting import new_figure, save_figure

PLOT_FILE = "tune-goodput.png"


def draw_goodput(tuning: Tuning, choices: Mapping[str, Choice], path: Path) -> Path:
    """One panel per scenario: each system's goodput at its defaults and at
    its best setting, side by side (the best bar labelled with the ratio)."""
    n = len(tuning.scenarios)
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig = new_figure(4.2 * cols, 3.4 * rows)
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    systems = [s for s in tuning.systems if s in choices]
    x = np.arange(len(systems))
    for ax, scenario in zip(axes, tuning.scenarios):
        at = [next(sc for sc in choices[s].scenarios if sc.scenario == scenario) for s in systems]
        default = [sc.default_goodput for sc in at]
        best = [sc.best_goodput for sc in at]
        ax.bar(x - 0.2, default, 0.4, label="defaults", color="#b8c4d6")
        bars = ax.bar(x + 0.2, best, 0.4, label="best setting", color="#2d5f9a")
        for bar, sc in zip(bars, at):
            if is_finite(sc.ratio) and abs(sc.ratio - 1) >= 0.005:
                ax.annotate(f"x{sc.ratio:.2f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=7)
        ax.set_title(scenario, fontsize=10)
        ax.set_xticks(x, systems, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel("goodput (sessions/h)", fontsize=8)
        ax.tick_params(axis="y", labelsize=8)
    for ax in axes[n:]:
        ax.set_visible(False)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper right", ncols=2, fontsize=8)
    fig.suptitle(f"{tuning.name}: defaults vs the best single setting per system", fontsize=11)
    return save_figure(fig, path)
