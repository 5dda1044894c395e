"""``basin profile``: BASIN's offline cliff profile of a deployment (docs/profiler.md)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from basin.cli.options import parse_jobs, refuse_scenario_shadowed
from basin.errors import BasinInputError
from basin.paths import IN_CHECKOUT

_err = Console(stderr=True)


def profile(
    deployment: Optional[str] = typer.Argument(None, help="Deployment name (profiles/deployments/), a YAML file, "
                                                          "or a shape such as 2P4D-h200 (or give --scenario)."),
    scenario: Optional[str] = typer.Option(None, "--scenario", "-s",
                                           help="Profile the deployment as this scenario runs it: its deployment, "
                                                "host tier, router and workload section (scaling included); "
                                                "written beside the shipped profiles, in "
                                                "profiles/basin/scenarios/<scenario>.yaml, unless --out says."),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Override a field of --scenario, KEY=VALUE "
                                                                  "(as `basin run --set`)."),
    workload: str = typer.Option("terminal-bench", "--workload", "-w",
                                 help="Workload preset or file the ramp draws sessions from."),
    router: Optional[str] = typer.Option(None, "--router", "-r",
                                         help="Prefill router: cache-aware, affinity or least-loaded "
                                              "(default: the deployment's). Profile each router you run."),
    host_ratio: Optional[float] = typer.Option(None, "--host-ratio",
                                               help="Host tier as a multiple of the GPU prefix cache, "
                                                    "overriding the deployment's (0: GPU-only)."),
    repeats: int = typer.Option(3, "--repeats", "-n", help="Ramps with seeds SEED, SEED+1, ...; the profile "
                                                           "keeps the lower quartile of kappa."),
    seed: int = typer.Option(0, "--seed", help="Seed of the first ramp."),
    out: Optional[Path] = typer.Option(None, "--out", help="Profile file (.yaml, .yml or .json); default "
                                                           "<deployment>[-<router>][-<workload>].yaml in the "
                                                           "shipped profiles/basin/ of a checkout (which BASIN "
                                                           "reads), or in results/profiles/ of an installed "
                                                           "package."),
    as_json: bool = typer.Option(False, "--json", help="Print the profile's summary as one JSON object."),
    plot: bool = typer.Option(True, "--plot/--no-plot", help="Write a PNG of the ramp next to the profile file."),
    start_rate: Optional[float] = typer.Option(None, "--start-rate", help="First step's session rate per minute "
                                                                          "(default: 0.2 x the estimated knee rate)."),
    end_rate: Optional[float] = typer.Option(None, "--end-rate", help="Last step's session rate per minute "
                                                                      "(default: 1.6 x the estimated knee rate)."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Number of rate steps (default 15, geometric)."),
    step_min: Optional[int] = typer.Option(None, "--step-min", help="Minutes per step (default 15)."),
    settle_min: Optional[int] = typer.Option(None, "--settle-min", help="Minutes of each step left out of its "
                                                                        "completion rate (default 5)."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Processes running ramps "
                                                                  "(default or -1: CPU count)."),
) -> None:
    """Profile a deployment's cache cliff (kappa) and peak departure rate (lambda_c) with stepped load ramps.

    Example:

        basin profile 2p6d-h200 --router least-loaded --repeats 3 --out results/2p6d-least-loaded.yaml

        basin profile --scenario real-trap-vllm
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from basin.catalog.cliff_profiles import default_profile_path, override_deployment, save_profile
    from basin.experiments.plots import plot_profile
    from basin.experiments.ramp import default_ramp, profile_deployment

    if repeats < 1:
        raise BasinInputError(f"--repeats {repeats}: give at least 1 ramp (3 is the default)")
    workers = parse_jobs(workers, "--workers")
    if out is not None and out.suffix.lower() not in (".yaml", ".yml", ".json"):
        raise BasinInputError(f"--out {out}: a profile file ends in .yaml, .yml or .json")
    from basin.cli.outputs import check_out_file

    check_out_file(out)
    target = _target(deployment, scenario, set_, workload, router, host_ratio)
    deployment, router, host_ratio = target.deployment, target.router, target.host_ratio
    dep = override_deployment(deployment, router, host_ratio)
    overrides: dict[str, Any] = {name: value for name, value in (
        ("start_per_min", start_rate), ("end_per_min", end_rate), ("steps", steps),
        ("step_min", step_min), ("settle_min", settle_min)) if value is not None}
    ramp = default_ramp(dep, target.workload, seed=seed, **overrides)
    path = out or target.default_path or default_profile_path(deployment, router, workload, host_ratio)
    if out is None and not IN_CHECKOUT:  # never write into an installed package
        path = Path("results") / "profiles" / path.name
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} ramps"),
                  TimeElapsedColumn(), console=_err, transient=as_json, auto_refresh=False) as bar:
        # No refresh thread: the ramps run in forked workers.
        task = bar.add_task(f"profiling {dep.name} ({dep.router})", total=repeats)
        bar.refresh()

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)
            bar.refresh()

        prof = profile_deployment(deployment, target.workload, router, repeats=repeats, seed=seed, progress=advance,
                                  host_ratio=host_ratio, ramp=ramp, workers=workers)
    save_profile(prof, path)
    png = path.with_suffix(".png") if plot else None
    if png is not None:
        plot_profile(prof, png)
    if as_json:
        data = prof.to_dict()
        data.pop("runs")
        data.update(path=str(path), plot=str(png) if png else None)
        typer.echo(json.dumps(data))
        return
    table = Table(title=f"cliff profile: {prof.deployment} ({prof.router}, {prof.workload})")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row("kappa (lower quartile)", f"{prof.kappa:.3f}")
    table.add_row("kappa per ramp", ", ".join(f"{k:.3f}" for k in prof.kappas))
    table.add_row("cliff W/C_eff = kappa x_k", f"{prof.cliff_ratio:.2f}  (x_k = {prof.x_knee:g})")
    table.add_row("cliff W_c", f"{prof.cliff_tokens / 1e6:.2f}M tokens")
    table.add_row("C_gpu / C_host / C_eff", f"{prof.gpu_cache_tokens / 1e6:.2f}M / {prof.host_cache_tokens / 1e6:.2f}M"
                  f" / {prof.effective_cache_tokens / 1e6:.2f}M")
    table.add_row("lambda_c (median): the critical rate", f"{prof.lambda_c_per_min:.2f} sessions/min")
    table.add_row("lambda_c per ramp", ", ".join(_f(v) for v in prof.lambda_c_per_repeat))
    table.add_row("highest healthy step rate (median)", f"{_f(prof.healthy_step_rate_per_min)} sessions/min")
    table.add_row("hit plateau / floor", f"{prof.plateau_hit:.2f} / {prof.floor_hit:.2f}")
    table.add_row("ramp", f"{prof.ramp.start_per_min:g}-{prof.ramp.end_per_min:g}/min, {prof.ramp.steps} steps "
                  f"x {prof.ramp.step_min} min")
    Console().print(table)
    _err.print(f"profile in {path}" + (f", plot in {png}" if png else ""))


