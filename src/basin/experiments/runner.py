"""Turning a scenario into a simulator run and its summary."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from basin.catalog import Deployment, load_deployment, load_hardware, require_critical_rate, with_host_ratio
from basin.errors import BasinInputError
from basin.experiments.scenario import Scenario, WorkloadSpec
from basin.metrics.summary import RunSummary, summarize_run
from basin.sim.engine import Intervention, RunResult, SimConfig, Simulator, switch_refusal
from basin.systems import RunContext, build_policy
from basin.workload.arrivals import PoissonSchedule, RateChange, Surge, draw_arrivals
from basin.workload.presets import resolve_workload
from basin.workload.records import Workload
from basin.workload.transforms import scale_workload, truncate_calls


@dataclass
class ScenarioRun:
    scenario: Scenario
    system: str
    result: RunResult
    summary: RunSummary


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
    """The scenario's base arrival rate: given, or a fraction of the
    deployment's critical rate with the scenario's workload (the catalogue's)."""
    arr = scenario.arrivals
    if arr.base_per_min is not None:
        return arr.base_per_min
    if arr.base_fraction_of_critical is None:
        raise BasinInputError(f"scenario '{scenario.name}': give arrivals.base_per_min or "
                              "arrivals.base_fraction_of_critical")
    rate = require_critical_rate(dep.name, scenario.workload.name,
                                 f"scenario '{scenario.name}' (field 'arrivals.base_fraction_of_critical')")
    return arr.base_fraction_of_critical * rate.per_min


def schedule_for(scenario: Scenario, base: float) -> PoissonSchedule:
    surges = []
    s = scenario.surge
    if s.factor != 1.0 and s.end_min > s.start_min:
        surges.append(Surge(start_min=s.start_min, end_min=s.end_min, factor=s.factor))
    changes = [RateChange(at_min=c.at_min, per_min=c.per_min) for c in scenario.arrivals.rate_changes]
    changes += [RateChange(at_min=iv.at_min, per_min=iv.set_rate_per_min)
                for iv in scenario.interventions if iv.set_rate_per_min is not None]
    changes.sort(key=lambda c: c.at_min)
    return PoissonSchedule(base_per_min=base, surges=tuple(surges), rate_changes=tuple(changes))


def run_scenario(scenario: Scenario, system: str | None = None,
                 progress: Callable[[float], None] | None = None,
                 params: dict[str, object] | None = None) -> ScenarioRun:
    """Simulate ``scenario`` under ``system`` (default: the scenario's policy,
    with its ``policy_params``; ``params`` replaces them)."""
    system = system or scenario.policy
    if params is None:
        params = scenario.policy_params if system == scenario.policy else {}
    dep = deployment_for(scenario)
    hardware = load_hardware(dep.hardware)
    context = RunContext(deployment=dep, workload=scenario.workload.name, hardware=hardware,
                         host_ratio=scenario.host_ratio)
    policy = build_policy(system, params, context)
    workload = build_workload(scenario.workload, scenario.seed)
    burst = scenario.arrivals.burst_workload
    burst_workload = build_workload(burst, scenario.seed + 1) if burst is not None else None
    duration_s = scenario.duration_min * 60.0
    arrivals = draw_arrivals(
        workload, schedule_for(scenario, base_rate_per_min(scenario, dep)), duration_s,
        seed=scenario.seed, warm_sessions=scenario.arrivals.warm_sessions, burst_workload=burst_workload,
    )
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
    result = Simulator(config, policy).run(progress)
    trigger = scenario.trigger_min
    summary = summarize_run(
        result.calls, result.sessions, result.timeseries,
        system=system,
        trigger_s=trigger * 60.0 if trigger is not None else None,
        duration_s=duration_s,
        measure_end_s=scenario.measure_end_min * 60.0,
        itl_slo_s=hardware.itl_slo_s,
    )
    return ScenarioRun(scenario, system, result, summary)
