"""``basin model``: the fluid model of section 5 (analyze, plot, classify, fit-curve)."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from basin.cli.options import parse_jobs, parse_seeds, refuse_scenario_shadowed
from basin.cli.outputs import check_out_dir, check_out_file
from basin.errors import BasinInputError

app = typer.Typer(help="The fluid model: departure curve, tipping points, trap or recovery, "
                       "and the cache-first / decode-first classification checked against the simulator.",
                  no_args_is_help=True)

_err = Console(stderr=True)


# --------------------------------------------------------------- shared input
@dataclass(frozen=True)
class _Inputs:
    model: Any
    rate: float | None
    schedule: Any
    duration_min: float
    n0: float | None
    title: str
    #: The engine's prefill scheduling policy (the model assumes fcfs).
    schedule_policy: str = "fcfs"


def _resolve(scenario: Optional[str], set_: Optional[list[str]], deployment: Optional[str],
             host_ratio: Optional[float], workload: Optional[str], sessions: Optional[int], tool_time: float,
             output: float, prompt: float, rate: Optional[float], curve: str, sharpness: float,
             surge_factor: Optional[float], surge_start: float, surge_end: float, duration: Optional[float],
             n0: Optional[float]) -> _Inputs:
    """Deployment, workload and arrivals from flags or from a scenario file."""
    from basin.experiments.plan import base_rate_per_min, schedule_for
    from basin.model.curves import named_curve
    from basin.model.params import WorkloadInput, derive_params, load_workload, resolve_deployment
    from basin.model.throughput import FluidModel
    from basin.workload.arrivals import PoissonSchedule, Surge

    hit_curve = named_curve(curve)
    schedule = None
    duration_min = duration if duration is not None else 120.0
    if scenario is not None:
        from basin.experiments.scenario import load_scenario

        if deployment is not None or workload is not None:
            raise BasinInputError("--scenario takes the deployment and workload from the scenario file; "
                                  "change them with --set deployment=... or --set workload.name=...")
        refuse_scenario_shadowed((
            ("--surge-factor", "surge.factor", surge_factor is not None),
            ("--surge-start", "surge.start_min", surge_start != SURGE_START_DEFAULT),
            ("--surge-end", "surge.end_min", surge_end != SURGE_END_DEFAULT),
            ("--host-ratio", "host_ratio", host_ratio is not None),
            ("--sessions", "workload.sessions", sessions is not None),
            ("--tool-time", "workload.tool_time", tool_time != 1.0),
            ("--output-scale", "workload.output", output != 1.0),
            ("--prompt-scale", "workload.prompt", prompt != 1.0)))
        sc = load_scenario(scenario, list(set_ or []))
        if sc.arrivals.burst_workload is not None:
            _err.print("[yellow]note:[/] the fluid model treats the surge's burst sessions as sessions of the "
                       "main workload (it has one K, g and c_bar)")
        if any(iv.terminate_tag or iv.switch_policy for iv in sc.interventions):
            _err.print("[yellow]note:[/] terminate and switch-policy interventions are not modelled; "
                       "set-rate interventions are")
        dep, hw = resolve_deployment(sc.deployment, sc.host_ratio)
        ws = sc.workload
        spec = WorkloadInput(ws.name, ws.sessions, sc.seed, ws.tool_time, ws.output, ws.prompt, ws.max_calls)
        base = rate if rate is not None else base_rate_per_min(sc, dep)
        schedule = schedule_for(sc, base)
        duration_min = duration if duration is not None else sc.duration_min
        if n0 is None and sc.arrivals.warm_sessions > 0:
            n0 = float(sc.arrivals.warm_sessions)
        title = f"scenario {sc.name}"
        policy = sc.engine.schedule_policy or hw.prefill.schedule_policy
    else:
        if set_:
            raise BasinInputError("--set changes a scenario's fields; give --scenario NAME with it")
        if deployment is None:
            raise BasinInputError("give --deployment (e.g. 1p1d-h100, 1p3d-h200, 2P4D-h200) or --scenario NAME")
        dep, hw = resolve_deployment(deployment, host_ratio)
        spec = WorkloadInput(workload or "terminal-bench", sessions, 0, tool_time, output, prompt)
        if surge_factor is not None:
            if rate is None:
                raise BasinInputError("--surge-factor multiplies the base rate: give --rate too")
            if surge_end <= surge_start:
                raise BasinInputError(f"--surge-end ({surge_end:g}) must be after --surge-start ({surge_start:g})")
            schedule = PoissonSchedule(rate, (Surge(surge_start, surge_end, surge_factor),))
        elif surge_start != SURGE_START_DEFAULT or surge_end != SURGE_END_DEFAULT:
            raise BasinInputError("--surge-start and --surge-end place a surge: give --surge-factor (and --rate) too")
        title = dep.name
        policy = hw.prefill.schedule_policy
    wl = load_workload(spec)
    params = derive_params(dep, hw, wl, hit_curve.knee_ratio, hit_curve.label, workload_label=spec.label())
    return _Inputs(FluidModel(params, hit_curve, sharpness), rate if rate is not None else
                   (schedule.base_per_min if schedule is not None else None), schedule, duration_min, n0, title,
                   policy)


_SCENARIO = typer.Option(None, "--scenario", help="Take deployment, workload and arrivals from a scenario "
                                                 "(name in scenarios/ or a YAML file).")
_SET = typer.Option(None, "--set", help="Override a scenario field, e.g. --set surge.factor=1.33")
_DEPLOYMENT = typer.Option(None, "--deployment", "-d", help="Deployment: a profile name (1p1d-h100), "
                                                         "a YAML file or a shape such as 2P4D-h200.")
_HOST = typer.Option(None, "--host-ratio", help="Host tier as a multiple of the GPU cache (0: GPU-only); "
                                               "default: the deployment's.")
_WORKLOAD = typer.Option(None, "--workload", "-w", help="Workload preset or file (default terminal-bench).")
_SESSIONS = typer.Option(None, "--sessions", help="Sessions to synthesise for a synthetic preset (default 2000).")
_TOOLS = typer.Option(1.0, "--tool-time", help="Scale tool gaps (sensitivity runs use 3, 10).")
_OUTPUT = typer.Option(1.0, "--output-scale", help="Scale output lengths.")
_PROMPT = typer.Option(1.0, "--prompt-scale", help="Scale prompt lengths.")
_RATE = typer.Option(None, "--rate", "-r", help="Base session arrival rate per minute (overrides a scenario's).")
_CURVE = typer.Option("paper", "--curve", help="Hit curve: paper, simulator, or a CSV file (ratio,hit_rate).")
_SHARP = typer.Option(8.0, "--sharpness", help="Exponent p of the smooth minimum of the bounds.")
_SFACTOR = typer.Option(None, "--surge-factor", help="Surge multiplier of the base rate (with --rate; beside "
                                                      "--scenario use --set surge.factor=X).")
SURGE_START_DEFAULT, SURGE_END_DEFAULT = 15.0, 25.0
_SSTART = typer.Option(SURGE_START_DEFAULT, "--surge-start", help="Surge start, minutes.")
_SEND = typer.Option(SURGE_END_DEFAULT, "--surge-end", help="Surge end, minutes.")
_DURATION = typer.Option(None, "--duration", help="Minutes to integrate (default: the scenario's, or 120).")
_STAGES = typer.Option(None, "--stages", help="Stages of session progress in the ODE (default: from the "
                                              "workload's spread of calls per session; 1: the paper's Eq. 1).")
_N0 = typer.Option(None, "--n0", help="Active sessions at time zero (default: the scenario's warm start, "
                                      "else the stable equilibrium).")


# ------------------------------------------------------------------ analyze
@app.command("analyze")
def analyze_cmd(
    scenario: Optional[str] = _SCENARIO, set_: Optional[list[str]] = _SET, deployment: Optional[str] = _DEPLOYMENT,
    host_ratio: Optional[float] = _HOST, workload: Optional[str] = _WORKLOAD, sessions: Optional[int] = _SESSIONS,
    tool_time: float = _TOOLS, output: float = _OUTPUT, prompt: float = _PROMPT, rate: Optional[float] = _RATE,
    curve: str = _CURVE, sharpness: float = _SHARP, surge_factor: Optional[float] = _SFACTOR,
    surge_start: float = _SSTART, surge_end: float = _SEND, duration: Optional[float] = _DURATION,
    n0: Optional[float] = _N0, stages: Optional[int] = _STAGES,
    budget_tokens: Optional[float] = typer.Option(None, "--budget-tokens", help="Admission budget (working-set "
                                                  "tokens) for the ODE with admission; default 0.9 x_k C."),
    backlog: Optional[float] = typer.Option(None, "--backlog", help="Sessions of backlog to drain (default: the "
                                            "surge's surplus)."),
    tolerance: float = typer.Option(0.01, "--tolerance", help="Crossover tolerance of the classification."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Departure curve, equilibria, vulnerable band, first limit, drain time and (with a surge) trap or recovery.

    Examples: basin model analyze --scenario trap-1p1d --set surge.factor=1.33;
    basin model analyze -d 1p3d-h200 --rate 9 --surge-factor 5 --surge-end 35 --json
    """
    from basin.model.analysis import analyze
    from basin.model.dynamics import AdmissionBudget

    inp = _resolve(scenario, set_, deployment, host_ratio, workload, sessions, tool_time, output, prompt, rate,
                   curve, sharpness, surge_factor, surge_start, surge_end, duration, n0)
    budget = AdmissionBudget(budget_tokens) if budget_tokens is not None else None
    result = analyze(inp.model, inp.rate, schedule=inp.schedule, duration_min=inp.duration_min, n0=inp.n0,
                     budget=budget, backlog_sessions=backlog, tolerance=tolerance, stages=stages)
    data = result.to_dict()
    data["schedule_policy"] = inp.schedule_policy
    data["simulator_differs"] = simulator_differs(data, tool_time)
    if as_json:
        print(json.dumps(data))
        return
    _print_analysis(data, inp.title)
    for line in data["simulator_differs"]:
        _err.print(f"[yellow]note:[/] {line}", highlight=False, soft_wrap=True)


