"""Figures without a display: every plot in basin-serve starts and ends here."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

DPI = 120


def new_figure(width_in: float, height_in: float) -> Figure:
    """A figure on the Agg canvas (no pyplot state, safe in worker processes)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Figure, out_png: str | os.PathLike[str]) -> Path:
    """Write a PNG, creating its directory."""
    path = Path(out_png)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path
