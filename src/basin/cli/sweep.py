"""``basin sweep``: a scenario over a grid of overrides, with a result store."""

from __future__ import annotations

import json
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
    from basin.experiments.sweep_spec import Sweep

_err = Console(stderr=True)


def sweep(
    file: Path = typer.Argument(..., metavar="NAME|FILE",
                                help="A shipped sweep by name (e.g. fig07-vulnerability-1p1d; `basin sweep --list "
                                     "all` names them) or a sweep file (YAML; docs/sweeps.md)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Output folder: the result store (runs/), the table "
                                                           "(sweep.parquet), plots and provenance.json "
                                                           "(default results/sweeps/<name>)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Parallel runs (default or -1: all cores; "
                                                                   "with Ray started here, its CPUs)."),
    executor: str = typer.Option("local", "--executor", help="Where runs execute: local (a process pool) or "
                                                             "ray (the 'ray' extra of basin-serve)."),
    address: Optional[str] = typer.Option(None, "--address", help="A Ray cluster to run on (e.g. "
                                                                  "ray://head:10001 or auto); default: a local "
                                                                  "Ray instance."),
    list_: bool = typer.Option(False, "--list", help="Print the runs (and which are stored) without running; "
                                                    "`basin sweep all --list` lists the shipped sweeps."),
    as_json: bool = typer.Option(False, "--json", help="Print {runs_total, runs_computed, runs_reused, table} "
                                                       "(with --list: the runs as JSON)."),
    plots: bool = typer.Option(True, "--plots/--no-plots", help="Draw the sweep's plots."),
) -> None:
    """Run every point of a sweep's grid that the result store lacks, then
    write one Parquet table (a row per run: its axis values and summary) and
    the sweep's plots. A rerun computes nothing; an interrupted sweep resumes.

    Example: basin sweep sweeps/demo-surge-size.yaml --out results/demo --jobs 2
    """
    try:
        _sweep(file, out, jobs, executor, address, list_, as_json, plots)
    except BasinInputError as exc:
        # Printed here with markup escaped: messages quote `basin-serve[ray]` and YAML lists.
        _err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


def _sweep(file: Path, out: Path | None, jobs: int | None, executor: str, address: str | None, list_: bool,
           as_json: bool, plots: bool) -> None:
    from basin.experiments.executors import check_executor
    from basin.experiments.store import STORE_DIR, RunStore
    from basin.experiments.sweep import pending_points, run_sweep
    from basin.experiments.sweep_grid import load_sweep
    from basin.experiments.sweep_table import TABLE_FILE

    workers = parse_jobs(jobs)
    check_out_dir(out)
    if list_ and str(file) == "all":
        _print_shipped(as_json)
        return
    file = sweep_file(file)
    if not list_:
        check_executor(executor, address)  # Ray missing or a stray --address: before the grid is resolved
    sw = load_sweep(file)
    out_dir = out if out is not None else Path("results") / "sweeps" / sw.name
    check_out_dir(out_dir)
    print_notes(_err, sw.notes, sw.warnings)
    store = RunStore(out_dir / STORE_DIR)
    if list_:
        _print_list(sw, store, as_json)
        return
    outcome = compute_missing(
        _err, f"sweep {sw.name}", [p.key for p in sw.points], len(pending_points(sw, store)), store, executor,
        as_json, lambda tick: run_sweep(sw, out_dir, executor=executor, workers=workers, address=address,
                                        progress=tick, plots=plots))
    if as_json:
        print(json.dumps(outcome.as_json()))
        return
    _err.print(f"{outcome.runs_total} runs ({outcome.runs_computed} computed, {outcome.runs_reused} reused) in "
               f"{outcome.wall_s:.1f} s; table {out_dir / TABLE_FILE}"
               + (f"; plots {', '.join(str(p) for p in outcome.plots)}" if outcome.plots else "")
               + f"; `basin report {out_dir}` renders it", highlight=False, soft_wrap=True)


def shipped_sweeps() -> dict[str, Path]:
    """The sweep files shipped with the package, by name (a subfolder's with it: calibration/NAME)."""
    from basin.paths import SWEEP_DIR

    if not SWEEP_DIR.is_dir():
        return {}
    return {p.relative_to(SWEEP_DIR).with_suffix("").as_posix(): p for p in sorted(SWEEP_DIR.rglob("*.yaml"))}


def sweep_file(arg: Path) -> Path:
    """A sweep file as given, or the shipped sweep it names (``NAME``,
    ``NAME.yaml`` or ``sweeps/NAME.yaml`` from a checkout's README, which an
    installed package resolves to its own copy)."""
    if arg.is_file():
        return arg
    shipped = shipped_sweeps()
    name = arg.as_posix().removeprefix("sweeps/").removesuffix(".yaml")
    if name in shipped:
        return shipped[name]
    if arg.suffix in (".yaml", ".yml") and "/" in arg.as_posix().removeprefix("sweeps/"):
        raise BasinInputError(f"{arg}: sweep file not found")
    raise BasinInputError(f"{arg}: no such sweep file, and no shipped sweep of that name; shipped: "
                          f"{', '.join(shipped) or 'none'}")


def _print_shipped(as_json: bool) -> None:
    from basin.yamlfile import load_yaml

    rows = []
    for name, path in shipped_sweeps().items():
        data = load_yaml(path)
        description = data.get("description", "") if isinstance(data, dict) else ""
        rows.append({"name": name, "file": str(path), "description": " ".join(str(description).split())})
    if as_json:
        print(json.dumps(rows))
        return
    table = Table(title="shipped sweeps (basin sweep NAME)")
    table.add_column("name", no_wrap=True)
    table.add_column("description")
    for row in rows:
        table.add_row(row["name"], row["description"])
    Console().print(table)


def _print_list(sw: Sweep, store: RunStore, as_json: bool) -> None:
    rows = [{"index": p.index, **dict(p.coords), "run": p.key, "stored": store.has(p.key)} for p in sw.points]
    if as_json:
        print(json.dumps({"runs_total": len(rows), "runs_stored": sum(r["stored"] for r in rows), "runs": rows}))
        return
    if not sw.points:
        raise BasinInputError(f"{sw.path}: the sweep has no runs")
    table = Table(title=f"sweep {sw.name}: {len(rows)} runs of {sw.scenario_arg}")
    for col in ("#", *sw.coord_columns, "run", "stored"):
        table.add_column(col, justify="right" if col == "#" else "left", no_wrap=True)
    for p, r in zip(sw.points, rows):
        table.add_row(str(p.index), *[_cell(p.coords.get(c)) for c in sw.coord_columns], p.key[:12],
                      "yes" if r["stored"] else "-")
    Console(width=max(Console().width, 120)).print(table)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return value if isinstance(value, str) else json.dumps(value)
