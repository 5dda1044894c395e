"""``basin compare``: run systems over scenarios and compare them (Fig. 14)."""

from __future__ import annotations

import json
import math
import shlex
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

_err = Console(stderr=True)


def compare(
    scenarios: list[str] = typer.Argument(..., help="Scenario names or YAML files."),
    system: Optional[list[str]] = typer.Option(None, "--system", "-s",
                                                help="System to run; repeat for several; 'all' for every "
                                                     "registered policy (default: all)."),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Override a field of every scenario."),
    seeds: Optional[list[int]] = typer.Option(None, "--seed", help="Seeds to average over; repeat for "
                                                                   "several (default: each scenario's seed)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Parallel runs (default: all cores)."),
    out: Path = typer.Option(Path("results/compare"), "--out", help="Directory for the JSON rows and plots."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Where to write the Fig. 14 plot "
                                                             "(default: OUT/compare.png)."),
    doc: Optional[Path] = typer.Option(None, "--doc", help="A Markdown file whose compare markers receive "
                                                           "the tables; plots then go to docs/img/results-*.png "
                                                           "next to it."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON array, one object per scenario and system."),
) -> None:
    """Run every system on every scenario in parallel; print goodput per system
    and scenario, as a percentage of the best, and median slowdown as a
    percentage of the lowest; plot both like the paper's Fig. 14.

    Example: basin compare main-1p3d-x5 main-1p1d-x5 --system all --doc docs/results.md
    """
    from basin.experiments.compare import (
        expand_systems,
        fill_doc,
        markdown,
        plot_bins,
        plot_compare,
        row_dicts,
        run_compare,
    )
    from basin.experiments.scenario import load_scenario

    overrides = list(set_ or [])
    for sc in scenarios:
        load_scenario(sc, overrides)  # bad names and fields fail before any run
    systems = expand_systems(system or ["all"])
    with Progress(TextColumn("compare"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=_err, transient=as_json) as progress:
        task = progress.add_task("runs", total=None)
        rows, infos = run_compare(scenarios, systems, overrides, seeds, jobs,
                                  progress=lambda done, total: progress.update(task, completed=done, total=total))
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(row_dicts(rows), indent=1))
    img_dir = (doc.parent / "img") if doc is not None else out
    plot_path = plot or (img_dir / ("results-main.png" if doc is not None else "compare.png"))
    plot_compare(rows, plot_path)
    bin_plots = {}
    for name, info in infos.items():
        path = img_dir / (f"results-{name}.png" if doc is not None else f"{name}-bins.png")
        plot_bins(rows, info, path)
        bin_plots[name] = path
    if doc is not None:
        command = "basin compare " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if len(sys.argv) > 2 else ""
        fill_doc(doc, markdown(rows, infos, command))
    if as_json:
        print(json.dumps(row_dicts(rows)))
        return
    console = Console(width=max(Console().width, 120))
    for name, info in infos.items():
        table = Table(title=f"{name} ({info.shape}, {info.kind})")
        for col in ("system", "goodput/h", "% of best", "state", "completed", "hit pre/end",
                    "wait p50", "first token p50", "slowdown p50", "% of lowest"):
            table.add_column(col, justify="left" if col in ("system", "state") else "right")
        for r in (r for r in rows if r.scenario == name):
            table.add_row(r.system, _f(r.goodput_per_h), _f(r.goodput_pct_of_best, 0, "%"), r.state,
                          _f(100 * r.completed_fraction, 0, "%"),
                          f"{_f(r.hit_rate_pre, 2)}/{_f(r.hit_rate_final, 2)}",
                          _f(r.first_call_wait_p50_s, 0, "s"), _f(r.first_token_wait_p50_s, 0, "s"),
                          _f(r.slowdown_p50, 2), _f(r.slowdown_pct_of_lowest, 0, "%"))
        console.print(table)
    _err.print(f"rows in {out / 'compare.json'}; plot in {plot_path}"
               + (f"; tables in {doc}" if doc is not None else ""))


def _f(x: float, digits: int = 1, unit: str = "") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}{unit}"