#: Where the model's answers and the simulator's are documented to part.
DIFFERENCES_DOC = "docs/fluid-model.md, 'Where the model and the simulator differ'"
#: A surge whose ODE peak comes this close to the unstable equilibrium N_u is
#: on the boundary the simulator draws lower: trap-1p1d's +100% peaks at 0.96
#: N_u in the model and traps 4 of 5 seeds in the simulator (docs/fluid-model.md).
NEAR_UNSTABLE = 0.9
#: Tool-time scale at which the simulator's cliff is documented to lie right
#: of the model's (x10 in the classification grid of docs/fluid-model.md).
LONG_TOOL_TIME = 10.0


def _near_unstable(ode: dict[str, Any]) -> bool:
    """An ODE that recovers with its peak near the unstable equilibrium."""
    n_u = ode.get("n_unstable_final")
    return ode.get("outcome") == "recovers" and n_u is not None and ode["n_peak"] >= NEAR_UNSTABLE * n_u


def simulator_differs(d: dict[str, Any], tool_time: float) -> list[str]:
    """Where this analysis falls in a case the simulator is known to answer
    differently (each named with the documented case), as lines to print."""
    lines = []
    t = (d.get("ode") or {}).get("no_admission")
    if t is not None and _near_unstable(t):
        n_u = t["n_unstable_final"]
        lines.append(
            f"without admission the ODE recovers, but its peak ({t['n_peak']:.0f} sessions) comes within "
            f"{100 * (1 - t['n_peak'] / n_u):.0f}% of the unstable equilibrium N_u ({n_u:.1f}): there the "
            "simulator, whose cache keeps low reuse after a collapse and whose arrivals are random, often "
            "traps (the model's boundary for trap-1p1d is +102% from N_s, where the simulator traps 3 of 5 "
            "seeds); check with `basin run` or `basin vulnerable --simulate`")
    if d.get("schedule_policy", "fcfs") != "fcfs":
        from basin.sim.prefill import LPM_MAX_WAITING

        lines.append(f"engine.schedule_policy {d['schedule_policy']}: the fluid model assumes the prefill queue is "
                     "served first-come, so these answers are fcfs's; SGLang's lpm (the longest cached prefix first "
                     f"while at most {LPM_MAX_WAITING} wait) can keep the engine out of the trap, which only the "
                     "simulator models (`basin run`, docs/engines.md)")
    if tool_time >= LONG_TOOL_TIME:
        lines.append(f"tool time x{tool_time:g}: the simulator's cliff lies to the right of the model's single hit "
                     "curve, so the model's cache-limited peak and band are pessimistic here")
    if lines:
        lines.append(f"where and why the fluid model and the simulator differ: {DIFFERENCES_DOC}")
    return lines


