"""Turning a scenario into a simulator run and its summary."""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import platform
import shlex
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

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
from basin.errors import BasinInputError
from basin.experiments.scenario import Scenario, WorkloadSpec, scenario_dict, scenario_path
from basin.jsonvalues import json_value
from basin.metrics.summary import RunSummary, summarize_run
from basin.policy.base import Policy
from basin.policy.params import PolicyParamError
from basin.policy.registry import policy_class, policy_names
from basin.sim.engine import Intervention, RunResult, SimConfig, Simulator, switch_refusal
from basin.sim.streams import BURST_WORKLOAD, builder_seed
from basin.systems import RunContext, build_options, build_policy, cliff_summary
from basin.workload.arrivals import (
    BURST,
    ArrivalSchedule,
    PoissonSchedule,
    RateChange,
    SessionArrival,
    Surge,
    draw_arrivals,
    recorded_arrivals,
    shaped_schedule,
)
from basin.workload.presets import resolve_workload, warn_if_reused
from basin.workload.records import Workload
from basin.workload.transforms import scale_workload, truncate_calls


@dataclass
class ScenarioRun:
    scenario: Scenario
    system: str
    result: RunResult
    summary: RunSummary
    #: The policy's settings as it ran (every field, defaults included).
    policy_params: dict[str, Any] = field(default_factory=dict)
    #: BASIN's cliff profile as it was handed to the policy (None: not BASIN).
    cliff: dict[str, Any] | None = None


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


# ------------------------------------------------------- BASIN's profile
def cliff_used(scenario: Scenario, system: str, params: Mapping[str, object]) -> tuple[dict[str, Any] | None,
                                                                                         str | None]:
    """Which cliff profile BASIN (or basin-prior) reads for this scenario, with
    its kappa and rate, and a warning when it is not this deployment's,
    cache tier's and workload's own (a fallback would otherwise go unseen)."""
    if "profile" not in build_options(system):
        return None, None

    dep = deployment_for(scenario)
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


def check_runnable(scenario: Scenario, systems: Sequence[str], strict: bool = True) -> tuple[SystemParams,
                                                                                             list[str]]:
    """Everything that can be checked without simulating, done before any
    run: the deployment and its hardware, the base rate, every system's
    parameters. Returns the split parameters and the warnings to show."""
    dep = deployment_for(scenario)
    load_hardware(dep.hardware)
    if scenario.arrivals.from_workload:
        scenario_arrivals(scenario, dep)  # start times present, some inside the run, a surge with traffic to scale
    else:
        arrival_schedule(scenario, base_rate_per_min(scenario, dep))  # a trace shape's window, loaded now
    for iv in scenario.interventions:
        if iv.switch_policy is not None:
            policy_class(iv.switch_policy)  # an unknown name, refused now rather than at the switch's build
    split = params_for(scenario, systems, strict)
    warnings = [w for s in systems if (w := cliff_used(scenario, s, split.given[s])[1]) is not None]
    return split, warnings


def build_workload(spec: WorkloadSpec, seed: int) -> Workload:
    workload = resolve_workload(spec.name, seed=seed, n_sessions=spec.sessions)
    if (spec.tool_time, spec.output, spec.prompt) != (1.0, 1.0, 1.0):
        workload = scale_workload(workload, tool_time=spec.tool_time, output=spec.output, prompt=spec.prompt)
    if spec.max_calls is not None:
        workload = truncate_calls(workload, spec.max_calls)
    return workload


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


@dataclass(frozen=True)
class SurgeSurplus:
    """Only the extra arrivals a schedule's surges add (tag ``burst``): a surge
    on top of recorded traffic, which already holds the base arrivals."""

    schedule: PoissonSchedule

    def rate_at(self, t_s: float) -> float:
        return max(self.schedule.rate_at(t_s) - self.schedule.base_rate_at(t_s), 0.0)

    def sample(self, duration_s: float, rng: np.random.Generator) -> list[tuple[float, str]]:
        return [a for a in self.schedule.sample(duration_s, rng) if a[1] == BURST]


