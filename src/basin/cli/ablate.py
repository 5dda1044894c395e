"""``basin ablate``: BASIN with each mechanism removed, relative to full BASIN."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

_err = Console(stderr=True)


def ablate(
    scenarios: list[str] = typer.Argument(..., help="Scenario names or YAML files."),
    variant: Optional[list[str]] = typer.Option(None, "--variant", "-v",
                                                 help="Variants to run (default: all); repeat for several."),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Override a field of every scenario."),
    out: Path = typer.Option(Path("results/ablation"), "--out", help="Directory for the table and plot."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON array of rows."),
) -> None:
    """Remove BASIN's mechanisms one at a time (priority order, admission,
    lending, shedding), swap in the prior controller or exact/noisy peaks, and
    report goodput relative to full BASIN (the paper's Fig. 23-24).

    Example: basin ablate surge-1p3d main-1p3d-gpuonly --variant "w/o lending" --variant prior
    """
    from basin.cli.outputs import check_out_dir
    from basin.experiments.ablation import VARIANTS, plot_ablation, run_ablation
    from basin.experiments.scenario import load_scenario

    check_out_dir(out)
    for sc in scenarios:
        load_scenario(sc, list(set_ or []))  # bad names and fields fail before any run
    with Progress(TextColumn("ablation"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=_err, transient=as_json) as progress:
        task = progress.add_task("runs", total=None)
        rows = run_ablation(scenarios, variant, list(set_ or []),
                            progress=lambda done, total: progress.update(task, completed=done, total=total))
    out.mkdir(parents=True, exist_ok=True)
    (out / "ablation.json").write_text(json.dumps([asdict(r) for r in rows], indent=2))
    plot_ablation(rows, str(out / "ablation.png"))
    if as_json:
        print(json.dumps([asdict(r) for r in rows]))
        return
    table = Table(title="goodput relative to full BASIN")
    for col in ("scenario", "variant", "goodput/h", "relative", "completed", "shed", "wait p90", "state"):
        table.add_column(col, justify="left" if col in ("scenario", "variant", "state") else "right", no_wrap=True)
    for r in rows:
        table.add_row(r.scenario, r.variant, f"{r.goodput_per_h:.0f}", f"{r.relative_goodput:.2f}",
                      f"{100 * r.completed_fraction:.1f}%", f"{100 * r.shed_fraction:.1f}%",
                      f"{r.first_call_wait_p90_s:.0f}s", r.state)
    Console(width=max(Console().width, 120)).print(table)
    _err.print(f"variants known: {', '.join(VARIANTS)}; table and plot in {out}")
