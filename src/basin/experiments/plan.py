"""The run plan: one simulator run, resolved once from a scenario, a system
and its parameters.

A :class:`RunPlan` is what every study makes and the one executor runs
(:func:`basin.experiments.runner.execute_plan`): ``basin run``, ``compare``,
``ablate``, ``sweep``, ``tune``, the profiler's ramps, ``critical-rate`` and
the classification grid each generate plans and reduce the results. The
plan holds what a run is derived from (the deployment with its overrides, the
hardware as the engine runs it, the arrival schedule, every parameter), so
checking a scenario before any run and running it derive them once, the same
way. It is also the store key of a sweep's run (:attr:`RunPlan.key`, the hash
of :attr:`RunPlan.config`) and its provenance record (:meth:`RunPlan.provenance`).

Identity: two plans are equal when they run the same scenario (overrides
applied) under the same system with the same parameters and report under the
same name; where a run's tables are written, and what the worker measures
from them, are outputs and not part of it (the same run written to another
folder is the same run).
"""

from __future__ import annotations

import dataclasses
import json
import platform
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import basin
from basin.catalog import (
    Deployment,
    HardwareProfile,
    load_deployment,
    load_hardware,
    require_critical_rate,
    with_host_ratio,
)
from basin.catalog.cliff_profiles import profile_path_as_run
from basin.catalog.files import close_names
from basin.diskcache import source_digest
from basin.errors import BasinInputError
from basin.experiments.scenario import InterventionSpec, Scenario, _looks_like_path, scenario_dict, scenario_path
from basin.experiments.store import code_digest, run_key
from basin.jsonvalues import json_value
from basin.metrics.summary import RunSummary
from basin.policy.params import PolicyParamError
from basin.policy.registry import policy_class, policy_names
from basin.runtables import Table
from basin.systems import RunContext, build_options, cliff_summary
from basin.workload.arrivals import ArrivalSchedule, PoissonSchedule, RateChange, Surge, shaped_schedule


# ------------------------------------------------------- policy parameters
def _accepted(system: str) -> tuple[str, ...]:
    return policy_class(system).Params.names() + build_options(system)


@dataclass(frozen=True, slots=True)
class SystemParams:
    """A scenario's ``policy_params`` split over the systems of a run."""

    #: Per system, the parameters it is handed (the names it knows).
    given: Mapping[str, Mapping[str, object]]
    #: "policy_params.X applies to A, not to B" lines, for stderr.
    notes: tuple[str, ...] = ()


def params_for(scenario: Scenario, systems: Sequence[str], strict: bool = True) -> SystemParams:
    """Hand each system the ``policy_params`` it has, checked for type and
    range now (so a bad value stops the command before any run). ``strict``
    refuses a parameter no system of the run has, naming the systems that do;
    a parameter only some have is noted, never silently dropped."""
    given = dict(scenario.policy_params)
    per_system: dict[str, dict[str, object]] = {}
    for system in systems:
        accepted = _accepted(system)
        mine = {k: v for k, v in given.items() if k in accepted}
        options = build_options(system)
        for name in options:
            value = mine.get(name)
            if value is not None and not isinstance(value, str):
                raise PolicyParamError(system, name, f"expected text, got {value!r}")
        try:
            policy_class(system).Params.from_mapping({k: v for k, v in mine.items() if k not in options})
        except PolicyParamError as exc:
            if exc.policy == system or exc.field not in mine:
                raise
            # A shared parameter class (basin-prior's is basin's): name the system run.
            raise PolicyParamError(system, exc.field, str(exc).split(": ", 1)[-1]) from None
        per_system[system] = mine
    notes = []
    for name in given:
        having = [s for s in systems if name in per_system[s]]
        if having and len(having) < len(systems):
            others = [s for s in systems if s not in having]
            notes.append(f"policy_params.{name} applies to {', '.join(having)}; "
                         f"{', '.join(others)} {'has' if len(others) == 1 else 'have'} no such parameter")
        if not having and strict:
            owners = [s for s in policy_names() if name in _accepted(s)]
            if owners:
                fix = f"it is a parameter of {', '.join(owners)}: run one with --system {owners[0]}"
            else:
                every = sorted({n for s in systems for n in _accepted(s)})
                close = close_names(name, every)
                fix = ((f"did you mean {' or '.join(close)}? " if close else "")
                       + f"parameters of {', '.join(systems)}: {', '.join(every) or '(none)'}")
            raise BasinInputError(f"policy_params.{name}: no system of this run ({', '.join(systems)}) has "
                                  f"such a parameter; {fix}")
    return SystemParams(per_system, tuple(notes))


