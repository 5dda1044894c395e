"""Systems for a run: a policy by name, built with what it is handed.

The policy package holds pure decision objects; this module is where they
meet the world: it reads BASIN's cliff profile from the catalogue, fits or
loads its peak-context predictor, hands Continuum the deployment's prefill
costs, and checks every parameter before anything runs. The simulator's
experiments, the gateway and the emulator all build their policies here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from basin.catalog import Deployment, HardwareProfile, load_hardware
from basin.errors import BasinInputError
from basin.policy.base import Policy
from basin.policy.basin import BasinPaperPolicy, BasinPolicy, BasinPriorPolicy, CliffSummary, GrowthCorrection
from basin.policy.composition import CompositionPolicy
from basin.policy.continuum import ContinuumPolicy, ReloadCosts
from basin.policy.params import PolicyParamError
from basin.policy.registry import policy_class, policy_names

#: Build options of a system besides its policy parameters (they choose what
#: the policy is handed, so they are not settings a driver may change later).
BUILD_OPTIONS: dict[str, tuple[str, ...]] = {
    "basin": ("predictor", "profile"),
    # BASIN as the paper specifies it: handed the same predictor and profile as basin.
    "basin-paper": ("predictor", "profile"),
    "basin-prior": ("profile",),
}

DEFAULT_PREDICTOR = "ridge"

#: Display order (the paper's); systems registered later follow alphabetically.
PAPER_ORDER = ("hicache", "thunderagent", "concur", "continuum", "crossflow", "composition", "basin-prior", "basin")


def expand_systems(names: Sequence[str]) -> list[str]:
    """Replace ``all`` by every registered policy (paper order first); drop repeats."""
    registered = policy_names()
    every = [n for n in PAPER_ORDER if n in registered] + [n for n in registered if n not in PAPER_ORDER]
    out: list[str] = []
    for name in names:
        for n in (every if name == "all" else [name]):
            if n not in out:
                out.append(n)
    unknown = [n for n in out if n not in registered]
    if unknown:  # fail before any simulation
        raise BasinInputError(f"unknown system(s) {', '.join(unknown)}: use one of {', '.join(registered)} or all")
    return out


@dataclass(frozen=True, slots=True)
class RunContext:
    """What a run knows that a policy may be built from."""

    #: The deployment, with the run's host tier applied (None: unknown, as at a gateway).
    deployment: Deployment | None = None
    #: The workload preset or file the sessions come from (fits the ridge predictor).
    workload: str | None = None
    #: The hardware of the deployment (None: read from the deployment's own).
    hardware: HardwareProfile | None = None
    #: Whether the deployment's own host tier was overridden (profiles are kept per tier).
    host_ratio: float | None = None

    def hardware_profile(self) -> HardwareProfile | None:
        if self.hardware is not None:
            return self.hardware
        return load_hardware(self.deployment.hardware) if self.deployment is not None else None


def system_names() -> list[str]:
    return policy_names()


def build_policy(system: str, params: Mapping[str, object] | None = None,
                 context: RunContext | None = None) -> Policy:
    """The policy of ``system`` with ``params`` (its parameters and build
    options), for the run ``context`` describes. Bad names, types and ranges
    are refused here, before a run starts."""
    cls = policy_class(system)
    context = context or RunContext()
    values = dict(params or {})
    options = {k: values.pop(k) for k in BUILD_OPTIONS.get(system, ()) if k in values}
    unknown = sorted(set(values) - set(cls.Params.names()))
    if unknown:
        known = sorted(cls.Params.names()) + list(BUILD_OPTIONS.get(system, ()))
        raise PolicyParamError(system, unknown[0], f"unknown; known parameters: {', '.join(known) or '(none)'}")
    policy_params = cls.Params.from_mapping(values)
    if cls in (BasinPolicy, BasinPaperPolicy, BasinPriorPolicy):
        profile = _option_text(system, options, "profile")
        cliff = cliff_summary(context, profile)
        if cls is BasinPriorPolicy:
            return BasinPriorPolicy(policy_params, cliff=cliff)  # type: ignore[arg-type]
        from basin.predict.peak import make_predictor

        spec = _option_text(system, options, "predictor") or DEFAULT_PREDICTOR
        predictor = make_predictor(spec, context.workload)
        basin_cls = BasinPaperPolicy if cls is BasinPaperPolicy else BasinPolicy
        return basin_cls(policy_params, predictor=predictor,  # type: ignore[arg-type]
                         cliff=cliff, correction=_correction(system, policy_params, predictor, spec))
    if cls in (ContinuumPolicy, CompositionPolicy):
        hw = context.hardware_profile()
        costs = ReloadCosts.from_prefill(hw.prefill) if hw is not None else None
        return cls(policy_params, costs=costs)  # type: ignore[arg-type]
    return cls(policy_params)


def _correction(system: str, params: object, predictor: object, spec: str) -> GrowthCorrection | None:
    """The fitted online correction BASIN is handed when ``online_correction`` is on."""
    if not getattr(params, "online_correction", False):
        return None
    coefficients = getattr(predictor, "growth_coefficients", None)
    if coefficients is None:
        raise PolicyParamError(system, "online_correction",
                               f"the predictor '{spec}' carries no fitted growth model; use a calibrated "
                               "predictor such as policy_params.predictor=ridge:q=0.9 (or gbt, quantile, auto), "
                               "or leave online_correction off")
    return GrowthCorrection(**coefficients())


def _option_text(system: str, options: Mapping[str, object], name: str) -> str | None:
    value = options.get(name)
    if value is not None and not isinstance(value, str):
        raise PolicyParamError(system, name, f"expected text, got {value!r}")
    return value


def cliff_summary(context: RunContext, profile: str | None = None) -> CliffSummary:
    """What BASIN needs of the offline cliff profile: ``profile`` (a file),
    else the shipped profile of the deployment as run (its cache tier and
    router) and the workload (falling back to the default workload's), else
    the reference curve without shedding (no profile, no critical rate).
    ``origin`` says which."""
    from basin.catalog.cliff_profiles import DEFAULT_WORKLOAD, load_profile, profile_path_as_run

    dep = context.deployment
    path = profile
    if path is None and dep is not None:
        for wl in dict.fromkeys([context.workload or DEFAULT_WORKLOAD, DEFAULT_WORKLOAD]):
            candidate = profile_path_as_run(dep, wl)
            if candidate.exists():
                path = str(candidate)
                break
    if path is not None:
        prof = load_profile(path)
        return CliffSummary(prof.kappa, prof.x_knee, prof.lambda_c_per_min, origin=str(path))
    if dep is None:
        return CliffSummary()
    return CliffSummary(origin=f"reference curve; no cliff profile of {dep.name} as run, so no critical rate: "
                               "no shedding")


__all__ = ["BUILD_OPTIONS", "RunContext", "build_policy", "cliff_summary",
           "system_names"]
