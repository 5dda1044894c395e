"""``basin tune``: each baseline over its own key parameters, reported at its
defaults and at its best single setting (docs/tuning.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from basin.cli.options import parse_jobs
from basin.cli.outputs import check_out_dir
from basin.cli.stored import compute_missing, print_notes
from basin.errors import BasinInputError

if TYPE_CHECKING:
    from basin.experiments.store import RunStore
    from basin.experiments.tune import TuneOutcome
    from basin.experiments.tune_spec import Tuning

_err = Console(stderr=True)


def tune(
    file: Path = typer.Argument(..., help="Tuning file (YAML; docs/tuning.md), e.g. tuning/baselines.yaml."),
    out: Optional[Path] = typer.Option(None, "--out", help="Output folder: the result store (runs/), "
                                                           "tune.parquet, best.csv, tune-goodput.png and "
                                                           "provenance.json (default results/tune/<name>)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Parallel runs (default or -1: all cores; "
                                                                   "with Ray started here, its CPUs)."),
    executor: str = typer.Option("local", "--executor", help="Where runs execute: local (a process pool) or "
                                                             "ray (the 'ray' extra of basin-serve)."),
    address: Optional[str] = typer.Option(None, "--address", help="A Ray cluster to run on (e.g. "
                                                                  "ray://head:10001 or auto); default: a local "
                                                                  "Ray instance."),
    list_: bool = typer.Option(False, "--list", help="Print the runs (and which are stored) without running."),
    as_json: bool = typer.Option(False, "--json", help="Print a summary object (paths, runs_total/computed/"
                                                       "reused, each system's best parameters); with --list, "
                                                       "the runs as JSON."),
    plots: bool = typer.Option(True, "--plots/--no-plots", help="Draw tune-goodput.png."),
) -> None:
    """Run every system's parameter grid on every scenario (what the result
    store lacks), then report each system at its defaults and at its best
    single setting: the one that maximises its mean goodput relative to the
    best any system reached, over the scenarios. A rerun computes nothing.

    Example: basin tune tuning/baselines.yaml --out results/tune-baselines --jobs 2
    """
    try:
        _tune(file, out, jobs, executor, address, list_, as_json, plots)
    except BasinInputError as exc:
        _err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


def _tune(file: Path, out: Path | None, jobs: int | None, executor: str, address: str | None, list_: bool,
          as_json: bool, plots: bool) -> None:
    from basin.experiments.executors import check_executor
    from basin.experiments.store import STORE_DIR, RunStore
    from basin.experiments.tune import load_tuning, pending_runs, run_tuning

    workers = parse_jobs(jobs)
    check_out_dir(out)
    if not list_:
        check_executor(executor, address)
    tuning = load_tuning(file)
    out_dir = out if out is not None else Path("results") / "tune" / tuning.name
    check_out_dir(out_dir)
    print_notes(_err, tuning.notes, tuning.warnings)
    store = RunStore(out_dir / STORE_DIR)
    if list_:
        _print_list(tuning, store, as_json)
        return
    outcome = compute_missing(
        _err, f"tune {tuning.name}", [r.key for r in tuning.runs], len(pending_runs(tuning, store)), store,
        executor, as_json, lambda tick: run_tuning(tuning, out_dir, executor=executor, workers=workers,
                                                   address=address, progress=tick, plots=plots))
    if as_json:
        print(json.dumps(outcome.as_json()))
        return
    _print_result(tuning, outcome)
    _err.print(f"{outcome.runs_total} runs ({outcome.runs_computed} computed, {outcome.runs_reused} reused) in "
               f"{outcome.wall_s:.1f} s; table {outcome.table}, best {outcome.best}"
               + (f", plot {outcome.plot}" if outcome.plot is not None else ""), highlight=False, soft_wrap=True)


def _print_list(tuning: Tuning, store: RunStore, as_json: bool) -> None:
    rows = [{"index": i, "system": r.system, "scenario": r.scenario, "seed": r.seed, "setting": r.setting.label,
             **{f"param.{k}": v for k, v in r.setting.values}, "default": r.setting.default, "run": r.key,
             "stored": store.has(r.key)} for i, r in enumerate(tuning.runs)]
    per_system = {s: sum(1 for r in tuning.runs if r.system == s) for s in tuning.systems}
    if as_json:
        print(json.dumps({"runs_total": len(rows), "runs_stored": sum(r["stored"] for r in rows),
                          "runs_per_system": per_system,
                          "settings_per_system": {s: len(v) for s, v in tuning.settings.items()}, "runs": rows}))
        return
    counts = ", ".join(f"{s} {n}" for s, n in per_system.items())
    table = Table(title=f"tune {tuning.name}: {len(rows)} runs ({counts}) on {len(tuning.scenarios)} scenario(s) "
                        f"x {len(tuning.spec.seeds)} seed(s)")
    for col in ("#", "system", "setting", "default", "scenario", "seed", "run", "stored"):
        table.add_column(col, justify="right" if col in ("#", "seed") else "left", no_wrap=col != "setting")
    for r in rows:
        table.add_row(str(r["index"]), r["system"], escape(r["setting"]), "yes" if r["default"] else "-",
                      r["scenario"], str(r["seed"]), r["run"][:12], "yes" if r["stored"] else "-")
    Console(width=max(Console().width, 120)).print(table)


def _goodput(value: float) -> str:
    return f"{value:.0f}" if math.isfinite(value) else "-"


def _print_result(tuning: Tuning, outcome: TuneOutcome) -> None:
    from basin.experiments.tune_report import RULE
    from basin.experiments.tune_spec import DEFAULTS

    console = Console(width=max(Console().width, 180))
    table = Table(title=f"tune {tuning.name}: goodput (sessions/h) at the defaults -> at the best setting, "
                        "and best/default", caption=f"Selection: {RULE}.", caption_justify="left")
    table.add_column("system", no_wrap=True)
    for scenario in tuning.scenarios:
        table.add_column(scenario, justify="right", overflow="fold")
    table.add_column("mean rel. goodput", justify="right")
    table.add_column("best setting", overflow="fold", min_width=24)
    for system in tuning.systems:
        c = outcome.choices[system]
        cells = []
        for sc in c.scenarios:
            ratio = f"x{sc.ratio:.2f}" if math.isfinite(sc.ratio) else "-"
            cells.append(f"{_goodput(sc.default_goodput)} -> {_goodput(sc.best_goodput)}\n{ratio}")
        score = f"{c.default_score:.2f} -> {c.best_score:.2f}"
        tried = f" (of {c.settings_tried})" if c.settings_tried > 1 else " (no grid)"
        table.add_row(system, *cells, score, escape(c.best_setting.replace(", ", "\n")) + tried)
    console.print(table)
    grids = [s for s in tuning.systems if outcome.choices[s].settings_tried > 1]
    if not grids:
        return
    oracle = Table(title="oracle: the best setting of each scenario alone",
                   caption="A per-scenario choice, not one deployable setting.", caption_justify="left")
    oracle.add_column("system", no_wrap=True)
    for scenario in tuning.scenarios:
        oracle.add_column(scenario, overflow="fold")
    for system in grids:
        c = outcome.choices[system]
        oracle.add_row(system, *[f"{_goodput(sc.oracle_goodput)}\n"
                                 + escape(sc.oracle_setting.replace(", ", "\n") if sc.oracle_setting != DEFAULTS
                                          else "(defaults)") for sc in c.scenarios])
    console.print(oracle)