def resolved_params(system: str, params: Mapping[str, object]) -> dict[str, Any]:
    """Every setting ``system`` runs with (defaults filled in), as plain data."""
    options = build_options(system)
    built = policy_class(system).Params.from_mapping({k: v for k, v in params.items() if k not in options})
    data: dict[str, Any] = {k: (dataclasses.asdict(v) if dataclasses.is_dataclass(v) and not isinstance(v, type)
                                else v) for k, v in built.as_dict().items()}
    data.update({k: params[k] for k in options if k in params})
    return data


def deployment_for(scenario: Scenario) -> Deployment:
    """The scenario's deployment with its host tier and router overrides applied."""
    dep = with_host_ratio(load_deployment(scenario.deployment), scenario.host_ratio)
    if scenario.router is not None and scenario.router != dep.router:
        dep = dep.model_copy(update={"router": scenario.router})
    return dep


def base_rate_per_min(scenario: Scenario, dep: Deployment) -> float:
    """The scenario's base arrival rate: given, or a fraction of the critical
    rate of the deployment as run (its cache tier and router) with the
    scenario's workload: the profiled rate of :func:`basin.catalog.critical_rate`."""
    arr = scenario.arrivals
    if arr.from_workload:
        raise BasinInputError(f"scenario '{scenario.name}': arrivals.from_workload takes arrivals from the "
                              "workload's start times, so there is no base rate here; give arrivals.base_per_min "
                              "(--set arrivals.from_workload=false --set arrivals.base_per_min=RATE)")
    if arr.base_per_min is not None:
        return arr.base_per_min
    if arr.base_fraction_of_critical is None:
        raise BasinInputError(f"scenario '{scenario.name}': give arrivals.base_per_min or "
                              "arrivals.base_fraction_of_critical")
    rate = require_critical_rate(dep, scenario.workload.name,
                                 f"scenario '{scenario.name}' (field 'arrivals.base_fraction_of_critical')")
    return arr.base_fraction_of_critical * rate.per_min


def schedule_for(scenario: Scenario, base: float) -> PoissonSchedule:
    """The scenario's Poisson schedule on ``base`` (surge, rate changes and
    set-rate interventions); refused for a trace-shaped scenario, whose
    schedule is :func:`arrival_schedule`'s (commands that model a Poisson base
    say so rather than drop the shape)."""
    if scenario.arrivals.shape is not None:
        raise BasinInputError(f"scenario '{scenario.name}': field 'arrivals.shape': this command takes a Poisson "
                              f"base rate with surges, and the scenario's arrivals follow the trace shape "
                              f"'{scenario.arrivals.shape.name}'; drop it (--set arrivals.shape=null) or use "
                              "basin run, compare or sweep")
    surges = []
    s = scenario.surge
    if s.factor != 1.0 and s.end_min > s.start_min:
        surges.append(Surge(start_min=s.start_min, end_min=s.end_min, factor=s.factor))
    changes = [RateChange(at_min=c.at_min, per_min=c.per_min) for c in scenario.arrivals.rate_changes]
    changes += [RateChange(at_min=iv.at_min, per_min=iv.set_rate_per_min)
                for iv in scenario.interventions if iv.set_rate_per_min is not None]
    changes.sort(key=lambda c: c.at_min)
    return PoissonSchedule(base_per_min=base, surges=tuple(surges), rate_changes=tuple(changes))


def arrival_schedule(scenario: Scenario, base: float) -> ArrivalSchedule:
    """The run's arrival process on ``base`` sessions per minute: Poisson
    (:func:`schedule_for`), or with ``arrivals.shape`` Poisson at a rate that
    follows the named production trace, with ``base`` as its mean over the run."""
    shape = scenario.arrivals.shape
    if shape is None:
        return schedule_for(scenario, base)
    try:
        return shaped_schedule(shape.name, base, scenario.duration_min * 60.0, shape.offset_min, shape.window_min)
    except BasinInputError as exc:
        raise BasinInputError(f"scenario '{scenario.name}': field 'arrivals.shape': {exc}") from None


