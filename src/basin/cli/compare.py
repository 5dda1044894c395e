"""``basin compare``: run systems over scenarios and compare them (Fig. 14)."""

from __future__ import annotations

import json
import math
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.console import Console
from rich.table import Table

from basin.cli.options import parse_jobs
from basin.errors import BasinInputError

if TYPE_CHECKING:
    from basin.experiments.compare import CompareRow, ScenarioInfo
    from basin.experiments.scenario import Scenario

_err = Console(stderr=True)


def compare(
    scenarios: list[str] = typer.Argument(..., help="Scenario names or YAML files."),
    system: Optional[list[str]] = typer.Option(None, "--system", "-s",
                                                help="System to run; repeat for several; 'all' for every "
                                                     "registered policy (default: all)."),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Override a field of every scenario."),
    seeds: Optional[list[int]] = typer.Option(None, "--seed", help="Seeds to average over; repeat for "
                                                                   "several (default: each scenario's seed)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Parallel runs (default or -1: all cores)."),
    out: Path = typer.Option(Path("results/compare"), "--out", help="Directory for the rows (compare.json, "
                                                                    "compare.csv), plots, per-run tables "
                                                                    "(runs/) and provenance.json."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Where to write the Fig. 14 plot (.png, .svg, "
                                                             ".pdf; default: OUT/compare.png)."),
    doc: Optional[Path] = typer.Option(None, "--doc", help="A Markdown file whose compare markers receive "
                                                           "the tables (created if missing); plots then go "
                                                           "to img/results-*.png next to it."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON array, one object per scenario and system."),
    as_csv: bool = typer.Option(False, "--csv", help="Print the rows as CSV."),
    tables: bool = typer.Option(True, "--tables/--no-tables", help="Keep every run's Parquet tables under "
                                                                   "OUT/runs/<scenario>/<system>/seed-<n>/."),
    switch_on: Optional[float] = typer.Option(None, "--switch-on", metavar="MIN",
                                              help="Start every run under HiCache and switch its system on at "
                                                   "minute MIN (a system that borrows prefill on decode "
                                                   "instances starts under crossflow; crossflow runs from the "
                                                   "start)."),
    family: Optional[Path] = typer.Option(None, "--family", help="Also draw, per scenario, sessions and median "
                                                                 "TTFT per minute and the CDFs of session slowdown "
                                                                 "and new sessions' wait (Fig. 15/21) to this file "
                                                                 "(with several scenarios, -<scenario> is added "
                                                                 "before the suffix)."),
    bands: Optional[str] = typer.Option(None, "--bands", help="With --family: draw this system's actions "
                                                              "(lending, priority order, admission limit, "
                                                              "shedding) as bands over the sessions panel."),
    parked: bool = typer.Option(True, "--parked/--active-only", help="With --family: count sessions parked at "
                                                                     "the router in the sessions panel."),
) -> None:
    """Run every system on every scenario in parallel; print goodput per system
    and scenario, as a percentage of the best, and median slowdown as a
    percentage of the lowest; plot both like the paper's Fig. 14.

    Example: basin compare main-1p3d-x5 main-1p1d-x5 --system all --out results/main --doc results/main.md
    """
    from basin.experiments.compare import (
        check_doc,
        fill_doc,
        markdown,
        plot_bins,
        plot_compare,
        row_dicts,
        rows_csv,
        run_compare,
        run_folders,
    )
    from basin.experiments.plan import provenance, write_provenance
    from basin.experiments.runner import check_runnable
    from basin.experiments.scenario import load_scenario
    from basin.systems import expand_systems

    if as_json and as_csv:
        raise BasinInputError("--json and --csv both choose what is printed: give one")
    if family is not None and not tables:
        raise BasinInputError("--family draws from the runs' tables: drop --no-tables")
    if bands is not None and family is None:
        raise BasinInputError("--bands draws on the --family figure: give --family FILE too")
    workers = parse_jobs(jobs)
    from basin.cli.outputs import check_out_dir, check_out_file

    check_out_dir(out)  # every path written, before any run
    check_out_file(plot, "--plot")
    check_out_file(doc, "--doc")
    check_out_file(family, "--family")
    if doc is not None:
        check_out_dir(doc.parent / "img", "--doc")
    if doc is not None:
        check_doc(doc)  # before any run, not after all of them
    overrides = list(set_ or [])
    systems = expand_systems(system or ["all"])
    if bands is not None and bands not in systems:
        raise BasinInputError(f"--bands {bands}: not a system of this run ({', '.join(systems)})")
    loaded = []
    warnings: list[str] = []
    notes: list[str] = []
    for sc_arg in scenarios:  # bad names, fields and parameters fail before any run
        sc = load_scenario(sc_arg, overrides)
        split, found = check_runnable(sc, systems)
        loaded.append((sc_arg, sc, overrides))
        warnings += [w for w in found if w not in warnings]
        notes += [n for n in split.notes if n not in notes]
    for line in notes:
        _err.print(f"[yellow]note:[/] {line}", highlight=False, soft_wrap=True)
    for line in warnings:
        _err.print(f"[yellow]warning:[/] {line}", highlight=False, soft_wrap=True)
    runs_dir = out / "runs"
    stale = _clear_runs(runs_dir)
    if stale:
        _err.print(f"[yellow]note:[/] removed the run tables of an earlier compare from {runs_dir}",
                   highlight=False, soft_wrap=True)
    from basin.experiments.pool import JobProgress

    total = sum(len(seeds) if seeds else 1 for _ in loaded) * len(systems)
    bar = _err.is_terminal and not (as_json or as_csv)
    with JobProgress("compare", total, stream=sys.stderr, terminal=bar) as tick:
        rows, infos = run_compare(scenarios, systems, overrides, seeds, workers, progress=tick,
                                  tables_dir=runs_dir if tables else None, switch_on_min=switch_on)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(row_dicts(rows), indent=1))
    (out / "compare.csv").write_text(rows_csv(rows), encoding="utf-8")
    img_dir = (doc.parent / "img") if doc is not None else out
    plot_path = plot or (img_dir / ("results-main.png" if doc is not None else "compare.png"))
    plot_compare(rows, plot_path)
    folders = run_folders(scenarios)
    bin_plots = {}
    for key, info in infos.items():
        path = img_dir / (f"results-{folders[key]}.png" if doc is not None else f"{folders[key]}-bins.png")
        plot_bins(rows, info, path, key=key)
        bin_plots[key] = path
    family_plots = {}
    if family is not None:
        family_plots = draw_families(rows, loaded, folders, runs_dir, family, bands=bands,
                                     include_parked=parked, switch_on=switch_on)
    from basin.experiments.plan import params_for, resolved_params

    write_provenance(out, provenance(loaded, {
        s: {"policy_params_by_scenario": {arg: resolved_params(s, params_for(sc, [s], strict=False).given[s])
                                          for arg, sc, _ in loaded}} for s in systems},
        {"seeds": list(seeds) if seeds else None, "warnings": warnings, "notes": notes,
         "outputs": {"rows": "compare.json", "csv": "compare.csv", "plot": str(plot_path),
                     "bin_plots": {k: str(v) for k, v in bin_plots.items()},
                     "family_plots": {k: str(v) for k, v in family_plots.items()},
                     "switch_on_min": switch_on,
                     "run_tables": str(runs_dir) if tables else None, "doc": str(doc) if doc else None}}))
    if doc is not None:
        command = "basin compare " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if len(sys.argv) > 2 else ""
        fill_doc(doc, markdown(rows, infos, command))
    if as_json:
        print(json.dumps(row_dicts(rows)))
        return
    if as_csv:
        print(rows_csv(rows), end="")
        return
    print_tables(rows, infos, Console(width=max(Console().width, 140)))
    _err.print(f"rows in {out / 'compare.json'} and compare.csv; plot in {plot_path}; provenance.json in {out}"
               + (f"; run tables in {runs_dir}" if tables else "") + (f"; tables in {doc}" if doc is not None else ""))


def draw_families(rows: Sequence[CompareRow], loaded: Sequence[tuple[str, Scenario, Sequence[str]]],
                  folders: Mapping[str, str], runs_dir: Path, family: Path, *, bands: str | None,
                  include_parked: bool, switch_on: float | None) -> dict[str, Path]:
    """The ``--family`` figure of each scenario, from the run tables under ``runs_dir``."""
    from basin.experiments.plan import switch_on_start
    from basin.experiments.plots import intervention_marks, plot_family
    from basin.metrics.io import read_run

    def label(system: str) -> str:
        """With --switch-on, a system that did not start under HiCache says what it started under."""
        if switch_on is None or system == "hicache":
            return system
        start = switch_on_start(system)
        return f"{system} (from the start)" if start is None else (
            system if start == "hicache" else f"{system} (after {start})")

    out: dict[str, Path] = {}
    for arg, sc, overrides in loaded:
        mine = [r for r in rows if r.scenario == arg]
        runs = {label(r.system): [read_run(runs_dir / folders[arg] / r.system / f"seed-{seed}")
                                  for seed in r.seeds] for r in mine}
        path = family if len(loaded) == 1 else family.with_name(f"{family.stem}-{folders[arg]}{family.suffix}")
        # --switch-on replaces the scenario's own switches.
        marks = intervention_marks([iv for iv in sc.interventions if switch_on is None or iv.switch_policy is None])
        if switch_on is not None:
            marks.append((switch_on, "each system switched on"))
        shade = [(sc.surge.start_min, sc.surge.end_min)] if sc.surge.factor != 1.0 else []
        seeds = sorted({s for r in mine for s in r.seeds})
        plot_family(runs, path, measure_end_s=sc.measure_end_min * 60.0, run_end_s=sc.duration_min * 60.0,
                    shade_windows=shade, interventions=marks,
                    bands_of=None if bands is None else label(bands), include_parked=include_parked,
                    goodput_per_h={label(r.system): r.goodput_per_h for r in mine},
                    title=f"{sc.name}" + (f" ({', '.join(overrides)})" if overrides else "")
                          + f": time series of seed {seeds[0]}, distributions over seed(s) "
                          f"{', '.join(str(s) for s in seeds)}")
        out[arg] = path
    return out


def print_tables(rows: Sequence[CompareRow], infos: Mapping[str, ScenarioInfo], console: Console) -> None:
    """One table per scenario; system names never cut short, however narrow the terminal."""
    width = max((len(r.system) for r in rows), default=6)
    for key, info in infos.items():
        table = Table(title=f"{info.name} ({info.shape}, {info.kind})" + (f" from {key}" if key != info.name else ""))
        for col in ("system", "goodput/h", "% of best", "state", "completed", "hit pre/end",
                    "wait p50", "first token p50", "slowdown p50", "% of lowest"):
            table.add_column(col, justify="left" if col in ("system", "state") else "right",
                             no_wrap=col == "system", min_width=width if col == "system" else None)
        for r in (r for r in rows if r.scenario == key):
            table.add_row(r.system, _f(r.goodput_per_h), _f(r.goodput_pct_of_best, 0, "%"), r.state,
                          _f(100 * r.completed_fraction, 0, "%"),
                          f"{_f(r.hit_rate_pre, 2)}/{_f(r.hit_rate_final, 2)}",
                          _f(r.first_call_wait_p50_s, 0, "s"), _f(r.first_token_wait_p50_s, 0, "s"),
                          _f(r.slowdown_p50, 2), _f(r.slowdown_pct_of_lowest, 0, "%"))
        console.print(table)


def _clear_runs(runs_dir: Path) -> bool:
    """Remove the run tables an earlier compare left in ``runs_dir`` (only
    when the folder holds nothing but run tables; anything else is refused)."""
    import shutil

    if not runs_dir.is_dir():
        return False
    others = [p for p in runs_dir.rglob("*") if p.is_file() and p.suffix not in (".parquet", ".json")]
    if others:
        raise BasinInputError(f"{runs_dir}: holds files that are not run tables (e.g. {others[0]}); "
                              "choose another --out or move them")
    shutil.rmtree(runs_dir)
    return True


def _f(x: float, digits: int = 1, unit: str = "") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}{unit}"
