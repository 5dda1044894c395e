"""basin.model: the fluid model of section 5 of the paper.

The session population ``N`` obeys ``dN/dt = lambda - X(N)/K`` (and, with
admission, ``dN/dt = I - D(N)``, ``dQ/dt = lambda - I``); call throughput
``X(N)`` is a smooth minimum of a closed-loop, a prefill and a decode bound,
and the prefill bound falls as the hit rate ``h(N c_bar / C)`` drops off its
cliff. From a deployment profile and workload statistics it answers whether
a deployment can be trapped and at which loads (docs/fluid-model.md).

The model reads profiles and workloads as data and never imports the
simulator or the experiments; :mod:`basin.model.classify` is the model's own
classification of a grid of deployments, and checking it against simulator
runs is an experiment (:mod:`basin.experiments.classify`).
"""

from __future__ import annotations

from basin.model.analysis import Analysis, analyze
from basin.model.curves import named_curve, simulator_curve
from basin.model.dynamics import AdmissionBudget, Trajectory, integrate, reference_budget
from basin.model.equilibria import (
    DeparturePeak,
    Equilibrium,
    departure_peak,
    drain_time_min,
    equilibria,
    low_reuse_rate,
    stable_and_unstable,
    vulnerable_band,
)
from basin.model.hitcurve import HitCurve, PaperHitCurve, TableHitCurve, fit_table, load_table_csv
from basin.model.params import FluidParams, Param, WorkloadInput, derive_params, load_workload, resolve_deployment
from basin.model.resources import LimitClassification, ResourceCondition, classify_limit, resource_condition
from basin.model.surge import SmallestSurge, smallest_trapping_surge
from basin.model.throughput import DEFAULT_SHARPNESS, FluidModel, smooth_min

__all__ = [
    "Analysis", "analyze",
    "named_curve", "simulator_curve",
    "AdmissionBudget", "Trajectory", "integrate", "reference_budget",
    "DeparturePeak", "Equilibrium", "departure_peak", "drain_time_min", "equilibria", "low_reuse_rate",
    "stable_and_unstable", "vulnerable_band",
    "HitCurve", "PaperHitCurve", "TableHitCurve", "fit_table", "load_table_csv",
    "FluidParams", "Param", "WorkloadInput", "derive_params", "load_workload", "resolve_deployment",
    "LimitClassification", "ResourceCondition", "classify_limit", "resource_condition",
    "SmallestSurge", "smallest_trapping_surge",
    "FluidModel", "smooth_min",
    "build_model",
]


def build_model(deployment: str, workload: WorkloadInput | None = None, *, host_ratio: float | None = None,
                curve: str | HitCurve = "paper", sharpness: float | None = None) -> FluidModel:
    """The model of ``deployment`` serving ``workload`` (default terminal-bench),
    in one call: the profile, the workload's statistics and a hit curve."""
    hit_curve = named_curve(curve) if isinstance(curve, str) else curve
    dep, hw = resolve_deployment(deployment, host_ratio)
    spec = workload or WorkloadInput()
    params = derive_params(dep, hw, load_workload(spec), hit_curve.knee_ratio, hit_curve.label,
                           workload_label=spec.label())
    return FluidModel(params, hit_curve, sharpness if sharpness is not None else DEFAULT_SHARPNESS)