# ------------------------------------------------------- BASIN's profile
def cliff_used(scenario: Scenario, system: str, params: Mapping[str, object], dep: Deployment | None = None
               ) -> tuple[dict[str, Any] | None, str | None]:
    """Which cliff profile BASIN (or basin-prior) reads for this scenario, with
    its kappa and rate, and a warning when it is not this deployment's,
    cache tier's and workload's own (a fallback would otherwise go unseen).
    ``dep``: the scenario's deployment, when the caller has it."""
    if "profile" not in build_options(system):
        return None, None

    dep = dep if dep is not None else deployment_for(scenario)
    context = RunContext(deployment=dep, workload=scenario.workload.name, host_ratio=scenario.host_ratio)
    chosen = params.get("profile")
    summary = cliff_summary(context, chosen if isinstance(chosen, str) else None)
    info: dict[str, Any] = {"origin": summary.origin, "kappa": summary.kappa, "x_knee": summary.x_knee,
                            "lambda_c_per_min": summary.lambda_c_per_min}
    if chosen is not None:
        return info, None
    own = profile_path_as_run(dep, scenario.workload.name)
    tier = "GPU-only" if dep.host_ratio == 0 else f"host tier {dep.host_ratio:g}x"
    if summary.origin == str(own):
        return info, None
    router = f" --router {dep.router}" if dep.prefill_instances > 1 else ""
    fix = (f"profile it with `basin profile {scenario.deployment}{router} --host-ratio {dep.host_ratio:g} "
           f"--workload {scenario.workload.name} --out FILE` and pass --set policy_params.profile=FILE")
    if Path(summary.origin).is_file():
        warning = (f"{system}: no cliff profile for {dep.name} ({tier}) with workload {scenario.workload.name} "
                   f"(looked for {own.name}); using {Path(summary.origin).name} (kappa {summary.kappa:.2f}, "
                   f"lambda_c {summary.lambda_c_per_min:.2f}/min); {fix}")
    else:
        rate = (f"critical rate {summary.lambda_c_per_min:.2f}/min" if summary.lambda_c_per_min != float("inf")
                else "no shedding rate")
        warning = (f"{system}: no cliff profile for {dep.name} ({tier}) with workload {scenario.workload.name} "
                   f"(looked for {own.name}); using the reference curve, kappa {summary.kappa:g}, and {rate} "
                   f"({summary.origin}); {fix}")
    return info, warning


def engine_hardware(scenario: Scenario, dep: Deployment) -> HardwareProfile:
    """The deployment's hardware as the engine runs it: the catalogue's, with
    the scenario's ``engine`` fields (``lock_queued_prefix``,
    ``schedule_policy``) where they differ."""
    hardware = load_hardware(dep.hardware)
    engine = scenario.engine
    given = {"lock_queued_prefix": engine.lock_queued_prefix, "schedule_policy": engine.schedule_policy}
    update = {k: v for k, v in given.items() if v is not None and v != getattr(hardware.prefill, k)}
    if update:
        hardware = hardware.model_copy(update={"prefill": hardware.prefill.model_copy(update=update)})
    return hardware


# ------------------------------------------------------- switching on
def switch_on_start(system: str) -> str | None:
    """The policy a ``--switch-on`` run of ``system`` starts under, or None
    when ``system`` is not switched (HiCache, which is what runs before the
    switch anyway). A policy that borrows prefill on decode instances cannot
    switch that on mid-run (the engine wires it in at the start): it starts
    under ``crossflow``, whose borrowing is the same, and ``crossflow`` itself
    runs from the start."""
    if system == "hicache":
        return None
    borrowing = policy_class(system)().needs.decode_prefill_borrowing
    if borrowing is None:
        return "hicache"
    if system == "crossflow" or policy_class("crossflow")().needs.decode_prefill_borrowing != borrowing:
        return None
    return "crossflow"


def switched_scenario(sc: Scenario, system: str, at_min: float) -> tuple[Scenario, str]:
    """``sc`` as a ``--switch-on`` run of ``system``: the scenario and the
    policy to start under (``system`` itself when it is not switched). The
    scenario's own ``switch_policy`` interventions are replaced by the one
    switch to ``system`` (its other interventions stay)."""
    kept = tuple(iv for iv in sc.interventions if iv.switch_policy is None)
    start = switch_on_start(system)
    if start is None:
        return sc.model_copy(update={"interventions": kept}), system
    switch = InterventionSpec(at_min=at_min, switch_policy=system)
    return sc.model_copy(update={"interventions": (*kept, switch)}), start


