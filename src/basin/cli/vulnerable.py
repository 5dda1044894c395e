"""``basin vulnerable``: one answer an operator can act on. Is this
deployment, at this load, one surge away from the trap; what limits it
first; how large a surge does it; what admission budget keeps it out; and,
with ``--simulate``, does the simulator agree.

Everything but the confirming simulation is the fluid model's
(:mod:`basin.model`: equilibria, first limit, the reference admission
budget, the smallest trapping surge by bisection of its dynamics); the
default load comes from the deployment's critical rate (its cliff profile's) where one exists.

The engine's scheduling policy is an input: the fluid model assumes the
prefill queue is served first-come (SGLang's default), so under SGLang's
LPM its verdict is FCFS's, and the report says so; the confirming
simulation runs the policy given (docs/engines.md).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import typer

from basin.cli.options import parse_seeds
from basin.errors import BasinInputError

if TYPE_CHECKING:
    from basin.catalog import Deployment, SchedulePolicy

#: The default load: this fraction of the deployment's critical rate (the
#: paper's main scenarios run at half of it), else of the model's departure peak.
DEFAULT_LOAD_FRACTION = 0.5
#: Surge lengths the report gives the smallest trapping factor for (minutes).
SURGE_DURATIONS_MIN: tuple[float, ...] = (5.0, 10.0, 20.0)
#: Sessions the simulation's workload pool holds (the shipped scenarios' size).
SIM_SESSIONS = 2000
#: What the fluid model assumes of the engine's prefill queue.
MODEL_SCHEDULE_POLICY: SchedulePolicy = "fcfs"


@dataclass(frozen=True)
class Report:
    """The answer, with every figure it rests on (``to_dict`` is the ``--json`` form)."""

    deployment: str
    shape: str
    hardware: str
    hardware_source: str
    host_ratio: float
    workload: str
    rate_per_min: float
    rate_origin: str
    verdict: str                       # vulnerable | safe | overloaded
    reason: str
    first_limit: str
    limit_ratio: float
    band_per_min: tuple[float, float]
    n_star: float
    n_stable: float | None
    n_unstable: float | None
    surges: tuple[dict[str, Any], ...]
    named_surge: dict[str, Any] | None
    admission: dict[str, Any] | None
    #: The engine's prefill scheduling policy (fcfs | lpm) and where it came from.
    schedule_policy: SchedulePolicy = MODEL_SCHEDULE_POLICY
    schedule_policy_origin: str = ""
    simulation: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        from basin.jsonvalues import json_value

        return {k: json_value(v) for k, v in self.__dict__.items()}


def _default_rate(dep: Deployment, workload: str, d_star: float) -> tuple[float, str]:
    from basin.catalog import critical_rate

    crit = critical_rate(dep, workload)
    if crit is not None:
        return (DEFAULT_LOAD_FRACTION * crit.per_min,
                f"{DEFAULT_LOAD_FRACTION:g} x the critical rate {crit.per_min:g}/min ({crit.origin}); "
                "give --rate for your load")
    return (DEFAULT_LOAD_FRACTION * d_star,
            f"{DEFAULT_LOAD_FRACTION:g} x the model's departure peak {d_star:.2f}/min (no cliff profile, so no "
            "critical rate, for this deployment); give --rate for your load")


def _hardware_source(hardware: str) -> str:
    from basin.catalog.hardware import hardware_origin
    from basin.catalog.roofline import describe, parse_hardware_name

    parsed = parse_hardware_name(hardware)
    if parsed is None:
        return hardware_origin(hardware).removesuffix(" (docs/calibration.md)")
    d = describe(*parsed)
    return (f"{d.model.name} on {d.gpu.name} x tp {d.tp}: "
            + ("measured profile" if d.source == "calibrated" else "roofline (basin deployment show)"))


def _schedule_policy(given: str | None, dep: Deployment,
                     profile_policy: SchedulePolicy) -> tuple[SchedulePolicy, str]:
    """The engine's scheduling policy and its origin: ``given`` (the flag),
    else the hardware profile's; refused where the engine has no such order."""
    from typing import cast, get_args

    from basin.catalog import SchedulePolicy

    allowed = get_args(SchedulePolicy)
    if given is None:
        policy, origin = profile_policy, "the hardware profile's prefill.schedule_policy"
    elif given in allowed:
        policy, origin = cast(SchedulePolicy, given), "given (--schedule-policy)"
    else:
        raise BasinInputError(f"--schedule-policy {given!r}: expected one of {' or '.join(allowed)}")
    if policy != "fcfs" and dep.topology == "colocated":
        raise BasinInputError(f"--schedule-policy {policy}: {dep.name} is colocated (a vLLM server), whose "
                              "scheduler has no longest-prefix-match order; use fcfs or a PD deployment")
    return policy, origin