@dataclass(frozen=True)
class _Target:
    """What to profile: a deployment (name, shape or file) as run, and the
    workload the ramps draw from."""

    deployment: str
    router: str | None
    host_ratio: float | None
    workload: Any  # a name, or a scenario's WorkloadSpec
    #: Where the profile goes unless --out says: a scenario's own file.
    default_path: Path | None = None


def _target(deployment: str | None, scenario: str | None, set_: list[str] | None, workload: str,
            router: str | None, host_ratio: float | None) -> _Target:
    # Lazy: the CLI imports its commands' modules only when they run.
    from basin.catalog.cliff_profiles import DEFAULT_WORKLOAD, scenario_profile_path
    from basin.experiments.scenario import load_scenario

    if scenario is None:
        if set_:
            raise BasinInputError("--set changes a scenario's fields; give --scenario NAME with it")
        if deployment is None:
            raise BasinInputError("give a deployment (e.g. basin profile 1p1d-h100) or --scenario NAME")
        return _Target(deployment, router, host_ratio, workload)
    refuse_scenario_shadowed((
        ("DEPLOYMENT", "deployment", deployment is not None),
        ("--workload", "workload.name", workload != DEFAULT_WORKLOAD),
        ("--router", "router", router is not None),
        ("--host-ratio", "host_ratio", host_ratio is not None)))
    sc = load_scenario(scenario, list(set_ or []))
    return _Target(sc.deployment, sc.router, sc.host_ratio, sc.workload, scenario_profile_path(sc.name))


def _f(value: float | None) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}"
