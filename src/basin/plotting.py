"""Figures without a display: every plot in basin-serve starts and ends here."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from basin.errors import BasinInputError

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

DPI = 120


def new_figure(width_in: float, height_in: float) -> Figure:
    """A figure on the Agg canvas (no pyplot state, safe in worker processes)."""
    # Lazy: matplotlib takes 0.1-0.3 s to import; only this path uses it.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Figure, out: str | os.PathLike[str]) -> Path:
    """Write the figure in the format its file name asks for (``.svg``,
    ``.pdf``, ``.png``, ...; PNG when there is no suffix), creating its
    directory. An unknown suffix is refused with the formats there are,
    rather than written as bytes of another format."""
    path = Path(out)
    suffix = path.suffix.lower().lstrip(".")
    supported = fig.canvas.get_supported_filetypes()
    if suffix and suffix not in supported:
        raise BasinInputError(f"{path}: cannot write a figure as '.{suffix}'; end the file name in one of "
                              f"{', '.join('.' + s for s in sorted(supported))}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format=suffix or "png")
    return path