# ------------------------------------------------------- the plan
def _file_digest(value: object) -> str | None:
    if isinstance(value, str) and _looks_like_path(value) and Path(value).is_file():
        return source_digest([Path(value)])
    return None


#: A study's measure of one run (a :class:`~basin.experiments.runner.ScenarioRun`),
#: taken in the worker beside its tables so that they need not cross the
#: process boundary; a module-level function (or a partial of one): it is
#: pickled with the plan. What it returns must pickle too.
Measure = Callable[[Any], Any]


@dataclass(frozen=True, eq=False)
class RunPlan:
    """One run, resolved (see the module's notes); made by :func:`resolve_plan`."""

    #: The scenario as run: overrides, seed and any switch-on applied.
    scenario: Scenario
    #: The policy the run starts under.
    system: str
    #: The parameters the policy is handed, in the order given.
    params: tuple[tuple[str, object], ...]
    #: The name the run is reported under: ``system``, or for a switch-on run the system switched on.
    label: str
    deployment: Deployment
    #: The hardware as the engine runs it (:func:`engine_hardware`).
    hardware: HardwareProfile
    #: The arrival process on the base rate; None when arrivals are the workload's recorded start times.
    schedule: ArrivalSchedule | None
    base_rate_per_min: float | None
    #: The minute the system is switched on, for a run that starts under another policy.
    switch_on_min: float | None = None
    # --- the record, not the run
    #: The scenario as the user named it (a name or a path) and the overrides given, for provenance.
    argument: str = ""
    overrides: tuple[str, ...] = ()
    # --- outputs, not identity
    #: A folder the worker writes the run's tables to (with the policy's action columns).
    tables: str | None = None
    #: Hand the tables back to the caller (a sweep stores them).
    keep_tables: bool = False
    #: A study's measure of the run, taken in the worker.
    measure: Measure | None = field(default=None, repr=False)

    @cached_property
    def identity(self) -> str:
        """What the run is, as canonical text (equality and hash)."""
        return json.dumps(json_value({"scenario": scenario_dict(self.scenario), "system": self.system,
                                      "params": dict(self.params), "label": self.label}),
                          sort_keys=True, separators=(",", ":"))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunPlan) and self.identity == other.identity

    def __hash__(self) -> int:
        return hash(self.identity)

    @property
    def seed(self) -> int:
        return self.scenario.seed

    def param_dict(self) -> dict[str, object]:
        return dict(self.params)

    def cliff(self) -> tuple[dict[str, Any] | None, str | None]:
        """BASIN's cliff profile for this run and a warning when it is not the deployment's own."""
        return cliff_used(self.scenario, self.system, self.param_dict(), self.deployment)

    @cached_property
    def config(self) -> dict[str, Any]:
        """Everything the run's result depends on, as plain data (hashed for
        its store key; the text of a sweep store's ``config.json``). Read only."""
        sc = self.scenario
        cliff, _ = self.cliff()
        if cliff is not None:  # the profile by its content, not by where the checkout lies
            origin = str(cliff.get("origin", ""))
            cliff = {**cliff, "origin": Path(origin).name, "origin_digest": _file_digest(origin)}
        files = {k: d for k, d in (("workload", _file_digest(sc.workload.name)),
                                   ("burst_workload", _file_digest(sc.arrivals.burst_workload.name)
                                    if sc.arrivals.burst_workload else None)) if d}
        return {
            "scenario": {k: v for k, v in scenario_dict(sc).items() if k not in ("name", "description")},
            "system": self.system,
            "policy_params": resolved_params(self.system, self.param_dict()),
            "cliff_profile": cliff,
            "deployment": self.deployment.model_dump(mode="json"),
            "hardware": load_hardware(self.deployment.hardware).model_dump(mode="json"),
            "base_rate_per_min": self.base_rate_per_min,  # None: arrivals are the workload's own
            "files": files,
            "basin_serve_version": basin.__version__,
            "code_digest": code_digest(),
        }

    @cached_property
    def key(self) -> str:
        """The run's store key: unchanged from the sweep store's first layout,
        so a store written before the run plan existed resumes."""
        return run_key(self.config)

    def provenance(self, result: PlanResult | None = None, extra: Mapping[str, Any] | None = None
                   ) -> dict[str, Any]:
        """The run's provenance record: its scenario as named and resolved,
        the system's settings and cliff profile as it ran (from ``result``),
        and ``extra``."""
        systems = ({} if result is None else
                   {self.system: {"policy_params": result.policy_params, "cliff_profile": result.cliff}})
        return provenance([(self.argument or self.scenario.name, self.scenario, list(self.overrides))], systems,
                          extra)


