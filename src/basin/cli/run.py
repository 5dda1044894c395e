"""``basin run``: simulate a scenario under one or more systems."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

_err = Console(stderr=True)


def run(
    scenario: str = typer.Argument(..., help="Scenario name (see scenarios/) or a YAML file."),
    system: Optional[list[str]] = typer.Option(None, "--system", "-s",
                                                help="Control policy to run; repeat for several; 'all' "
                                                     "for every registered policy. Default: the scenario's "
                                                     "policy."),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Override a scenario field, "
                                                                 "e.g. --set surge.factor=2.0"),
    seed: Optional[int] = typer.Option(None, "--seed", help="Override the scenario's seed."),
    out: Optional[Path] = typer.Option(None, "--out", help="Directory for Parquet tables and plots "
                                                           "(default results/<scenario>)."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON array, one object per system."),
    plots: bool = typer.Option(True, "--plots/--no-plots", help="Write PNG plots of the time series."),
) -> None:
    """Run the simulator on a scenario and report goodput, state and latency per system.

    Example: basin run trap-1p1d --set surge.factor=2.0 --system hicache
    """
    from basin.errors import BasinInputError
    from basin.experiments.plots import plot_cliff, plot_run_timeseries
    from basin.experiments.runner import run_scenario
    from basin.experiments.scenario import load_scenario
    from basin.metrics.io import write_run
    from basin.policy.registry import policy_names

    overrides = list(set_ or [])
    if seed is not None:
        overrides.append(f"seed={seed}")
    sc = load_scenario(scenario, overrides)
    from basin.experiments.compare import expand_systems

    systems = expand_systems(system or [sc.policy])  # 'all': every registered policy
    unknown = [name for name in systems if name not in policy_names()]
    if unknown:  # fail before any simulation
        raise BasinInputError(f"unknown system(s) {', '.join(unknown)}: use one of {', '.join(policy_names())}")
    out_dir = out or Path("results") / sc.name
    runs = []
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                  TimeElapsedColumn(), console=_err, transient=as_json) as progress:
        for name in systems:
            task = progress.add_task(f"{sc.name} / {name}", total=sc.duration_min * 60.0)

            def on_progress(t: float, task: TaskID = task) -> None:
                progress.update(task, completed=t)

            runs.append(run_scenario(sc, name, on_progress))
            progress.update(task, completed=sc.duration_min * 60.0)
    for r in runs:
        write_run(out_dir / r.system, r.result.calls, r.result.sessions, r.result.timeseries, r.summary)
    if plots:
        shade = [(sc.surge.start_min, sc.surge.end_min)] if sc.trigger_min is not None else []
        plot_run_timeseries({r.system: r.result.timeseries for r in runs}, out_dir / "timeseries.png",
                            shade_windows=shade, title=f"{sc.name}")
        plot_cliff({r.system: r.result.timeseries for r in runs}, out_dir / "cliff.png",
                   title=f"{sc.name}: hit rate against working set")
    if as_json:
        print(json.dumps([_json_row(r.summary) for r in runs]))
        return
    table = Table(title=f"scenario {sc.name}")
    for col in ("system", "goodput/h", "completed", "shed", "state", "hit pre", "hit end",
                "TTFT end", "active end", "L_late"):
        table.add_column(col, justify="right" if col != "system" else "left")
    for r in runs:
        s = r.summary
        table.add_row(s.system, _f(s.goodput_per_h, 1), _pct(s.completed_fraction), _pct(s.shed_fraction),
                      s.state.value if hasattr(s.state, "value") else str(s.state),
                      _f(s.hit_rate_pre, 2), _f(s.hit_rate_final, 2), _f(s.ttft_p50_final_s, 2, "s"),
                      _f(s.active_sessions_final, 0), _f(s.l_late_s, 1, "s"))
    console = Console()
    Console(width=max(console.width, 120)).print(table)
    _err.print(f"tables and plots in {out_dir}")


def _json_row(summary) -> dict:
    data = summary.to_dict()
    data.pop("windows", None)
    return data


def _f(x: float, digits: int, unit: str = "") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}{unit}"


def _pct(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{100 * x:.1f}%"