def scenario_arrivals(scenario: Scenario, dep: Deployment, workload: Workload | None = None,
                      burst_workload: Workload | None = None) -> list[SessionArrival]:
    """The run's arrivals: Poisson on the scenario's base rate (shaped by a
    production trace with ``arrivals.shape``), or, with
    ``arrivals.from_workload``, each session at its own recorded start time
    plus the surge's extra Poisson arrivals.

    The surge scales the recorded traffic *in its window*: its extra rate is
    ``(factor - 1)`` times the recorded sessions starting there per minute, so
    ``factor: 2`` doubles what really arrived then. A surge below 1 would have
    to drop recorded sessions and is refused, as is one whose window holds no
    recorded arrival (nothing to scale).
    """
    workload = workload if workload is not None else build_workload(scenario.workload, scenario.seed)
    if burst_workload is None and scenario.arrivals.burst_workload is not None:
        burst_workload = build_workload(scenario.arrivals.burst_workload, builder_seed(scenario.seed, BURST_WORKLOAD))
    duration_s = scenario.duration_min * 60.0
    if not scenario.arrivals.from_workload:
        drawn = draw_arrivals(workload, arrival_schedule(scenario, base_rate_per_min(scenario, dep)), duration_s,
                              seed=scenario.seed, warm_sessions=scenario.arrivals.warm_sessions,
                              burst_workload=burst_workload)
        # A small trace drawn many times over replays the same few conversations.
        warn_if_reused(workload, sum(1 for a in drawn if burst_workload is None or a.tag != BURST))
        return drawn
    recorded = recorded_arrivals(workload)
    inside = [a for a in recorded if a.arrival_s < duration_s]
    if not inside:
        raise BasinInputError(
            f"scenario '{scenario.name}': no session of workload '{workload.name}' starts before the run's end "
            f"(duration_min {scenario.duration_min:g}; the first starts at minute {recorded[0].arrival_s / 60:.1f}); "
            f"raise duration_min, e.g. --set duration_min={math.ceil(recorded[-1].arrival_s / 60) + 30}")
    s = scenario.surge
    if s.factor == 1.0 or s.end_min <= s.start_min:
        return inside
    if s.factor < 1.0:
        raise BasinInputError(f"scenario '{scenario.name}': field 'surge.factor' is {s.factor:g}, below 1, which "
                              "would drop recorded sessions; with arrivals.from_workload a surge only adds "
                              "arrivals (factor > 1), or set it to 1")
    window = [a for a in inside if s.start_min * 60.0 <= a.arrival_s < s.end_min * 60.0]
    if not window:
        raise BasinInputError(
            f"scenario '{scenario.name}': the surge's window (minutes {s.start_min:g}-{s.end_min:g}) holds no "
            f"recorded arrival, so a factor of {s.factor:g} scales nothing; move surge.start_min and "
            "surge.end_min over recorded traffic")
    recorded_rate = len(window) / (s.end_min - s.start_min)
    schedule = PoissonSchedule(recorded_rate, (Surge(s.start_min, s.end_min, s.factor),))
    extra = draw_arrivals(burst_workload or workload, SurgeSurplus(schedule), duration_s, seed=scenario.seed)
    used = {a.session.session_id for a in inside}
    unique: list[SessionArrival] = []
    for a in extra:
        sid, copy = a.session.session_id, 1
        while sid in used:
            copy += 1
            sid = f"{a.session.session_id}~{copy}"
        used.add(sid)
        unique.append(a if copy == 1 else dataclasses.replace(a, session=dataclasses.replace(a.session,
                                                                                              session_id=sid)))
    # Stable: at equal times a recorded session comes before a surge's.
    return sorted([*inside, *unique], key=lambda a: a.arrival_s)