def _fmt(x: Any, digits: int = 2, unit: str = "") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if isinstance(x, float):
        return f"{x:,.{digits}f}{unit}"
    return f"{x}{unit}"


def _print_analysis(d: dict[str, Any], title: str) -> None:
    console = Console(width=max(Console().width, 120))
    params = Table(title=f"{title}: parameters ({d['deployment']}, {d['workload']})")
    for col in ("symbol", "value", "unit", "origin"):
        params.add_column(col, justify="right" if col == "value" else "left", overflow="fold")
    for p in d["parameters"].values():
        v = p["value"]
        params.add_row(p["symbol"], f"{v:,.4g}" if abs(v) < 100 else f"{v:,.0f}", p["unit"], p["origin"])
    console.print(params)
    console.print(f"hit curve: {d['hit_curve']}; smooth minimum p = {d['smooth_min_sharpness']:g}; engine "
                  f"scheduling {d.get('schedule_policy', 'fcfs')} (the model assumes first-come order)")
    res = Table(title="answers")
    res.add_column("quantity")
    res.add_column("value", justify="right")
    cls, cond = d["classification"], d["resource_condition"]
    band = d["vulnerable_band_per_min"]
    rows = [
        ("departure peak N*", _fmt(d["n_star"], 1, " sessions")),
        ("D(N*)", _fmt(d["d_star_per_min"], 2, " /min")),
        ("low-reuse rate D_low", _fmt(d["d_low_per_min"], 2, " /min")),
        ("decode bound", _fmt(d["decode_bound_per_min"], 2, " /min")),
        ("vulnerable band", f"[{_fmt(band[0])}, {_fmt(band[1])}] /min"),
        ("first limit (throughput, 5.1)", f"{cls['first_limit']} (cache-limited peak / decode bound "
                                          f"{_fmt(cls['ratio'], 3)}, tolerance {cls['tolerance']:g})"),
        ("Eq. 2: cliff N_c vs decode N_d", f"{_fmt(cond['n_cliff'], 0)} vs {_fmt(cond['n_decode'], 0)}: "
                                           f"{'cache first' if cond['cache_first'] else 'decode first'} "
                                           f"(C {cond['cache_tokens']:,.0f} vs D_KV/(x_k f) "
                                           f"{_fmt(cond['threshold_cache_tokens'], 0)})"),
    ]
    if d["rate_per_min"] is not None:
        rows += [
            ("base rate", f"{_fmt(d['rate_per_min'])} /min ({'in' if d['vulnerable'] else 'outside'} the band)"),
            ("stable equilibrium N_s", _fmt(d["n_stable"], 1)),
            ("unstable equilibrium N_u", _fmt(d["n_unstable"], 1)),
        ]
    if d["drain_time_min"] is not None or d["backlog_sessions"] is not None:
        rows.append((f"drain time of {_fmt(d['backlog_sessions'], 0)} sessions", _fmt(d["drain_time_min"], 1, " min")))
    for name, t in d["ode"].items():
        extra = f", parked at end {_fmt(t['queue_end'], 1)}" if name == "admission" else ""
        near = name == "no_admission" and _near_unstable(t)
        rows.append((f"ODE {name.replace('_', ' ')} ({t['stages']} stage{'s' if t['stages'] != 1 else ''})",
                     f"{t['outcome']}{' (near N_u: see the note)' if near else ''} (N {_fmt(t['n_start'], 0)} -> "
                     f"peak {_fmt(t['n_peak'], 0)} -> end {_fmt(t['n_end'], 0)}{extra})"))
    for q, v in rows:
        res.add_row(q, v)
    console.print(res)


