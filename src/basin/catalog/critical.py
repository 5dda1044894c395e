"""A deployment's critical session rate with a workload: one number, from one
ramp definition.

The critical rate is the profiled peak departure rate ``lambda_c_per_min`` of
the deployment's cliff profile (``profiles/basin/``, written by ``basin
profile``'s stepped load ramp under HiCache alone), for the deployment as run:
its cache tier and its router pick the profile. Scenarios that give their
base load as ``arrivals.base_fraction_of_critical``, sweeps with ``of:
critical``, BASIN's shedding and the docs all read this one figure. ``basin
critical-rate`` measures something else on purpose (the highest steady rate
whose runs all stay healthy) and reports it beside this one as a check.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from basin.catalog.cliff_profiles import DEFAULT_WORKLOAD, load_profile, profile_for, profile_path_as_run
from basin.catalog.deployments import Deployment
from basin.errors import BasinInputError
from basin.paths import PROFILE_DIR


class CriticalRate(BaseModel):
    """The profiled critical rate of a deployment with a workload."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    deployment: str
    workload: str
    per_min: float = Field(gt=0)
    #: The profile file it was read from (relative to the profiles directory when inside it).
    origin: str = Field(min_length=1)


def _profiled(deployment: Deployment, workload: str) -> tuple[Path, float | None]:
    """The profile file of ``deployment`` as run and its finite, positive
    ``lambda_c_per_min`` (None when the profile has none); raises when the
    deployment has no shipped profile, with the command that makes one."""
    path = profile_path_as_run(deployment, workload)
    if not path.is_file():  # profile_for raises the error that names the command making it
        profile_for(deployment.name, deployment.router, workload, deployment.host_ratio)
    prof = load_profile(path)
    rate = prof.lambda_c_per_min
    return path, (rate if 0 < rate < float("inf") else None)


def _rate(dep: Deployment, workload: str, path: Path, per_min: float) -> CriticalRate:
    try:
        shown = str(path.resolve().relative_to(PROFILE_DIR.parent))
    except ValueError:
        shown = str(path)
    return CriticalRate(deployment=dep.name, workload=workload, per_min=per_min,
                        origin=f"lambda_c_per_min of {shown}")


def critical_rate(deployment: Deployment, workload: str = DEFAULT_WORKLOAD) -> CriticalRate | None:
    """The critical rate of ``deployment`` as run (host tier and router
    applied) with ``workload``, or None when it has no cliff profile."""
    try:
        path, per_min = _profiled(deployment, workload)
    except BasinInputError:
        return None  # not a shipped deployment, or no profile made for it yet
    return None if per_min is None else _rate(deployment, workload, path, per_min)


def require_critical_rate(deployment: Deployment, workload: str, needed_for: str) -> CriticalRate:
    """As :func:`critical_rate`, but a missing profile is an error that says
    what needed it and gives the command that makes one."""
    try:
        path, per_min = _profiled(deployment, workload)
    except BasinInputError as exc:
        raise BasinInputError(f"{needed_for} needs the critical rate of deployment '{deployment.name}' "
                              f"(host tier {deployment.host_ratio:g}x, router {deployment.router}) with "
                              f"workload '{workload}': {exc}; or give the rate directly") from None
    if per_min is None:
        raise BasinInputError(f"{needed_for}: the cliff profile {path} has no finite lambda_c_per_min; "
                              "remake it with `basin profile`, or give the rate directly")
    return _rate(deployment, workload, path, per_min)