def run_scenario(scenario: Scenario, system: str | None = None,
                 progress: Callable[[float], None] | None = None,
                 params: dict[str, object] | None = None) -> ScenarioRun:
    """Simulate ``scenario`` under ``system`` (default: the scenario's policy,
    with its ``policy_params``; ``params`` replaces them)."""
    system = system or scenario.policy
    if params is None:
        params = dict(params_for(scenario, [system]).given[system])
    dep = deployment_for(scenario)
    hardware = load_hardware(dep.hardware)
    engine = scenario.engine
    given = {"lock_queued_prefix": engine.lock_queued_prefix, "schedule_policy": engine.schedule_policy}
    update = {k: v for k, v in given.items() if v is not None and v != getattr(hardware.prefill, k)}
    if update:
        hardware = hardware.model_copy(update={"prefill": hardware.prefill.model_copy(update=update)})
    context = RunContext(deployment=dep, workload=scenario.workload.name, hardware=hardware,
                         host_ratio=scenario.host_ratio)
    policy = build_policy(system, params, context)
    # The workload and the arrivals are some 150,000 records that hold no
    # cycles. Made with the collector off and frozen before it is back on, they
    # are never walked by its passes (a young collection of them alone costs
    # 30 ms, a full pass more); the simulator would freeze them at its start
    # anyway. Thawed when the run is summarised.
    freeze = gc.get_freeze_count() == 0
    collecting = gc.isenabled()
    gc.disable()
    try:
        workload = build_workload(scenario.workload, scenario.seed)
        burst = scenario.arrivals.burst_workload
        burst_seed = builder_seed(scenario.seed, BURST_WORKLOAD)
        burst_workload = build_workload(burst, burst_seed) if burst is not None else None
        arrivals = scenario_arrivals(scenario, dep, workload, burst_workload)
        if freeze:
            gc.freeze()
    finally:
        if collecting:
            gc.enable()
    try:
        return _simulate(scenario, system, params, policy, context, dep, hardware, workload, arrivals, progress)
    finally:
        if freeze:
            gc.unfreeze()


def _simulate(scenario: Scenario, system: str, params: dict[str, object], policy: Policy, context: RunContext,
              dep: Deployment, hardware: HardwareProfile, workload: Workload, arrivals: list[SessionArrival],
              progress: Callable[[float], None] | None) -> ScenarioRun:
    duration_s = scenario.duration_min * 60.0
    interventions = []
    needs = policy.needs
    for iv in scenario.interventions:
        if iv.terminate_tag is not None:
            interventions.append(Intervention(iv.at_min * 60.0, "terminate-tag", tag=iv.terminate_tag))
        elif iv.switch_policy is not None:
            switched = build_policy(iv.switch_policy, {}, context)
            refusal = switch_refusal(needs, switched.needs)
            if refusal is not None:
                raise BasinInputError(f"scenario '{scenario.name}': intervention at minute {iv.at_min:g} "
                                      f"switches to '{iv.switch_policy}': {refusal}")
            needs = switched.needs
            interventions.append(Intervention(iv.at_min * 60.0, "switch-policy", policy=switched))
    config = SimConfig(
        hardware=hardware,
        deployment=dep,
        arrivals=arrivals,
        duration_s=duration_s,
        block_tokens=workload.block_tokens,
        interventions=interventions,
        reserve_at_prefill_completion=scenario.engine.reserve_at_prefill_completion,
        seed=scenario.seed,
    )
    result = Simulator(config, policy).run(progress)  # the simulator is freed here, by reference counting
    trigger = scenario.trigger_min
    summary = summarize_run(
        result.calls, result.sessions, result.timeseries,
        system=system,
        trigger_s=trigger * 60.0 if trigger is not None else None,
        duration_s=duration_s,
        measure_end_s=scenario.measure_end_min * 60.0,
        itl_slo_s=hardware.itl_slo_s,
        degradation_rule=scenario.judge.degradation_rule(),
        label_rule=scenario.judge.label_rule(),
    )
    described = policy.describe().get("cliff_profile")
    cliff_info = dict(described) if isinstance(described, dict) else None
    return ScenarioRun(scenario, system, result, summary, resolved_params(system, params), cliff_info)


# -------------------------------------------------------------- provenance
PROVENANCE_FILE = "provenance.json"
#: What marks a folder as one run's tables (so only such folders are ever removed).
RUN_MARKERS = ("summary.json", "calls.parquet")


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


def remove_stale_runs(out_dir: Path, keep: Sequence[str]) -> list[str]:
    """Remove run folders of earlier commands from ``out_dir`` (only folders
    holding a run's tables, never anything else), so that what lies beside a
    new run's provenance is that run's. Returns the names removed."""
    removed: list[str] = []
    if not out_dir.is_dir():
        return removed
    for child in sorted(out_dir.iterdir()):
        if child.is_dir() and child.name not in keep and any((child / m).exists() for m in RUN_MARKERS):
            shutil.rmtree(child)
            removed.append(child.name)
    return removed