# --------------------------------------------------------------------- plot
@app.command("plot")
def plot_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="Figure file to write (.png, .svg, .pdf)."),
    scenario: Optional[str] = _SCENARIO, set_: Optional[list[str]] = _SET, deployment: Optional[str] = _DEPLOYMENT,
    host_ratio: Optional[float] = _HOST, workload: Optional[str] = _WORKLOAD, sessions: Optional[int] = _SESSIONS,
    tool_time: float = _TOOLS, output: float = _OUTPUT, prompt: float = _PROMPT, rate: Optional[float] = _RATE,
    curve: str = _CURVE, sharpness: float = _SHARP, surge_factor: Optional[float] = _SFACTOR,
    surge_start: float = _SSTART, surge_end: float = _SEND, duration: Optional[float] = _DURATION,
    n0: Optional[float] = _N0, stages: Optional[int] = _STAGES,
    n_max: Optional[float] = typer.Option(None, "--n-max", help="Right end of the population axis."),
    trajectories: Optional[Path] = typer.Option(None, "--trajectories", help="Also write the ODE trajectories "
                                                "(with a surge) to this PNG."),
) -> None:
    """D(N) with the arrival line, N_s, N_u and N* marked (the paper's Fig. 9a), as PNG.

    Example: basin model plot --scenario trap-1p1d --out trap.png
    """
    from basin.model.analysis import analyze
    from basin.model.plots import plot_departure_curve, plot_trajectories

    check_out_file(out)
    check_out_file(trajectories, "--trajectories")
    inp = _resolve(scenario, set_, deployment, host_ratio, workload, sessions, tool_time, output, prompt, rate,
                   curve, sharpness, surge_factor, surge_start, surge_end, duration, n0)
    result = analyze(inp.model, inp.rate, schedule=inp.schedule, duration_min=inp.duration_min, n0=inp.n0,
                     stages=stages)
    path = plot_departure_curve(result, out, n_max=n_max, title=f"{inp.title}: departure curve")
    _err.print(f"wrote {path}")
    if trajectories is not None:
        if not result.trajectories:
            raise BasinInputError(
                "--trajectories needs an arrival schedule: give --scenario or --rate with --surge-factor")
        _err.print(f"wrote {plot_trajectories(result.trajectories, trajectories, title=f'{inp.title}: population')}")