def assess(deployment: str, *, host_ratio: float | None = None, rate: float | None = None,
           workload: str = "terminal-bench", surge_min: float = 10.0, curve: str = "paper",
           durations: tuple[float, ...] = SURGE_DURATIONS_MIN, schedule_policy: str | None = None) -> Report:
    """The fluid model's answer for ``deployment`` at ``rate`` (default: see
    :func:`_default_rate`); the smallest surge is searched for each of
    ``durations`` and ``surge_min``, the one named. ``schedule_policy`` (default:
    the hardware profile's) is reported and simulated; the model assumes fcfs."""
    from basin.model import WorkloadInput, build_model, classify_limit, departure_peak, reference_budget
    from basin.model.equilibria import low_reuse_rate, stable_and_unstable
    from basin.model.params import resolve_deployment
    from basin.model.surge import smallest_trapping_surge, surge_outcome

    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise BasinInputError(f"--rate {rate!r}: give the session arrival rate per minute, a number > 0")
    if not (math.isfinite(surge_min) and surge_min > 0):
        raise BasinInputError(f"--surge-min {surge_min!r}: give the surge's length in minutes, a number > 0")
    dep, hw = resolve_deployment(deployment, host_ratio)
    policy, policy_origin = _schedule_policy(schedule_policy, dep, hw.prefill.schedule_policy)
    model = build_model(deployment, WorkloadInput(name=workload), host_ratio=host_ratio, curve=curve)
    peak = departure_peak(model)
    d_low = low_reuse_rate(model)
    if rate is None:
        rate, rate_origin = _default_rate(dep, workload, peak.d_star_per_min)
    else:
        rate_origin = "given (--rate)"
    ns, nu = stable_and_unstable(model, rate)
    limit = classify_limit(model)
    p = model.params
    what = {"cache": (f"the prefix cache: past about {p.knee_ratio * p.cache_tokens / p.mean_context_tokens:,.0f} "
                      f"sessions their contexts overflow the {p.cache_tokens:,.0f}-token cache, reuse falls off the "
                      "cliff and recomputation slows every call, which keeps sessions alive longer"),
            "decode": (f"decode memory: about {p.max_batch_per_instance * p.decode_instances:,.0f} requests fill "
                       f"the {p.decode_kv_tokens:,.0f} KV tokens, and calls queue for it")}[limit.first_limit]
    lo, hi = d_low, peak.d_star_per_min
    surges: list[dict[str, Any]] = []
    named = admission = None
    if ns is None:
        verdict = "overloaded"
        reason = (f"{rate:.2f}/min is above the most it can serve, {hi:.2f}/min: no population is stable, "
                  f"the backlog grows without any surge. First limit: {what}.")
    elif nu is None:
        verdict = "safe"
        reason = (f"{rate:.2f}/min is below {lo:.2f}/min, what it completes even with reuse collapsed: any "
                  f"backlog a surge leaves drains, so no finite surge traps it. It becomes vulnerable from "
                  f"{lo:.2f}/min; first limit then: {what}.")
    else:
        verdict = "vulnerable"
        reason = (f"{rate:.2f}/min lies in the band {lo:.2f}-{hi:.2f}/min where a stable population of "
                  f"{ns:,.1f} sessions and a tipping population of {nu:,.1f} coexist: a surge that leaves more "
                  f"than {nu:,.1f} sessions active is not drained but grows. First limit: {what}.")
        durations = tuple(sorted(set(durations) | {float(surge_min)}))
        found = {d: smallest_trapping_surge(model, rate, d) for d in durations}
        surges = [{"duration_min": s.duration_min, "factor": s.factor, "extra_sessions": s.extra_sessions}
                  for s in found.values()]
        head = found[float(surge_min)]
        if head.factor is not None:
            named = {"duration_min": head.duration_min, "factor": head.factor, "extra_sessions": head.extra_sessions,
                     "start_min": 15.0}
        budget = reference_budget(model)
        sessions = budget.tokens / p.mean_context_tokens
        origin = "the cliff with the paper's margin, 0.9 x knee x cache (BASIN's B0)"
        if sessions >= nu:
            budget = type(budget)(0.9 * nu * p.mean_context_tokens, budget.tau_min)
            sessions = budget.tokens / p.mean_context_tokens
            origin = "0.9 x the tipping population's working set (the cliff term lies beyond it)"
        admission = {"budget_tokens": budget.tokens, "budget_sessions": sessions, "origin": origin}
        if named is not None and head.factor is not None:
            # The named surge and one three times its excess, both under the budget.
            for key, f in (("named_surge", head.factor), ("three_times_excess", 1.0 + 3.0 * (head.factor - 1.0))):
                admission[f"outcome_{key}"] = surge_outcome(model, rate, f, head.duration_min, ns, budget)
    return Report(dep.name, dep.shape, hw.name if hw.name == dep.hardware else dep.hardware,
                  _hardware_source(dep.hardware), dep.host_ratio, workload, rate, rate_origin, verdict, reason,
                  limit.first_limit, limit.ratio, (lo, hi), peak.n_star, ns, nu, tuple(surges), named, admission,
                  policy, policy_origin)


