"""The model's own classification over a grid of deployments: which resource
limits service first, by the fluid model alone.

The grid is P:D 1:1, 1:2, 1:3 on the H100 profile (``h100-nvl``, the
calibrated one), GPU-only or host tiers 2x, 10x, 40x, tool time x1, x3, x10:
36 deployments (:data:`GRID_SHAPES`, :data:`GRID_HOST_RATIOS`,
:data:`GRID_TOOL_TIMES`). For each, :func:`grid_model` builds the fluid model of the
workload the simulator's ramps run (terminal-bench, :data:`GRID_SESSIONS`
sessions, tool gaps scaled) and :func:`model_limits` classifies it
(:func:`basin.model.resources.classify_limit`).

Checking these verdicts against the simulator is an experiment, not part of
the model: the load ramps, the first-limit detection, the run cache and the
scores are :mod:`basin.experiments.classify` (``basin model classify``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from basin.model.hitcurve import HitCurve
from basin.model.params import WorkloadInput, derive_params, load_workload, resolve_deployment
from basin.model.resources import DEFAULT_TOLERANCE, LimitClassification, classify_limit
from basin.model.throughput import FluidModel
from basin.workload.records import Workload

GRID_SHAPES: tuple[str, ...] = ("1p1d-h100", "1p2d-h100", "1p3d-h100")
GRID_HOST_RATIOS: tuple[float, ...] = (0.0, 2.0, 10.0, 40.0)
GRID_TOOL_TIMES: tuple[float, ...] = (1.0, 3.0, 10.0)
#: Sessions in the grid's workload (the pool each simulator ramp draws from).
GRID_SESSIONS = 2000
#: The grid's workload preset.
GRID_WORKLOAD = "terminal-bench"


@dataclass(frozen=True, slots=True)
class GridPoint:
    """One deployment of the grid."""

    deployment: str
    host_ratio: float
    tool_time: float

    @property
    def label(self) -> str:
        tier = "GPU" if self.host_ratio == 0 else f"host{self.host_ratio:g}x"
        return f"{self.deployment}/{tier}/tools x{self.tool_time:g}"

    def to_dict(self) -> dict[str, Any]:
        return {"deployment": self.deployment, "host_ratio": self.host_ratio, "tool_time": self.tool_time}


def default_grid() -> tuple[GridPoint, ...]:
    return tuple(GridPoint(d, h, t) for d in GRID_SHAPES for h in GRID_HOST_RATIOS for t in GRID_TOOL_TIMES)


@lru_cache(maxsize=16)
def grid_workload(tool_time: float) -> Workload:
    """The grid's workload with tool gaps scaled by ``tool_time``."""
    return load_workload(WorkloadInput(name=GRID_WORKLOAD, sessions=GRID_SESSIONS, tool_time=tool_time))


def grid_model(point: GridPoint, curve: HitCurve) -> FluidModel:
    """The fluid model of one grid deployment (the workload the ramps run)."""
    dep, hw = resolve_deployment(point.deployment, point.host_ratio)
    wl = f"{GRID_WORKLOAD}, tools x{point.tool_time:g}" if point.tool_time != 1 else GRID_WORKLOAD
    params = derive_params(dep, hw, grid_workload(point.tool_time), curve.knee_ratio, curve.label,
                           workload_label=wl)
    return FluidModel(params, curve)


def model_limits(points: Sequence[GridPoint], curve: HitCurve, tolerance: float = DEFAULT_TOLERANCE
                 ) -> dict[GridPoint, tuple[FluidModel, LimitClassification]]:
    """The model and its first-limit classification of every point."""
    out: dict[GridPoint, tuple[FluidModel, LimitClassification]] = {}
    for pt in points:
        m = grid_model(pt, curve)
        out[pt] = (m, classify_limit(m, tolerance))
    return out