# ----------------------------------------------------------------- classify
@app.command("classify")
def classify_cmd(
    workers: Optional[int] = typer.Option(None, "--workers", help="Simulator processes (default or -1: all cores)."),
    seeds: str = typer.Option("0", "--seeds", help="Comma-separated seeds; a deployment's verdict is the "
                                                  "majority of its seeds."),
    curve: str = typer.Option("simulator", "--curve", help="Hit curve of the model (docs/fluid-model.md "
                                                          "says why the simulator's)."),
    tolerance: float = typer.Option(0.01, "--tolerance", help="Crossover tolerance of the classification."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="Where finished runs are kept "
                                             "(default ~/.cache/basin-serve/classify or $BASIN_CACHE_DIR)."),
    refresh: bool = typer.Option(False, "--refresh", help="Simulate again even where a cached run exists."),
    only: Optional[str] = typer.Option(None, "--only", help="Only deployments whose label contains this text "
                                                          "(e.g. 1p1d-h100 or host2x)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write the classification figure (Fig. 9b) here."),
    ramp_plots: Optional[Path] = typer.Option(None, "--ramp-plots", help="Directory for figures of the model's "
                                              "D(N) against each 1P1D tool-time-x1 deployment's ramp."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Classify 36 deployments (P:D 1:1, 1:2, 1:3; GPU-only or host tiers 2x, 10x, 40x; tool time x1, x3, x10)
    with the simulator and with the model; print the confusion table, accuracy and cache-first recall.

    Example: basin model classify --plot results/fluid-classify.png
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from basin.experiments.classify import default_cache_dir, grid_scenarios, plot_classification, run_grid
    from basin.model.classify import default_grid
    from basin.model.curves import named_curve

    seed_list = parse_seeds(seeds)
    check_out_file(plot, "--plot")
    check_out_dir(ramp_plots, "--ramp-plots")
    hit_curve = named_curve(curve)
    points = default_grid()
    if only:
        points = tuple(p for p in points if only in p.label)
        if not points:
            raise BasinInputError(f"--only '{only}' matches no deployment of the grid (labels look like "
                                  "1p2d-h100/host10x/tools x3)")
    directory = cache_dir or default_cache_dir()
    if refresh and directory.exists():
        scenarios, _, _ = grid_scenarios(points, hit_curve, seed_list)
        for key in scenarios:
            (directory / f"{key}.npz").unlink(missing_ok=True)
    total = len(points) * len(seed_list)
    started = time.monotonic()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=_err, transient=as_json) as progress:
        task = progress.add_task("simulator ramps", total=total)

        from_cache = [0]

        def done(_key: str, cached: bool) -> None:
            from_cache[0] += int(cached)
            progress.update(task, advance=1, description=f"simulator ramps ({from_cache[0]} from the cache)")

        summary = run_grid(points, hit_curve, seeds=seed_list, workers=parse_jobs(workers, "--workers"),
                           cache_dir=directory, tolerance=tolerance, on_done=done)
    if plot is not None:
        _err.print(f"wrote {plot_classification(summary, plot)}")
    if ramp_plots is not None:
        from basin.experiments.classify import RunCache
        from basin.model.plots import plot_model_vs_ramp

        cache = RunCache(directory)
        for r in summary.results:
            if r.point.deployment == "1p1d-h100" and r.point.tool_time == 1.0:
                runs = [ts for ts in (cache.get(k) for k in r.keys) if ts is not None]
                tier = "gpu" if r.point.host_ratio == 0 else f"host{r.point.host_ratio:g}x"
                name = ramp_plots / f"fluid-ramp-{r.point.deployment}-{tier}.png"
                _err.print(f"wrote {plot_model_vs_ramp(r.model, runs, name, title=r.point.label)}")
    data = summary.to_dict()
    data["elapsed_s"] = round(time.monotonic() - started, 1)
    if as_json:
        from basin.jsonvalues import json_value

        print(json.dumps(json_value(data)))
        return
    console = Console(width=max(Console().width, 130))
    rows = Table(title=f"first limit, simulator vs model ({len(points)} deployments, curve: {curve})")
    for col in ("deployment", "simulated", "model", "ratio", "Eq. 2", "sim onset (min)", "rate at limit"):
        rows.add_column(col, justify="left" if col == "deployment" else "right")
    for r, row in zip(summary.results, data["deployments"]):
        v = r.sims[0]
        onset = f"cache {_fmt(v.cache_onset_min, 0)} / decode {_fmt(v.decode_onset_min, 0)}"
        mark = "" if r.simulated == r.modelled else " [red]x[/]"
        rows.add_row(r.point.label, r.simulated, r.modelled + mark, _fmt(r.classification.ratio, 3),
                     "cache" if row["eq2_cache_first"] else "decode", onset,
                     _fmt(v.rate_at_limit_per_min, 1, "/min"))
    console.print(rows)
    conf = Table(title="confusion (rows: simulator, columns: model)")
    conf.add_column("simulated")
    conf.add_column("model: cache", justify="right")
    conf.add_column("model: decode", justify="right")
    for sim, row in data["confusion"].items():
        if sim == "none" and not any(row.values()):
            continue
        conf.add_row(sim, str(row["cache"]), str(row["decode"]))
    console.print(conf)
    console.print(f"accuracy {summary.accuracy:.1%} ({sum(r.simulated == r.modelled for r in summary.decided)}"
                  f"/{len(summary.decided)}), cache-first recall {summary.cache_first_recall:.1%}; "
                  f"{data['elapsed_s']:.0f} s; runs cached in {directory}")


# ---------------------------------------------------------------- fit-curve
@app.command("fit-curve")
def fit_curve_cmd(
    scenario: str = typer.Option("trap-1p1d", "--scenario", help="Scenario whose runs' 2-minute windows "
                                                              "give the cliff points."),
    factors: str = typer.Option("1,1.33,2", "--factors", help="Comma-separated surge factors to run it with."),
    seeds: str = typer.Option("0,1,2,3", "--seeds", help="Comma-separated seeds."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the fitted table as CSV (ratio,hit_rate)."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Simulator processes (default or -1: all cores)."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="Run cache (as for classify)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write the points and curves to this PNG."),
    as_json: bool = typer.Option(False, "--json", help="Print the table as JSON."),
) -> None:
    """Measure the simulator's hit curve (cliff points of a scenario's runs, fitted monotone) and print the table.

    Example: basin model fit-curve --out results/sim-curve.csv --plot results/fluid-hitcurve.png
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from basin.experiments.classify import profile_hit_curve
    from basin.model.curves import SIMULATOR_TABLE, simulator_curve
    from basin.model.hitcurve import HitCurve, PaperHitCurve
    from basin.model.plots import plot_hit_curves

    seed_list = parse_seeds(seeds)
    check_out_file(out)
    check_out_file(plot, "--plot")
    try:
        factor_list = tuple(float(f) for f in factors.split(",") if f.strip())
    except ValueError:
        raise BasinInputError(f"--factors '{factors}': expected comma-separated numbers, e.g. 1,1.33,2") from None
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=_err, transient=as_json) as progress:
        task = progress.add_task(f"{scenario} runs", total=len(factor_list) * len(seed_list))
        table, points = profile_hit_curve(scenario, factor_list, seed_list, workers=parse_jobs(workers, "--workers"),
                                          cache_dir=cache_dir, on_done=lambda _k, _c: progress.advance(task))
    if out is not None:
        table.to_csv(out)
        _err.print(f"wrote {out}")
    if plot is not None:
        curves: list[HitCurve] = [PaperHitCurve(), simulator_curve()]
        names = ["paper shape (default)", "simulator (basin.model.curves)"]
        shipped = [(round(x, 3), round(h, 3)) for x, h in SIMULATOR_TABLE]
        if [(round(x, 3), round(h, 3)) for x, h in zip(table.ratios, table.hit_rates)] != shipped:
            # The engine changed since the table was measured: show the new fit beside it.
            curves.append(table)
            names.append("fitted now")
        _err.print(f"wrote {plot_hit_curves(curves, plot, points=points, names=names)}")
    rows = [[x, h] for x, h in zip(table.ratios, table.hit_rates)]
    if as_json:
        print(json.dumps({"label": table.label, "knee_ratio": table.knee_ratio, "floor": table.floor,
                          "rows": rows, "n_points": int(points[0].size)}))
        return
    print(f"# {table.label}")
    print(f"# knee {table.knee_ratio:.3f}, floor {table.floor:.3f}; rows for basin.model.curves.SIMULATOR_TABLE:")
    print("(" + ", ".join(f"({x:.3f}, {h:.3f})" for x, h in rows) + ")")