def simulate(report: Report, seeds: tuple[int, ...], factor: float | None = None,
             sessions: int = SIM_SESSIONS) -> list[dict[str, Any]]:
    """Simulate the named surge (or ``factor``) under HiCache alone, from the
    stable population, once per seed: the simulator's verdict."""
    from basin.experiments.runner import run_scenario
    from basin.experiments.scenario import ArrivalSpec, EngineSpec, Scenario, SurgeSpec, WorkloadSpec

    if report.named_surge is None or report.n_stable is None:
        raise BasinInputError(f"{report.deployment} at {report.rate_per_min:.2f}/min is {report.verdict}: "
                              "there is no trapping surge to simulate")
    surge = report.named_surge
    f = surge["factor"] if factor is None else factor
    out = []
    for seed in seeds:
        sc = Scenario(name=f"vulnerable-{report.deployment}", deployment=report.deployment,
                      host_ratio=report.host_ratio, workload=WorkloadSpec(name=report.workload, sessions=sessions),
                      arrivals=ArrivalSpec(base_per_min=report.rate_per_min,
                                           warm_sessions=int(round(report.n_stable))),
                      surge=SurgeSpec(start_min=surge["start_min"], end_min=surge["start_min"] + surge["duration_min"],
                                      factor=f),
                      duration_min=120.0, measure_end_min=90.0, policy="hicache",
                      engine=EngineSpec(schedule_policy=report.schedule_policy),
                      seed=seed)
        s = run_scenario(sc).summary
        out.append({"seed": seed, "factor": f, "state": s.state.value, "reason": s.state_reason})
    return out


def _pct(f: float) -> str:
    return f"x{f:.2f} (+{(f - 1) * 100:.0f}%)"


