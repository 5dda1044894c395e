"""Systems for a run: a policy by name, built with what it is handed.

The policy package holds pure decision objects; this module is where they
meet the world. Each policy class names what it is built with
(``Policy.HANDED``: a cliff profile, a peak-context predictor, reload costs)
and builds itself from it (``Policy.build``); this module makes exactly those
ingredients for the run (reads the cliff profile from the catalogue, fits or
loads the predictor, turns the deployment's prefill costs into reload costs)
and checks every parameter before anything runs. A new policy touches its own
module and one line of the registry, nothing here. The simulator's
experiments, the gateway and the emulator all build their policies here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from basin.catalog import Deployment, HardwareProfile, load_hardware
from basin.catalog.cliff_profiles import DEFAULT_WORKLOAD, load_profile, profile_path_as_run
from basin.errors import BasinInputError
from basin.policy.base import Handed, Ingredient, Policy
from basin.policy.basin import CliffSummary
from basin.policy.continuum import ReloadCosts
from basin.policy.params import PolicyParamError
from basin.policy.registry import policy_class, policy_names
from basin.predict.peak import make_predictor

#: The build option that names each ingredient a policy can be handed
#: (:attr:`basin.policy.base.Policy.HANDED`), where one names it.
OPTION_OF: dict[Ingredient, str] = {"predictor": "predictor", "cliff": "profile"}


def build_options(system: str) -> tuple[str, ...]:
    """Settings of ``system`` besides its policy parameters: what chooses the
    ingredients it is handed (so not settings a driver may change later)."""
    handed = policy_class(system).HANDED
    return tuple(option for ingredient, option in OPTION_OF.items() if ingredient in handed)


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


def build_policy(system: str, params: Mapping[str, object] | None = None,
                 context: RunContext | None = None) -> Policy:
    """The policy of ``system`` with ``params`` (its parameters and build
    options), for the run ``context`` describes. Bad names, types and ranges
    are refused here, before a run starts."""
    cls = policy_class(system)
    context = context or RunContext()
    values = dict(params or {})
    options = {k: values.pop(k) for k in build_options(system) if k in values}
    unknown = sorted(set(values) - set(cls.Params.names()))
    if unknown:
        known = sorted(cls.Params.names()) + list(build_options(system))
        raise PolicyParamError(system, unknown[0], f"unknown; known parameters: {', '.join(known) or '(none)'}")
    policy_params = cls.Params.from_mapping(values)
    return cls.build(policy_params, handed_to(system, cls.HANDED, options, context))


def handed_to(system: str, ingredients: frozenset[Ingredient], options: Mapping[str, object],
              context: RunContext) -> Handed:
    """What a run hands a policy: each ingredient it asks for, made from its
    build option and the run's context, and nothing it does not ask for."""
    cliff = predictor = spec = costs = None
    if "cliff" in ingredients:
        cliff = cliff_summary(context, _option_text(system, options, "profile"))
    if "predictor" in ingredients:
        spec = _option_text(system, options, "predictor") or DEFAULT_PREDICTOR
        predictor = make_predictor(spec, context.workload)
    if "reload_costs" in ingredients:
        hw = context.hardware_profile()
        costs = ReloadCosts.from_prefill(hw.prefill) if hw is not None else None
    return Handed(cliff=cliff, predictor=predictor, predictor_spec=spec, reload_costs=costs)


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


__all__ = ["RunContext", "build_options", "build_policy", "cliff_summary", "handed_to"]
