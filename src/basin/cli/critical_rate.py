"""``basin critical-rate``: a deployment's steady-load limit, measured on a grid of steady rates, beside
its critical rate (the cliff profile's)."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from basin.cli.options import parse_jobs, parse_seeds

_err = Console(stderr=True)


def critical_rate(
    deployment: str = typer.Argument(..., help="Deployment name (profiles/deployments/), a YAML file, "
                                               "or a shape such as 2P4D-h200."),
    low: float = typer.Option(..., "--low", help="Lowest steady rate to try (sessions per minute)."),
    high: float = typer.Option(..., "--high", help="Highest steady rate to try (sessions per minute)."),
    step: float = typer.Option(0.5, "--step", help="Step of the rate grid (sessions per minute)."),
    seeds: str = typer.Option("0,1,2", "--seeds", help="Comma-separated seeds; a rate is healthy when every "
                                                      "seed's run ends healthy."),
    host_ratio: Optional[float] = typer.Option(None, "--host-ratio",
                                               help="Host tier as a multiple of the GPU prefix cache, "
                                                    "overriding the deployment's (0: GPU-only)."),
    workload: str = typer.Option("terminal-bench", "--workload", "-w", help="Workload preset or file."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Simulator processes (default or -1: all cores)."),
    duration: float = typer.Option(120.0, "--duration", help="Minutes each steady run lasts (sessions are "
                                                            "measured over its first three quarters)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Check the critical rate against steady load: the highest steady arrival rate (HiCache alone, no surge)
    below which every rate of the grid ends healthy with every seed, printed beside the critical rate that
    scenarios and BASIN use (the cliff profile's lambda_c; `basin profile` measures it).

    Example:

        basin critical-rate 1p1d-h200 --low 3 --high 12 --step 0.5 --seeds 0,1,2
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from basin.experiments.critical_rate import find_critical_rate, rate_grid

    seed_list = parse_seeds(seeds)
    total = len(rate_grid(low, high, step)) * len(seed_list)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=_err, transient=as_json, auto_refresh=False) as bar:
        # No refresh thread: the runs go to forked workers.
        task = bar.add_task(f"steady runs of {deployment}", total=total)
        bar.refresh()

        def advance(done: int, n: int) -> None:
            bar.update(task, completed=done, total=n)
            bar.refresh()

        result = find_critical_rate(deployment, low, high, step, seeds=seed_list, host_ratio=host_ratio,
                                    workload=workload, workers=parse_jobs(jobs), duration_min=duration,
                                    progress=advance)
    if as_json:
        typer.echo(json.dumps(result.to_dict()))
        return
    table = Table(title=f"steady load on {result.deployment} ({result.workload}, host {result.host_ratio:g}x, "
                        f"{result.duration_min:g} min, HiCache)")
    table.add_column("rate/min", justify="right")
    for s in result.seeds:
        table.add_column(f"seed {s}: state, hit, TTFT p50")
    table.add_column("healthy")
    for r in result.rates:
        cells = [f"{x.state} {x.hit_rate:.2f} {x.ttft_p50_s:.2f}s" for x in result.runs_at(r)]
        table.add_row(f"{r:g}", *cells, "yes" if result.healthy_at(r) else "[red]no[/]")
    Console(width=max(Console().width, 40 + 32 * len(result.seeds))).print(table)
    limit = result.steady_limit_per_min
    if limit is None:
        line = (f"steady-load limit of {result.deployment}: below {result.rates[0]:g} sessions/min "
                f"(the lowest rate already failed; lower --low)")
    else:
        line = f"steady-load limit of {result.deployment}: {limit:g} sessions/min"
        if result.capped:
            line += " (every rate was healthy; raise --high to find the limit)"
    typer.echo(line)
    if result.profiled is not None:
        typer.echo(f"critical rate: {result.profiled.per_min:g} sessions/min ({result.profiled.origin})")
    else:
        typer.echo("critical rate: none (no cliff profile of this deployment as run; `basin profile` makes one)")