def render(r: Report) -> str:
    from basin.sim.prefill import LPM_MAX_WAITING

    tier = "GPU-only cache" if r.host_ratio == 0 else f"host tier {r.host_ratio:g}x"
    lines = [f"{r.deployment} ({r.shape}, {r.hardware}, {tier}; costs: {r.hardware_source}), {r.workload}, "
             f"at {r.rate_per_min:.2f} sessions/min ({r.rate_origin})", ""]
    lines.append({"vulnerable": "VULNERABLE: one finite surge can trap it at this load.",
                  "safe": "NOT VULNERABLE at this load.",
                  "overloaded": "OVERLOADED: it cannot keep up at this load, surge or not."}[r.verdict])
    lines.append(f"  why: {r.reason}")
    lines.append(f"  engine scheduling: {r.schedule_policy} ({r.schedule_policy_origin}); "
                 + ("the fluid model assumes first-come order, as here" if r.schedule_policy == MODEL_SCHEDULE_POLICY
                    else "the fluid model assumes first-come (fcfs) order, so this verdict is fcfs's: "
                         f"SGLang's lpm serves the longest cached prefixes first while at most {LPM_MAX_WAITING} "
                         "requests wait, which can keep the engine out of the trap (docs/engines.md); --simulate "
                         "runs lpm"))
    lines.append(f"  populations: stable {r.n_stable if r.n_stable is None else f'{r.n_stable:,.1f}'}, "
                 f"tipping {r.n_unstable if r.n_unstable is None else f'{r.n_unstable:,.1f}'}, "
                 f"peak departures at {r.n_star:,.1f} sessions")
    if r.surges:
        parts = [f"{s['duration_min']:g} min {_pct(s['factor'])} = {s['extra_sessions']:,.0f} extra sessions"
                 if s["factor"] is not None else f"{s['duration_min']:g} min: none up to x50" for s in r.surges]
        lines.append("  smallest trapping surge (fluid model, from the stable population): " + "; ".join(parts))
    if r.named_surge is not None:
        s = r.named_surge
        lines.append(f"  so: a {s['duration_min']:g}-minute surge of {_pct(s['factor'])} "
                     f"({s['extra_sessions']:,.0f} sessions beyond the base rate) leaves it trapped.")
    if r.admission is not None:
        a = r.admission
        lines.append(f"  keep it out: admit sessions while their working set is under {a['budget_tokens']:,.0f} "
                     f"tokens (about {a['budget_sessions']:,.0f} sessions; {a['origin']}); park the rest.")
        if "outcome_named_surge" in a:
            lines.append(f"    with it the model says: named surge {a['outcome_named_surge']}, a surge of three "
                         f"times its excess {a['outcome_three_times_excess']}"
                         + (" (backlog: sessions still parked at the end, but not trapped)"
                            if "backlog" in (a["outcome_named_surge"], a["outcome_three_times_excess"]) else ""))
    if r.simulation:
        states = ", ".join(f"seed {s['seed']}: {s['state']}" for s in r.simulation)
        lines.append(f"  simulated (HiCache alone, engine {r.schedule_policy}, {_pct(r.simulation[0]['factor'])}): "
                     f"{states}")
    return "\n".join(lines)


def vulnerable(
    deployment: str = typer.Argument(..., help="A shipped deployment (1p1d-h100), a YAML file, or a shape such as "
                                               "2P4D-h100-nvl or 2P4D-llama-3.1-8b@h100-sxm."),
    host_ratio: Optional[float] = typer.Option(
        None, "--host-ratio", help="Host tier as a multiple of the GPU cache (0: GPU-only); "
                                   "default: the deployment's."),
    rate: Optional[float] = typer.Option(
        None, "--rate", help="Session arrivals per minute (default: half the deployment's critical rate, "
                             "else half the model's peak)."),
    workload: str = typer.Option("terminal-bench", "--workload", "-w", help="Workload preset or file."),
    surge_min: float = typer.Option(10.0, "--surge-min", help="Length of the surge to name (minutes)."),
    curve: str = typer.Option("paper", "--curve", help="Hit curve: paper, simulator, or a CSV ratio,hit_rate."),
    schedule_policy: Optional[str] = typer.Option(
        None, "--schedule-policy", help="The engine's prefill scheduling: fcfs or lpm (SGLang's "
                                        "--schedule-policy); default: the hardware profile's. The fluid model "
                                        "assumes fcfs; --simulate runs the one given."),
    simulate_: bool = typer.Option(False, "--simulate", help="Confirm the named surge in the simulator."),
    seeds: str = typer.Option("0,1", "--seeds", help="Seeds of the confirming simulation."),
    as_json: bool = typer.Option(False, "--json", help="Print the answer as JSON."),
) -> None:
    """Is DEPLOYMENT one surge away from the trap at this load, and what keeps it out?

    Example: basin vulnerable 1p1d-h100 --rate 3.3 --simulate
    """
    seed_list = parse_seeds(seeds)
    report = assess(deployment, host_ratio=host_ratio, rate=rate, workload=workload, surge_min=surge_min,
                    curve=curve, schedule_policy=schedule_policy)
    if simulate_ and report.named_surge is not None:
        report = Report(**{**report.__dict__, "simulation": simulate(report, seed_list)})
    elif simulate_:
        typer.echo(f"note: nothing to simulate: the deployment is {report.verdict} at this load", err=True)
    typer.echo(json.dumps(report.to_dict(), indent=2) if as_json else render(report))