def resolve_plan(scenario: Scenario, system: str | None = None, params: Mapping[str, object] | None = None, *,
                 strict: bool = True, switch_on_min: float | None = None, argument: str = "",
                 overrides: Sequence[str] = (), tables: str | None = None, keep_tables: bool = False,
                 measure: Measure | None = None) -> RunPlan:
    """The plan of ``scenario`` under ``system`` (default: the scenario's
    policy). ``params`` are the policy's (default: the scenario's
    ``policy_params`` it has, refused when ``strict`` and one is no
    parameter of it). With ``switch_on_min`` the run starts under HiCache and
    ``system`` is switched on then (:func:`switched_scenario`). Checks what
    can be checked without simulating; raises :class:`BasinInputError`."""
    label = system or scenario.policy
    start = label
    if switch_on_min is not None:
        scenario, start = switched_scenario(scenario, label, float(switch_on_min))
    if params is None:
        params = params_for(scenario, [start], strict).given[start]
    dep = deployment_for(scenario)
    hardware = engine_hardware(scenario, dep)
    base: float | None = None
    schedule: ArrivalSchedule | None = None
    if not scenario.arrivals.from_workload:
        base = base_rate_per_min(scenario, dep)
        schedule = arrival_schedule(scenario, base)  # a trace shape's window, loaded now
    for iv in scenario.interventions:
        if iv.switch_policy is not None:
            policy_class(iv.switch_policy)  # an unknown name, refused now rather than at the switch's build
    return RunPlan(scenario, start, tuple(params.items()), label, dep, hardware, schedule, base, switch_on_min,
                   argument, tuple(overrides), tables, keep_tables, measure)


@dataclass(frozen=True, slots=True)
class PlanResult:
    """What a worker hands back for one plan: plain data (it crosses a process boundary)."""

    label: str
    seed: int
    summary: RunSummary
    #: The policy's settings as it ran (every field, defaults included).
    policy_params: dict[str, Any]
    #: BASIN's cliff profile as handed to the policy (None: not BASIN).
    cliff: dict[str, Any] | None
    wall_s: float
    #: Prefill tokens computed on decode instances (borrowing).
    borrowed_tokens: int = 0
    #: The run's tables (calls, sessions, time series), when the plan keeps them.
    tables: tuple[Table, Table, Table] | None = None
    #: The plan's measure of the run, when it has one.
    measured: Any = None


# -------------------------------------------------------------- provenance
PROVENANCE_FILE = "provenance.json"


def command_line() -> str:
    """The command as typed (``basin ...``), for the record."""
    return " ".join(["basin", *(shlex.quote(a) for a in sys.argv[1:])])


def provenance(scenarios: Sequence[tuple[str, Scenario, Sequence[str]]], systems: Mapping[str, Any],
               extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What an output folder was made from: each scenario as resolved (after
    overrides) with its file and overrides, every system's settings and
    cliff profile, the package version and the command line."""
    data: dict[str, Any] = {
        "basin_serve_version": basin.__version__,
        "command": command_line(),
        "working_directory": str(Path.cwd()),
        "python": platform.python_version(),
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "scenarios": [{"argument": arg, "file": str(scenario_path(arg).resolve()), "overrides": list(overrides),
                       "seed": sc.seed, "resolved": scenario_dict(sc)} for arg, sc, overrides in scenarios],
        "systems": dict(systems),
    }
    data.update(extra or {})
    return data


def write_provenance(out_dir: Path, data: Mapping[str, Any]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / PROVENANCE_FILE
    path.write_text(json.dumps(json_value(dict(data)), indent=1) + "\n", encoding="utf-8")
    return path
