"""Turning a run plan (:mod:`basin.experiments.plan`) into a simulator run
and its summary, in this process (:func:`run_plan`) or over the one executor
(:func:`run_plans`, every study's)."""

from __future__ import annotations

import dataclasses
import gc
import math
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from basin.catalog import Deployment, HardwareProfile
from basin.errors import BasinInputError
from basin.experiments.executors import execute
from basin.experiments.plan import (
    PlanResult,
    RunPlan,
    SystemParams,
    arrival_schedule,
    base_rate_per_min,
    params_for,
    resolve_plan,
    resolved_params,
)
from basin.experiments.scenario import Scenario, WorkloadSpec
from basin.metrics.actions import with_action_columns
from basin.metrics.io import write_run
from basin.metrics.summary import RunSummary, summarize_run
from basin.policy.base import Policy
from basin.policy.driver import capture_drivers
from basin.sim.engine import Intervention, RunResult, SimConfig, Simulator, switch_refusal
from basin.sim.streams import BURST_WORKLOAD, builder_seed
from basin.systems import RunContext, build_policy
from basin.workload.arrivals import (
    BURST,
    ArrivalSchedule,
    PoissonSchedule,
    SessionArrival,
    Surge,
    draw_arrivals,
    recorded_arrivals,
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


def check_runnable(scenario: Scenario, systems: Sequence[str], strict: bool = True) -> tuple[SystemParams,
                                                                                             list[str]]:
    """Everything that can be checked without simulating, done before any
    run (:func:`runnable_plans`). Returns the split parameters and the
    warnings to show."""
    _, split, warnings = runnable_plans(scenario, systems, strict)
    return split, warnings


def runnable_plans(scenario: Scenario, systems: Sequence[str], strict: bool = True, *, argument: str = "",
                   overrides: Sequence[str] = ()) -> tuple[list[RunPlan], SystemParams, list[str]]:
    """The plan of ``scenario`` under each system, checked as far as it can
    be without simulating: deployment and hardware, base rate and arrival
    schedule, policy switches (with ``arrivals.from_workload``, the recorded
    start times too), every system's parameters (``strict``: refusing one no
    system has). The scenario is resolved once and shared by the systems'
    plans. Returns the plans, the split parameters and the warnings to show."""
    base = resolve_plan(scenario, systems[0] if systems else None, {}, argument=argument, overrides=overrides)
    if scenario.arrivals.from_workload:
        scenario_arrivals(scenario, base.deployment)  # start times present, some inside the run, a surge to scale
    split = params_for(scenario, systems, strict)
    plans = [dataclasses.replace(base, system=s, label=s, params=tuple(split.given[s].items())) for s in systems]
    warnings = [w for p in plans if (w := p.cliff()[1]) is not None]
    return plans, split, warnings


def build_workload(spec: WorkloadSpec, seed: int) -> Workload:
    workload = resolve_workload(spec.name, seed=seed, n_sessions=spec.sessions)
    if (spec.tool_time, spec.output, spec.prompt) != (1.0, 1.0, 1.0):
        workload = scale_workload(workload, tool_time=spec.tool_time, output=spec.output, prompt=spec.prompt)
    if spec.max_calls is not None:
        workload = truncate_calls(workload, spec.max_calls)
    return workload


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
                      burst_workload: Workload | None = None,
                      schedule: ArrivalSchedule | None = None) -> list[SessionArrival]:
    """The run's arrivals: Poisson on the scenario's base rate (shaped by a
    production trace with ``arrivals.shape``), or, with
    ``arrivals.from_workload``, each session at its own recorded start time
    plus the surge's extra Poisson arrivals.

    The surge scales the recorded traffic *in its window*: its extra rate is
    ``(factor - 1)`` times the recorded sessions starting there per minute, so
    ``factor: 2`` doubles what really arrived then. A surge below 1 would have
    to drop recorded sessions and is refused, as is one whose window holds no
    recorded arrival (nothing to scale). ``schedule``: the scenario's arrival
    schedule, when the caller has it (a :class:`RunPlan`'s).
    """
    workload = workload if workload is not None else build_workload(scenario.workload, scenario.seed)
    if burst_workload is None and scenario.arrivals.burst_workload is not None:
        burst_workload = build_workload(scenario.arrivals.burst_workload, builder_seed(scenario.seed, BURST_WORKLOAD))
    duration_s = scenario.duration_min * 60.0
    if not scenario.arrivals.from_workload:
        if schedule is None:
            schedule = arrival_schedule(scenario, base_rate_per_min(scenario, dep))
        drawn = draw_arrivals(workload, schedule, duration_s, seed=scenario.seed,
                              warm_sessions=scenario.arrivals.warm_sessions, burst_workload=burst_workload)
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
    with its ``policy_params``; ``params`` replaces them): its plan, run."""
    return run_plan(resolve_plan(scenario, system, params), progress)


def run_plan(plan: RunPlan, progress: Callable[[float], None] | None = None) -> ScenarioRun:
    """Simulate one plan in this process."""
    scenario, system, params = plan.scenario, plan.system, plan.param_dict()
    dep, hardware = plan.deployment, plan.hardware
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
        arrivals = scenario_arrivals(scenario, dep, workload, burst_workload, plan.schedule)
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


# -------------------------------------------------------------- the executor
def execute_plan(plan: RunPlan) -> PlanResult:
    """Run one plan and hand back plain results: the one job every study
    runs (module-level: pickled to pool and Ray workers). The plan's tables
    folder, when it has one, receives the run's tables with the policy's
    action columns (:mod:`basin.metrics.actions`), written here in the worker
    so that no table crosses the process boundary unless the plan keeps them."""
    start = time.perf_counter()
    with capture_drivers() as drivers:
        run = run_plan(plan)
    res = run.result
    if plan.tables is not None:
        timeseries = res.timeseries
        log = drivers[-1].actions if drivers else None
        if log is not None:
            timeseries = with_action_columns(timeseries, log.changes, log.shed_s)
        write_run(plan.tables, res.calls, res.sessions, timeseries, run.summary)
    measured = plan.measure(run) if plan.measure is not None else None
    return PlanResult(plan.label, plan.seed, run.summary, run.policy_params, run.cliff, time.perf_counter() - start,
                      int(res.borrow_stats.get("tokens", 0)),
                      (res.calls, res.sessions, res.timeseries) if plan.keep_tables else None, measured)


def run_plans(plans: Sequence[RunPlan], on_result: Callable[[int, PlanResult], None] | None = None, *,
              executor: str = "local", workers: int | None = None, address: str | None = None,
              progress: Callable[[int, int], None] | None = None) -> list[PlanResult]:
    """Every plan on the chosen executor (:mod:`basin.experiments.executors`),
    results in the plans' order; ``on_result(index, result)`` as each
    finishes, in this process (a study that keeps results as they arrive, as
    a sweep's store does, gives it; see :mod:`basin.experiments.pool` for
    what Ctrl-C then does)."""
    return execute(execute_plan, plans, on_result, executor=executor, workers=workers, address=address,
                   progress=progress)


# -------------------------------------------------------------- output folders
#: What marks a folder as one run's tables (so only such folders are ever removed).
RUN_MARKERS = ("summary.json", "calls.parquet")


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
